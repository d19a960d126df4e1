//! The BERT encoder of the sentence embedder. Texts are packed into blocks of up to
//! [`PACK_ROWS`] token rows: the projections run over a whole block through the engine's
//! GEMM on its thread pool (as prefill's do), attention runs per text and head, and the
//! norms, biases and GELU run row by row on the same pool. A row's projection is the
//! same sum whatever rows it is computed with, as long as the rows are laid out in whole
//! micro-kernel tiles ([`ROW_ALIGN`]), and every other step reads only its own text, so a text's vector does not depend on what it was
//! embedded with, to the last bit: an index grown piece by piece (or caught up after a
//! crash) holds the vectors a rebuild would.

use std::ops::Range;

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use gemm::{gemm, Parallelism};
use memagent_engine::{for_chunks, gemm_t};

/// Token rows per block of packed texts: enough rows for the GEMM to run near its peak.
pub const PACK_ROWS: usize = 512;

/// Each text's rows start at a multiple of this and take a multiple of it, so that the
/// GEMM computes them with the same full-height micro-kernel tiles (16 rows of f32)
/// alone or packed: a partial tile is computed by another kernel, to other last bits.
const ROW_ALIGN: usize = 16;

/// A text's unit-length mean state and the unit-length states of the tokens kept.
pub type Encoded = (Vec<f32>, Vec<Vec<f32>>);

/// A BERT encoder's configuration (the fields of `config.json` it reads).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
}

fn default_eps() -> f64 {
    1e-12
}

fn default_act() -> String {
    "gelu".to_string()
}

fn vector(t: Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

impl Norm {
    fn load(vb: VarBuilder, size: usize) -> candle_core::Result<Self> {
        Ok(Self {
            weight: vector(vb.get(size, "weight")?)?,
            bias: vector(vb.get(size, "bias")?)?,
        })
    }

    /// Layer norm of one row, in place.
    fn row(&self, x: &mut [f32], eps: f32) {
        let n = x.len() as f32;
        let mean = lanes(x, 0.0, |v| v, |a, b| a + b) / n;
        let var = lanes(x, 0.0, |v| (v - mean) * (v - mean), |a, b| a + b) / n;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in x.iter_mut().zip(&self.weight).zip(&self.bias) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// `x · wᵀ + b`.
struct Dense {
    weight: Vec<f32>,
    bias: Vec<f32>,
    out: usize,
    input: usize,
}

impl Dense {
    fn load(vb: VarBuilder, out: usize, input: usize) -> candle_core::Result<Self> {
        Ok(Self {
            weight: vector(vb.get((out, input), "weight")?)?,
            bias: vector(vb.get(out, "bias")?)?,
            out,
            input,
        })
    }

    /// Query, key and value as one projection.
    fn fused(parts: [Dense; 3]) -> Self {
        let [q, k, v] = parts;
        Self {
            weight: [q.weight, k.weight, v.weight].concat(),
            bias: [q.bias, k.bias, v.bias].concat(),
            out: q.out + k.out + v.out,
            input: q.input,
        }
    }

    /// The product of `rows` rows of `x`, before the bias.
    fn product(&self, x: &[f32], rows: usize) -> Vec<f32> {
        gemm_t(x, rows, &self.weight, self.out, self.input)
    }

    /// `f(x · wᵀ + b)` of `rows` rows of `x`.
    fn forward(&self, x: &[f32], rows: usize, f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
        let mut y = self.product(x, rows);
        each_row(&mut y, self.out, |_, row| {
            for (v, b) in row.iter_mut().zip(&self.bias) {
                *v = f(*v + b);
            }
        });
        y
    }
}

/// `f` of each value of `x`, combined by `op` in 16 lanes and then across them: a fixed
/// order that vectorises (a running total does not).
#[inline(always)]
fn lanes(x: &[f32], init: f32, f: impl Fn(f32) -> f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = op(*a, f(v));
        }
    }
    let mut total = acc.into_iter().fold(init, &op);
    for &v in rest {
        total = op(total, f(v));
    }
    total
}

/// Runs `f` on each row of `rows` (each `width` wide) on the engine's pool.
fn each_row(rows: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let n = rows.len() / width;
    let base = rows.as_mut_ptr() as usize;
    for_chunks(n, |range: Range<usize>| {
        for r in range {
            // SAFETY: each row index is handed to one task once; rows are disjoint
            // slices of the buffer, which outlives the pool call.
            let row =
                unsafe { std::slice::from_raw_parts_mut((base as *mut f32).add(r * width), width) };
            f(r, row);
        }
    });
}

/// `e^x` for `x ≤ 0` to about 2 ulp, branch-free so that loops over it vectorise
/// (the range reduction of Cephes' `expf`, its polynomial, and `2^n` from the bits).
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// GELU with the exact (erf) form BERT was trained with; erf from Abramowitz and Stegun
/// 7.1.26 (absolute error under 1.5e-7), branch-free.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let erf_abs = 1.0 - poly * exp_neg(-a * a);
    let erf = erf_abs.copysign(z);
    0.5 * x * (1.0 + erf)
}

struct Layer {
    qkv: Dense,
    out: Dense,
    attention_norm: Norm,
    up: Dense,
    down: Dense,
    output_norm: Norm,
}

pub struct Bert {
    words: Vec<f32>,
    positions: Vec<f32>,
    token_type: Vec<f32>,
    vocabulary: usize,
    max_positions: usize,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    eps: f32,
}

impl Bert {
    /// Loads the weights (`embeddings.*`, `encoder.layer.N.*`, with or without a `bert.`
    /// prefix).
    pub fn load(vb: VarBuilder, config: &Config) -> candle_core::Result<Self> {
        if config.hidden_act != "gelu" {
            candle_core::bail!(
                "hidden_act `{}` is not supported (the embedder runs `gelu`)",
                config.hidden_act
            );
        }
        if config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            candle_core::bail!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size,
                config.num_attention_heads
            );
        }
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let h = config.hidden_size;
        let i = config.intermediate_size;
        let e = vb.pp("embeddings");
        let words = e.pp("word_embeddings").get_unchecked("weight")?;
        let vocabulary = words.dim(0)?;
        let positions = e.pp("position_embeddings").get_unchecked("weight")?;
        let max_positions = positions.dim(0)?;
        let token_type = e
            .pp("token_type_embeddings")
            .get_unchecked("weight")?
            .get(0)?;
        let embedding_norm = Norm::load(e.pp("LayerNorm"), h)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for n in 0..config.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{n}"));
            let a = l.pp("attention");
            let s = a.pp("self");
            layers.push(Layer {
                qkv: Dense::fused([
                    Dense::load(s.pp("query"), h, h)?,
                    Dense::load(s.pp("key"), h, h)?,
                    Dense::load(s.pp("value"), h, h)?,
                ]),
                out: Dense::load(a.pp("output.dense"), h, h)?,
                attention_norm: Norm::load(a.pp("output.LayerNorm"), h)?,
                up: Dense::load(l.pp("intermediate.dense"), i, h)?,
                down: Dense::load(l.pp("output.dense"), h, i)?,
                output_norm: Norm::load(l.pp("output.LayerNorm"), h)?,
            });
        }
        Ok(Self {
            words: vector(words)?,
            positions: vector(positions)?,
            token_type: vector(token_type)?,
            vocabulary,
            max_positions,
            embedding_norm,
            layers,
            hidden: h,
            heads: config.num_attention_heads,
            eps: config.layer_norm_eps as f32,
        })
    }

    /// Each text's unit-length mean of the last layer's states over its token ids, and
    /// the unit-length last state of each of its tokens that `keep` (the text's index,
    /// the token's) selects, in order: one pass gives both.
    pub fn embed_with_states(
        &self,
        texts: &[&[u32]],
        keep: &dyn Fn(usize, usize) -> bool,
    ) -> candle_core::Result<Vec<Encoded>> {
        for ids in texts {
            if ids.len() > self.max_positions {
                candle_core::bail!(
                    "{} tokens, over the encoder's {} positions",
                    ids.len(),
                    self.max_positions
                );
            }
            if let Some(id) = ids.iter().find(|&&id| id as usize >= self.vocabulary) {
                candle_core::bail!("token id {id} is outside the vocabulary");
            }
        }
        let mut out = Vec::with_capacity(texts.len());
        let mut start = 0;
        while start < texts.len() {
            // Whole texts, up to PACK_ROWS rows (a longer text goes alone).
            let rows_of = |ids: &[u32]| ids.len().max(1).next_multiple_of(ROW_ALIGN);
            let mut end = start + 1;
            let mut rows = rows_of(texts[start]);
            while end < texts.len() && rows + rows_of(texts[end]) <= PACK_ROWS {
                rows += rows_of(texts[end]);
                end += 1;
            }
            out.extend(self.embed_pack(&texts[start..end], &|t, i| keep(start + t, i)));
            start = end;
        }
        Ok(out)
    }

    /// One block of packed texts.
    fn embed_pack(&self, texts: &[&[u32]], keep: &dyn Fn(usize, usize) -> bool) -> Vec<Encoded> {
        let h = self.hidden;
        // Each text's rows; an empty text is read as one [PAD] token.
        let mut spans: Vec<Range<usize>> = Vec::with_capacity(texts.len());
        let mut ids: Vec<u32> = Vec::new();
        let mut position: Vec<usize> = Vec::new();
        for text in texts {
            let text: &[u32] = if text.is_empty() { &[0] } else { text };
            spans.push(ids.len()..ids.len() + text.len());
            ids.extend_from_slice(text);
            position.extend(0..text.len());
            // Padding rows ([PAD] at position 0), read by no text.
            let padded = text.len().next_multiple_of(ROW_ALIGN);
            ids.resize(ids.len() + padded - text.len(), 0);
            position.resize(ids.len(), 0);
        }
        let rows = ids.len();
        let mut x = vec![0f32; rows * h];
        each_row(&mut x, h, |r, row| {
            let word = &self.words[ids[r] as usize * h..][..h];
            let pos = &self.positions[position[r] * h..][..h];
            for (((v, a), b), c) in row.iter_mut().zip(word).zip(pos).zip(&self.token_type) {
                *v = a + b + c;
            }
            self.embedding_norm.row(row, self.eps);
        });
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x, rows, |v| v);
            let context = self.attend(&qkv, &spans);
            x = self.add_and_norm(
                layer.out.product(&context, rows),
                &layer.out,
                &x,
                &layer.attention_norm,
            );
            let up = layer.up.forward(&x, rows, gelu);
            x = self.add_and_norm(
                layer.down.product(&up, rows),
                &layer.down,
                &x,
                &layer.output_norm,
            );
        }
        let unit = |mut v: Vec<f32>| {
            let norm = v.iter().map(|m| m * m).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|m| *m /= norm);
            v
        };
        spans
            .iter()
            .enumerate()
            .map(|(t, span)| {
                let mut mean = vec![0f32; h];
                for r in span.clone() {
                    for (m, v) in mean.iter_mut().zip(&x[r * h..][..h]) {
                        *m += v;
                    }
                }
                let n = span.len() as f32;
                mean.iter_mut().for_each(|m| *m /= n);
                let states = span
                    .clone()
                    .filter(|&r| keep(t, r - span.start))
                    .map(|r| unit(x[r * h..][..h].to_vec()))
                    .collect();
                (unit(mean), states)
            })
            .collect()
    }

    /// `norm(product + bias + residual)`, row by row: a projection's output, the
    /// residual stream `x` added.
    fn add_and_norm(
        &self,
        mut product: Vec<f32>,
        dense: &Dense,
        x: &[f32],
        norm: &Norm,
    ) -> Vec<f32> {
        let h = self.hidden;
        each_row(&mut product, h, |r, row| {
            let residual = &x[r * h..][..h];
            for ((v, b), a) in row.iter_mut().zip(&dense.bias).zip(residual) {
                *v += b + a;
            }
            norm.row(row, self.eps);
        });
        product
    }

    /// Each text's self-attention, head by head (one task each): (rows, h).
    fn attend(&self, qkv: &[f32], spans: &[Range<usize>]) -> Vec<f32> {
        let h = self.hidden;
        let d = h / self.heads;
        let stride = 3 * h;
        let rows = qkv.len() / stride;
        let mut context = vec![0f32; rows * h];
        let scale = 1.0 / (d as f32).sqrt();
        let tasks: Vec<(usize, usize)> = (0..spans.len())
            .flat_map(|t| (0..self.heads).map(move |head| (t, head)))
            .collect();
        let (qkv_ptr, context_ptr) = (qkv.as_ptr() as usize, context.as_mut_ptr() as usize);
        for_chunks(tasks.len(), |range| {
            let mut scores = Vec::new();
            for &(t, head) in &tasks[range] {
                let span = &spans[t];
                let n = span.len();
                scores.clear();
                scores.resize(n * n, 0f32);
                let q = qkv_ptr as *const f32;
                // SAFETY: rows `span` of qkv hold this text's queries, keys and values,
                // each head `d` wide at columns head·d, h + head·d and 2h + head·d of
                // rows `stride` apart; `scores` is (n, n); the context columns of this
                // text and head are written by this task alone, in a buffer that
                // outlives the pool call.
                unsafe {
                    let q = q.add(span.start * stride + head * d);
                    let k = q.add(h);
                    let v = q.add(2 * h);
                    // scores = scale · q kᵀ
                    gemm(
                        n,
                        n,
                        d,
                        scores.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        q,
                        1,
                        stride as isize,
                        k,
                        stride as isize,
                        1,
                        0.0,
                        scale,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                    for row in scores.chunks_exact_mut(n) {
                        let max = lanes(row, f32::NEG_INFINITY, |v| v, f32::max);
                        row.iter_mut().for_each(|v| *v = exp_neg(*v - max));
                        let inv = 1.0 / lanes(row, 0.0, |v| v, |a, b| a + b);
                        row.iter_mut().for_each(|v| *v *= inv);
                    }
                    // context = probs v
                    let out = (context_ptr as *mut f32).add(span.start * h + head * d);
                    gemm(
                        n,
                        d,
                        n,
                        out,
                        1,
                        h as isize,
                        false,
                        scores.as_ptr(),
                        1,
                        n as isize,
                        v,
                        1,
                        stride as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                }
            }
        });
        context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_and_gelu_match_the_library_functions() {
        for i in 0..=20_000 {
            let x = -87.0 + 87.0 * i as f32 / 20_000.0;
            let (fast, exact) = (exp_neg(x), x.exp());
            assert!(
                (fast - exact).abs() <= 4.0 * f32::EPSILON * exact.max(f32::MIN_POSITIVE),
                "exp({x}): {fast} vs {exact}"
            );
        }
        for i in 0..=20_000 {
            let x = -10.0 + 20.0 * i as f32 / 20_000.0;
            let exact = 0.5 * f64::from(x) * (1.0 + erf(f64::from(x) / 2f64.sqrt()));
            let fast = f64::from(gelu(x));
            assert!(
                (fast - exact).abs() < 1e-6 * (1.0 + exact.abs()),
                "gelu({x}): {fast} vs {exact}"
            );
        }
    }

    /// erf by its Taylor series (|x| < 3) or continued fraction (beyond), in f64.
    fn erf(x: f64) -> f64 {
        let a = x.abs();
        let value = if a < 3.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = f64::from(k) / 2.0 / (a + f);
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f)
        };
        value.copysign(x)
    }
}

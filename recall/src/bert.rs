//! The BERT encoder of the sentence embedder, one text at a time: the projections run
//! through the engine's GEMM on its thread pool (as prefill's do), attention, norms and
//! GELU through candle. Each text is encoded alone, so its vector does not depend on
//! what it was embedded with, to the last bit: an index grown piece by piece (or caught
//! up after a crash) holds the vectors a rebuild would.

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use memagent_engine::matmul_t;

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

struct Norm {
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn load(vb: VarBuilder, size: usize) -> candle_core::Result<Self> {
        Ok(Self {
            weight: vb.get(size, "weight")?,
            bias: vb.get(size, "bias")?,
        })
    }

    fn forward(&self, x: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm(x, &self.weight, &self.bias, eps as f32)
    }
}

/// `x · wᵀ + b`.
struct Dense {
    weight: Tensor,
    bias: Vec<f32>,
}

impl Dense {
    fn load(vb: VarBuilder, out: usize, input: usize) -> candle_core::Result<Self> {
        Ok(Self {
            weight: vb.get((out, input), "weight")?,
            bias: vb.get(out, "bias")?.to_vec1()?,
        })
    }

    /// Query, key and value as one projection.
    fn fused(parts: [Dense; 3]) -> candle_core::Result<Self> {
        let [q, k, v] = parts;
        Ok(Self {
            weight: Tensor::cat(&[&q.weight, &k.weight, &v.weight], 0)?,
            bias: [q.bias, k.bias, v.bias].concat(),
        })
    }

    /// `x · wᵀ + b`, plus `residual` when given. The additions run in one pass over the
    /// product: candle's broadcast addition took a quarter of the encoder's time.
    fn forward(&self, x: &Tensor, residual: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let y = matmul_t(x, &self.weight).map_err(candle_core::Error::wrap)?;
        let shape = y.shape().clone();
        let mut values = y.flatten_all()?.to_vec1::<f32>()?;
        let n = self.bias.len();
        match residual {
            Some(r) => {
                let r = r.flatten_all()?.to_vec1::<f32>()?;
                for (row, add) in values.chunks_exact_mut(n).zip(r.chunks_exact(n)) {
                    for ((v, a), b) in row.iter_mut().zip(add).zip(&self.bias) {
                        *v += b + a;
                    }
                }
            }
            None => {
                for row in values.chunks_exact_mut(n) {
                    for (v, b) in row.iter_mut().zip(&self.bias) {
                        *v += b;
                    }
                }
            }
        }
        Tensor::from_vec(values, shape, y.device())
    }
}

struct Layer {
    qkv: Dense,
    out: Dense,
    attention_norm: Norm,
    up: Dense,
    down: Dense,
    output_norm: Norm,
}

/// `softmax(scale · x)` over the last dimension, in one pass on the calling thread
/// (candle's runs on a second thread pool, which two cores cannot serve beside the
/// engine's).
fn softmax_rows(x: &Tensor, scale: f32) -> candle_core::Result<Tensor> {
    let shape = x.shape().clone();
    let n = shape.dims().last().copied().unwrap_or(1).max(1);
    let mut values = x.flatten_all()?.to_vec1::<f32>()?;
    for row in values.chunks_exact_mut(n) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0f32;
        for v in row.iter_mut() {
            *v = ((*v - max) * scale).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|v| *v *= inv);
    }
    Tensor::from_vec(values, shape, x.device())
}

pub struct Bert {
    words: Tensor,
    positions: Tensor,
    token_type: Tensor,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    eps: f64,
    device: Device,
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
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let h = config.hidden_size;
        let i = config.intermediate_size;
        let e = vb.pp("embeddings");
        let words = e.pp("word_embeddings").get_unchecked("weight")?;
        let positions = e.pp("position_embeddings").get_unchecked("weight")?;
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
                ])?,
                out: Dense::load(a.pp("output.dense"), h, h)?,
                attention_norm: Norm::load(a.pp("output.LayerNorm"), h)?,
                up: Dense::load(l.pp("intermediate.dense"), i, h)?,
                down: Dense::load(l.pp("output.dense"), h, i)?,
                output_norm: Norm::load(l.pp("output.LayerNorm"), h)?,
            });
        }
        Ok(Self {
            words,
            positions,
            token_type,
            embedding_norm,
            layers,
            heads: config.num_attention_heads,
            eps: config.layer_norm_eps,
            device: vb.device().clone(),
        })
    }

    /// The unit-length mean of the last layer's states over `ids` (one text).
    pub fn embed(&self, ids: &[u32]) -> candle_core::Result<Vec<f32>> {
        let n = ids.len().max(1);
        let ids = if ids.is_empty() { &[0][..] } else { ids };
        let tokens = Tensor::new(ids, &self.device)?;
        let mut x = self
            .words
            .index_select(&tokens, 0)?
            .add(&self.positions.narrow(0, 0, n)?)?
            .broadcast_add(&self.token_type)?;
        x = self.embedding_norm.forward(&x, self.eps)?;
        let h = x.dim(1)?;
        let head = h / self.heads;
        let scale = 1.0 / (head as f64).sqrt();
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x, None)?;
            // (n, 3h) -> three (heads, n, head)
            let split = |part: usize| -> candle_core::Result<Tensor> {
                qkv.narrow(1, part * h, h)?
                    .reshape((n, self.heads, head))?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let (q, k, v) = (split(0)?, split(1)?, split(2)?);
            let probs = softmax_rows(&q.matmul(&k.t()?)?, scale as f32)?;
            let context = probs
                .matmul(&v)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((n, h))?;
            let attended = layer.out.forward(&context, Some(&x))?;
            x = layer.attention_norm.forward(&attended, self.eps)?;
            let up = layer.up.forward(&x, None)?.gelu_erf()?;
            let down = layer.down.forward(&up, Some(&x))?;
            x = layer.output_norm.forward(&down, self.eps)?;
        }
        let mean = x.mean(0)?;
        let norm = mean
            .sqr()?
            .sum_keepdim(D::Minus1)?
            .sqrt()?
            .clamp(1e-12, f32::MAX)?;
        mean.broadcast_div(&norm)?.to_dtype(DType::F32)?.to_vec1()
    }
}

//! Differentiable operations the training forward pass needs beyond candle's own:
//! products with frozen weights and rotary embeddings (linear maps whose backward pass
//! is another linear map, so no gradient is ever computed for the frozen weights), a
//! causal softmax with its backward, and RMS normalisation and the SwiGLU gate as one
//! pass each way over rows (composed from candle ops, each was seven to ten passes over
//! fresh tensors). Products and row loops run on the engine's thread pool.

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, Device, Layout, Result, Shape, Tensor, D,
};
use memagent_engine::IntegerWeight;
use rayon::prelude::*;

type Map = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// A linear map `fwd` whose vector-Jacobian product is `bwd`: the forward runs without
/// recording a graph, the backward applies `bwd` to the incoming gradient.
struct LinearMap {
    name: &'static str,
    fwd: Map,
    bwd: Map,
}

impl CustomOp1 for LinearMap {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = values(storage, layout, self.name)?;
        let x = Tensor::from_slice(x, layout.shape(), &Device::Cpu)?;
        let y = (self.fwd)(&x)?;
        let shape = y.shape().clone();
        let values = y.flatten_all()?.to_vec1::<f32>()?;
        Ok((CpuStorage::F32(values), shape))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some((self.bwd)(&grad_res.contiguous()?)?))
    }
}

fn linear_map(x: &Tensor, name: &'static str, fwd: Map, bwd: Map) -> Result<Tensor> {
    if !x.device().is_cpu() {
        // Off the CPU the composed ops run as they are (the weight's gradient is then
        // computed and dropped: slower, same result).
        return fwd(x);
    }
    x.contiguous()?.apply_op1(LinearMap { name, fwd, bwd })
}

/// A frozen weight `w` (out, in): `x (.., in) -> x wᵀ (.., out)`, with the backward pass
/// giving only the input's gradient.
#[derive(Clone)]
pub struct Frozen {
    w: Tensor,
    integer: Option<Arc<Integer>>,
}

/// A frozen weight's products in 8-bit integers, as prefill runs them: `x wᵀ` on the
/// file's own blocks, and the input gradient `g w` on `wᵀ` rounded to Q8_0.
pub struct Integer {
    forward: IntegerWeight,
    backward: IntegerWeight,
}

impl Integer {
    /// The products of `q`, dequantized as `w`: `None` where its type or shape has no
    /// integer product.
    pub fn new(q: &QTensor, w: &Tensor) -> Result<Option<Self>> {
        let Some(forward) = IntegerWeight::of(q)? else {
            return Ok(None);
        };
        let (n, k) = w.dims2()?;
        let wt = w.t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let Some(backward) = IntegerWeight::quantize(&wt, k, n)? else {
            return Ok(None);
        };
        // Unpacked once: every update multiplies each weight twice per sequence.
        Ok(Some(Self {
            forward: forward.unpacked(),
            backward: backward.unpacked(),
        }))
    }
}

impl Frozen {
    pub fn new(w: Tensor) -> Self {
        Self { w, integer: None }
    }

    /// Products in integers where `integer` is given, in f32 otherwise.
    pub fn with_integer(w: Tensor, integer: Option<Integer>) -> Self {
        Self {
            w,
            integer: integer.map(Arc::new),
        }
    }

    pub fn weight(&self) -> &Tensor {
        &self.w
    }

    /// Whether the products run in integers.
    pub fn is_integer(&self) -> bool {
        self.integer.is_some()
    }

    /// Drops the integer products: every product in f32 from here on.
    pub fn f32_only(&mut self) {
        self.integer = None;
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
            return self.forward_composed(x);
        }
        x.contiguous()?.apply_op1(FrozenLinear {
            w: self.w.clone(),
            integer: self.integer.clone(),
        })
    }

    /// The same product through candle's matmul, whose backward pass also computes the
    /// weight's gradient and drops it (off the CPU, and the reference for tests).
    pub fn forward_composed(&self, x: &Tensor) -> Result<Tensor> {
        let (n, k) = self.w.dims2()?;
        let mut dims = x.dims().to_vec();
        let rows = x.elem_count() / k.max(1);
        *dims.last_mut().expect("rank >= 1") = n;
        x.reshape((rows, k))?.matmul(&self.w.t()?)?.reshape(dims)
    }
}

impl Frozen {
    /// `x wᵀ + scale · (x aᵀ) bᵀ`: the frozen product and its adapter (`a` (r, in), `b`
    /// (out, r)) as one op, whose backward pass gives the gradients of `x`, `a` and `b`
    /// without the five graph nodes (two products, a scale, an add) the adapter would
    /// add, each with gradient buffers of the output's size.
    pub fn forward_adapted(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        scale: f64,
    ) -> Result<Tensor> {
        if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
            let lora = x.matmul(&a.t()?)?.matmul(&b.t()?)?;
            return self.forward_composed(x)? + (lora * scale)?;
        }
        let (n, k) = self.w.dims2()?;
        let (r, ka) = a.dims2()?;
        if ka != k || b.dims2()? != (n, r) {
            candle_core::bail!(
                "adapted product: A {:?} and B {:?} for a ({n}, {k}) weight",
                a.dims(),
                b.dims()
            )
        }
        x.contiguous()?.apply_op3(
            &a.contiguous()?,
            &b.contiguous()?,
            Adapted {
                frozen: FrozenLinear {
                    w: self.w.clone(),
                    integer: self.integer.clone(),
                },
                scale: scale as f32,
            },
        )
    }
}

struct Adapted {
    frozen: FrozenLinear,
    scale: f32,
}

/// `product(rows of x)` for a product with few outputs per row (`n`: an adapter's rank),
/// split over blocks of rows on the engine's pool: split over its outputs, as the
/// engine's GEMM splits, it would run as one task.
fn by_rows(
    x: &[f32],
    k: usize,
    n: usize,
    product: impl Fn(&[f32], usize) -> Vec<f32> + Sync,
) -> Vec<f32> {
    const ROWS: usize = 64;
    let rows = x.len() / k.max(1);
    let mut out = vec![0f32; rows * n];
    let out_ptr = out.as_mut_ptr() as usize;
    memagent_engine::for_chunks(rows.div_ceil(ROWS), |blocks| {
        let (first, end) = (blocks.start * ROWS, (blocks.end * ROWS).min(rows));
        let part = product(&x[first * k..end * k], end - first);
        // SAFETY: rows first..end of `out` are this task's alone, and `out` outlives
        // the pool call.
        unsafe {
            std::ptr::copy_nonoverlapping(
                part.as_ptr(),
                (out_ptr as *mut f32).add(first * n),
                part.len(),
            )
        };
    });
    out
}

/// `m` (rows, cols) row-major, transposed.
fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; m.len()];
    for (i, row) in m.chunks_exact(cols).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out[j * rows + i] = v;
        }
    }
    out
}

impl CustomOp3 for Adapted {
    fn name(&self) -> &'static str {
        "adapted-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        as_: &CpuStorage,
        al: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = "adapted-linear";
        let (x, a, b) = (
            values(xs, xl, op)?,
            values(as_, al, op)?,
            values(bs, bl, op)?,
        );
        let dims = self.frozen.output_dims(xl.dims())?;
        let ((r, k), n) = (al.shape().dims2()?, bl.shape().dims2()?.0);
        let rows = x.len() / k;
        let mut y = self.frozen.product(x)?;
        let u = by_rows(x, k, r, |x, rows| memagent_engine::gemm_t(x, rows, a, r, k));
        let lora = memagent_engine::gemm_t(&u, rows, b, n, r);
        for (y, l) in y.iter_mut().zip(&lora) {
            *y += self.scale * l;
        }
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let ((r, k), (n, _)) = (a.dims2()?, b.dims2()?);
        let s = self.scale;
        // The adapter's factors are small (rank rows): copied out; g and x are read in place.
        let (av, bv) = (
            a.flatten_all()?.to_vec1::<f32>()?,
            b.flatten_all()?.to_vec1::<f32>()?,
        );
        let (a_, b_) = (&av[..], &bv[..]);
        let (dx, da, db) = with_values(grad, |g| {
            with_values(x, |x| -> Result<_> {
                let rows = x.len() / k;
                // g B and x Aᵀ (rows, r; the forward's x Aᵀ recomputed), each transposed.
                let gb = by_rows(g, n, r, |g, rows| {
                    memagent_engine::gemm_n(g, rows, b_, n, r)
                });
                let u = by_rows(x, k, r, |x, rows| {
                    memagent_engine::gemm_t(x, rows, a_, r, k)
                });
                // dx = g W + s (g B) A.
                let mut dx = self.frozen.input_gradient(g)?;
                let lora_dx = memagent_engine::gemm_n(&gb, rows, a_, r, k);
                for (d, l) in dx.iter_mut().zip(&lora_dx) {
                    *d += s * l;
                }
                // dA = s (g B)ᵀ x (r, k); dBᵀ = s (x Aᵀ)ᵀ g (r, n).
                let (gb_t, u_t) = (transposed(&gb, rows, r), transposed(&u, rows, r));
                let mut da = memagent_engine::gemm_n(&gb_t, r, x, rows, k);
                let db_t = memagent_engine::gemm_n(&u_t, r, g, rows, n);
                let mut db = transposed(&db_t, r, n);
                da.iter_mut().chain(db.iter_mut()).for_each(|v| *v *= s);
                Ok((dx, da, db))
            })
        })???;
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(da, a.shape(), a.device())?),
            Some(Tensor::from_vec(db, b.shape(), b.device())?),
        ))
    }
}

/// e^x in f32 arithmetic alone, so that loops over rows vectorise (libm's `expf` is a
/// call per value): x = n ln 2 + r with |r| ≤ ln 2 / 2, e^r from its Taylor polynomial
/// to r⁷ (truncation under 2e-9 relative), times 2ⁿ built in the exponent bits. Within
/// 3e-7 relative of `f32::exp` for x in [-87, 88]; x is clamped to that range (e^-87 ≈
/// 1.6e-38 where `f32::exp` would give a subnormal or 0).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 · 2²³: adding it rounds to an integer held in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2_E + SHIFT;
    let n = t - SHIFT;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let k = (t.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    p * f32::from_bits(((k + 127) as u32) << 23)
}

/// Runs `f` on the values of a contiguous f32 CPU tensor.
fn with_values<T>(t: &Tensor, f: impl FnOnce(&[f32]) -> T) -> Result<T> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(CpuStorage::F32(data)) = &*storage else {
        candle_core::bail!("expected an f32 tensor on the CPU")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("expected a contiguous tensor")
    };
    Ok(f(&data[start..end]))
}

/// The values of a contiguous f32 storage.
pub(crate) fn values<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{op} expects f32")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op} expects a contiguous input")
    };
    Ok(&data[start..end])
}

/// `x wᵀ` on the engine's GEMM (the micro-kernel prefill runs), or its integer product
/// where the weight has one; its backward pass, `g w`, gives the input's gradient only.
struct FrozenLinear {
    w: Tensor,
    integer: Option<Arc<Integer>>,
}

impl FrozenLinear {
    /// `x wᵀ` for `x` of (rows, k) values.
    fn product(&self, x: &[f32]) -> Result<Vec<f32>> {
        let (n, k) = self.w.dims2()?;
        Ok(match &self.integer {
            Some(integer) => integer.forward.matmul_t(x, x.len() / k),
            None => with_values(&self.w, |w| {
                memagent_engine::gemm_t(x, x.len() / k, w, n, k)
            })?,
        })
    }

    /// `g w`, the input's gradient, for `g` of (rows, n) values.
    fn input_gradient(&self, g: &[f32]) -> Result<Vec<f32>> {
        let (n, k) = self.w.dims2()?;
        Ok(match &self.integer {
            Some(integer) => integer.backward.matmul_t(g, g.len() / n),
            None => with_values(&self.w, |w| {
                memagent_engine::gemm_n(g, g.len() / n, w, n, k)
            })?,
        })
    }

    /// The output's dims for an input of `dims`.
    fn output_dims(&self, dims: &[usize]) -> Result<Vec<usize>> {
        let (n, k) = self.w.dims2()?;
        let mut dims = dims.to_vec();
        if dims.last() != Some(&k) {
            candle_core::bail!("frozen-linear: input {dims:?} for a ({n}, {k}) weight")
        }
        *dims.last_mut().expect("rank >= 1") = n;
        Ok(dims)
    }
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = values(storage, layout, "frozen-linear")?;
        let dims = self.output_dims(layout.dims())?;
        Ok((CpuStorage::F32(self.product(x)?), Shape::from(dims)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dx = with_values(grad, |g| self.input_gradient(g))??;
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

/// RMS normalisation of the last dimension, times a frozen `weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
        return rms_norm_composed(x, weight, eps);
    }
    let weight = weight.flatten_all()?.to_vec1::<f32>()?;
    if x.dims().last() != Some(&weight.len()) {
        candle_core::bail!("rms-norm: input {:?}, weight of {}", x.dims(), weight.len())
    }
    x.contiguous()?.apply_op1(RmsNorm { weight, eps })
}

/// RMS normalisation from composed (differentiable) ops (off the CPU, and the
/// reference the tests compare with).
pub fn rms_norm_composed(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + f64::from(eps))?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(weight)
}

struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    fn inverse_rms(&self, row: &[f32]) -> f32 {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        1.0 / (ms + self.eps).sqrt()
    }
}

/// `out[r] = f(r, row r of each input)` over rows of `width`, on the engine's pool.
fn map_rows(inputs: &[&[f32]], width: usize, f: impl Fn(&[&[f32]], &mut [f32]) + Sync) -> Vec<f32> {
    let len = inputs[0].len();
    let mut out = vec![0f32; len];
    let rows = len / width.max(1);
    let out_ptr = out.as_mut_ptr() as usize;
    const ROWS: usize = 16;
    memagent_engine::for_chunks(rows.div_ceil(ROWS), |blocks| {
        let mut row_inputs: Vec<&[f32]> = Vec::with_capacity(inputs.len());
        for r in blocks.start * ROWS..(blocks.end * ROWS).min(rows) {
            row_inputs.clear();
            row_inputs.extend(inputs.iter().map(|x| &x[r * width..(r + 1) * width]));
            // SAFETY: each row of `out` is written by the one task that owns it, and
            // `out` outlives the pool call.
            let row = unsafe {
                std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r * width), width)
            };
            f(&row_inputs, row);
        }
    });
    out
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = values(storage, layout, "rms-norm")?;
        let y = map_rows(&[x], self.weight.len(), |x, out| {
            let inv = self.inverse_rms(x[0]);
            for ((o, &v), &w) in out.iter_mut().zip(x[0]).zip(&self.weight) {
                *o = v * inv * w;
            }
        });
        Ok((CpuStorage::F32(y), layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        // y = x · inv · w with inv = (mean x² + eps)^-1/2:
        // dx = inv · (g ⊙ w) − x · inv³ · mean(g ⊙ w ⊙ x).
        let n = self.weight.len();
        let dx = with_values(arg, |x| {
            with_values(grad, |g| {
                map_rows(&[x, g], n, |rows, out| {
                    let (x, g) = (rows[0], rows[1]);
                    let inv = self.inverse_rms(x);
                    let dot: f32 = x
                        .iter()
                        .zip(g)
                        .zip(&self.weight)
                        .map(|((x, g), w)| x * g * w)
                        .sum();
                    let c = inv * inv * inv * dot / n as f32;
                    for (((o, &x), &g), &w) in out.iter_mut().zip(x).zip(g).zip(&self.weight) {
                        *o = inv * g * w - x * c;
                    }
                })
            })
        })??;
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

/// `silu(gate) ⊙ up`, the gated MLP's activation.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if !gate.device().is_cpu() || gate.dtype() != candle_core::DType::F32 {
        return gate.silu()? * up;
    }
    if gate.shape() != up.shape() {
        candle_core::bail!("swiglu: gate {:?}, up {:?}", gate.shape(), up.shape())
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

struct SwiGlu;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, u) = (values(gs, gl, "swiglu")?, values(us, ul, "swiglu")?);
        let width = gl.dims().last().copied().unwrap_or(1);
        let y = map_rows(&[g, u], width, |rows, out| {
            for ((o, &g), &u) in out.iter_mut().zip(rows[0]).zip(rows[1]) {
                *o = g * sigmoid(g) * u;
            }
        });
        Ok((CpuStorage::F32(y), gl.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let width = gate.dims().last().copied().unwrap_or(1);
        let (dg, du) = with_values(gate, |g| {
            with_values(up, |u| {
                with_values(grad, |d| {
                    // d silu(g) = σ(g) (1 + g (1 − σ(g))).
                    let dg = map_rows(&[g, u, d], width, |rows, out| {
                        for (((o, &g), &u), &d) in
                            out.iter_mut().zip(rows[0]).zip(rows[1]).zip(rows[2])
                        {
                            let s = sigmoid(g);
                            *o = d * u * s * (1.0 + g * (1.0 - s));
                        }
                    });
                    let du = map_rows(&[g, d], width, |rows, out| {
                        for ((o, &g), &d) in out.iter_mut().zip(rows[0]).zip(rows[1]) {
                            *o = d * g * sigmoid(g);
                        }
                    });
                    (dg, du)
                })
            })
        })???;
        Ok((
            Some(Tensor::from_vec(dg, gate.shape(), gate.device())?),
            Some(Tensor::from_vec(du, up.shape(), up.device())?),
        ))
    }
}

/// Rotary embedding of `x` (b, h, t, d) with tables (t, d/2); adjacent pairs when
/// `interleaved` (llama.cpp's normal rope), halves otherwise (NeoX). The backward pass
/// rotates the gradient back (the same rope with the sine negated).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Result<Tensor> {
    let apply = move |x: &Tensor, cos: &Tensor, sin: &Tensor| {
        if interleaved {
            candle_nn::rotary_emb::rope_i(x, cos, sin)
        } else {
            candle_nn::rotary_emb::rope(x, cos, sin)
        }
    };
    let (c1, s1) = (cos.clone(), sin.clone());
    let (c2, s2) = (cos.clone(), sin.neg()?);
    linear_map(
        x,
        "rope",
        Arc::new(move |x| apply(x, &c1, &s1)),
        Arc::new(move |g| apply(g, &c2, &s2)),
    )
}

/// Softmax over the last dimension of `scores` (.., rows, t), where row `r` is the query
/// at position `r % t` and sees keys `0..=r % t` (several heads' queries may be stacked
/// as rows); scores are multiplied by `scale` first. Masked entries are exactly zero.
pub fn causal_softmax(scores: &Tensor, scale: f32) -> Result<Tensor> {
    scores.contiguous()?.apply_op1(CausalSoftmax { scale })
}

struct CausalSoftmax {
    scale: f32,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("causal-softmax expects f32")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("causal-softmax expects a contiguous input")
        };
        let t = layout.dims().last().copied().unwrap_or(1).max(1);
        let mut out = data[start..end].to_vec();
        out.par_chunks_mut(t).enumerate().for_each(|(r, row)| {
            let keys = r % t + 1;
            let (seen, masked) = row.split_at_mut(keys);
            let max = seen.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let mut sum = 0.0;
            for v in seen.iter_mut() {
                *v = exp((*v - max) * self.scale);
                sum += *v;
            }
            for v in seen.iter_mut() {
                *v /= sum;
            }
            masked.fill(0.0);
        });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        // d softmax: y ⊙ (g − Σ g ⊙ y), times the scale applied to the scores.
        let dot = (grad_res * res)?.sum_keepdim(D::Minus1)?;
        let g = (grad_res.broadcast_sub(&dot)? * res)?;
        Ok(Some((g * f64::from(self.scale))?))
    }
}

/// −log softmax(logits)[target] for each row of `logits` (n, vocab): one pass forward
/// and one back, where the composed log-softmax and gather write and read several
/// tensors of the logits' size each way.
pub fn nll_rows(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let (n, vocab) = logits.dims2()?;
    if targets.len() != n {
        candle_core::bail!("nll: {} targets for {n} rows of logits", targets.len())
    }
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("nll: target {t} outside a vocabulary of {vocab}")
    }
    logits.contiguous()?.apply_op1(Nll {
        targets: targets.to_vec(),
        log_sum_exp: std::sync::Mutex::new(Vec::new()),
    })
}

struct Nll {
    targets: Vec<u32>,
    /// Each row's log Σ exp, kept by the forward pass for the backward.
    log_sum_exp: std::sync::Mutex<Vec<f32>>,
}

fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + row.iter().map(|&v| exp(v - max)).sum::<f32>().ln()
}

impl CustomOp1 for Nll {
    fn name(&self) -> &'static str {
        "nll"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = values(storage, layout, "nll")?;
        let (n, vocab) = layout.shape().dims2()?;
        let lse: Vec<f32> = (0..n)
            .into_par_iter()
            .map(|r| log_sum_exp(&x[r * vocab..(r + 1) * vocab]))
            .collect();
        let nll = lse
            .iter()
            .enumerate()
            .map(|(r, l)| l - x[r * vocab + self.targets[r] as usize])
            .collect();
        *self.log_sum_exp.lock().expect("nll state") = lse;
        Ok((CpuStorage::F32(nll), Shape::from(n)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        // d nll_r / d x_rj = softmax_rj − [j = target_r].
        let (_, vocab) = arg.dims2()?;
        let lse = self.log_sum_exp.lock().expect("nll state").clone();
        let g = grad.flatten_all()?.to_vec1::<f32>()?;
        let dx = with_values(arg, |x| {
            let mut dx = vec![0f32; x.len()];
            dx.par_chunks_mut(vocab)
                .zip(x.par_chunks(vocab))
                .enumerate()
                .for_each(|(r, (out, row))| {
                    for (o, &v) in out.iter_mut().zip(row) {
                        *o = g[r] * exp(v - lse[r]);
                    }
                    out[self.targets[r] as usize] -= g[r];
                });
            dx
        })?;
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::Var;

    /// Asserts `a` equals `b` within a relative 1e-5 (`what` names the values).
    pub(crate) fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0f32, f32::max);
        assert!(worst < 1e-5, "{what}: relative difference {worst}");
    }

    /// Compares the gradient of Σ (f(x) ⊙ probe) with central differences.
    fn check_grad(f: impl Fn(&Tensor) -> Result<Tensor>, shape: (usize, usize, usize, usize)) {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1.0, shape, &dev).unwrap();
        let probe = Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
        let loss = |t: &Tensor| (f(t).unwrap() * &probe).unwrap().sum_all().unwrap();
        let grads = loss(x.as_tensor()).backward().unwrap();
        let g: Vec<f32> = grads
            .get(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        for i in [0, base.len() / 3, base.len() - 1] {
            let eps = 1e-2f32;
            let at = |d: f32| {
                let mut v = base.clone();
                v[i] += d;
                let t = Tensor::from_vec(v, shape, &dev).unwrap();
                loss(&t).to_scalar::<f32>().unwrap()
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (numeric - g[i]).abs() < 2e-2 * (1.0 + numeric.abs()),
                "entry {i}: analytic {} numeric {numeric}",
                g[i]
            );
        }
    }

    #[test]
    fn rope_and_softmax_gradients_match_finite_differences() {
        let dev = Device::Cpu;
        let cos = Tensor::randn(0f32, 1.0, (6, 2), &dev).unwrap();
        let sin = Tensor::randn(0f32, 1.0, (6, 2), &dev).unwrap();
        for interleaved in [true, false] {
            check_grad(|x| rope(x, &cos, &sin, interleaved), (1, 2, 6, 4));
        }
        check_grad(|x| causal_softmax(x, 0.5), (1, 2, 6, 6));
        let w = Tensor::randn(0f32, 1.0, (3, 6), &dev).unwrap();
        let frozen = Frozen::new(w);
        check_grad(
            |x| {
                frozen
                    .forward(x)?
                    .sum_keepdim(D::Minus1)?
                    .broadcast_as(x.shape())?
                    .contiguous()
            },
            (1, 2, 6, 6),
        );
    }

    /// The fused RMS norm and SwiGLU give the composed ops' values and gradients.
    #[test]
    fn fused_row_ops_equal_the_composed_ones_with_their_gradients() {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1.0, (37, 24), &dev).unwrap();
        let u = Var::randn(0f32, 1.0, (37, 24), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, 24, &dev).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (37, 24), &dev).unwrap();
        let run = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
            let y = f(x.as_tensor(), u.as_tensor()).unwrap();
            let grads = (&y * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let g = |var: &Var| grads.get(var).map_or_else(Vec::new, v);
            (v(&y), g(&x), g(&u))
        };
        let fused = run(&|x, _| rms_norm(x, &w, 1e-5));
        let composed = run(&|x, _| rms_norm_composed(x, &w, 1e-5));
        close(&fused.0, &composed.0, "rms-norm");
        close(&fused.1, &composed.1, "rms-norm dx");
        let fused = run(&|g, u| swiglu(g, u));
        let composed = run(&|g, u| g.silu()? * u);
        close(&fused.0, &composed.0, "swiglu");
        close(&fused.1, &composed.1, "swiglu dgate");
        close(&fused.2, &composed.2, "swiglu dup");
    }

    #[test]
    fn exp_is_within_3e_7_of_libm() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let want = f64::from(x).exp();
            worst = worst.max((f64::from(exp(x)) - want).abs() / want);
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 2e-38 && exp(-1000.0) >= 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn causal_softmax_masks_the_future() {
        let x = Tensor::zeros((1, 2, 3, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let y: Vec<Vec<f32>> = causal_softmax(&x, 1.0)
            .unwrap()
            .reshape((6, 3))
            .unwrap()
            .to_vec2()
            .unwrap();
        assert_eq!(y[0], vec![1.0, 0.0, 0.0]);
        assert_eq!(y[4], vec![0.5, 0.5, 0.0]);
        assert!((y[2][2] - 1.0 / 3.0).abs() < 1e-6);
    }
}

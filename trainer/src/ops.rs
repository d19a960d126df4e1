//! Differentiable operations the training forward pass needs beyond candle's own:
//! products with frozen weights and rotary embeddings (linear maps whose backward pass
//! is another linear map, so no gradient is ever computed for the frozen weights), a
//! causal softmax with its backward, and RMS normalisation from composed ops.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor, D};
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
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("{} expects f32", self.name)
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{} expects a contiguous input", self.name)
        };
        let x = Tensor::from_slice(&data[start..end], layout.shape(), &Device::Cpu)?;
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
}

impl Frozen {
    pub fn new(w: Tensor) -> Self {
        Self { w }
    }

    pub fn weight(&self) -> &Tensor {
        &self.w
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w1, w2) = (self.w.clone(), self.w.clone());
        linear_map(
            x,
            "frozen-linear",
            Arc::new(move |x| matmul_last(x, &w1.t()?)),
            Arc::new(move |g| matmul_last(g, &w2)),
        )
    }
}

/// `x (.., k) · m (k, n) -> (.., n)`.
fn matmul_last(x: &Tensor, m: &Tensor) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let k = *dims.last().unwrap_or(&1);
    let rows = x.elem_count() / k.max(1);
    let y = x.reshape((rows, k))?.matmul(m)?;
    *dims.last_mut().expect("rank >= 1") = y.dim(1)?;
    y.reshape(dims)
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
                *v = ((*v - max) * self.scale).exp();
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

/// RMS normalisation from composed (differentiable) ops.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + f64::from(eps))?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(weight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

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

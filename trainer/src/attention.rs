//! Causal attention for training without the (heads, t, t) score tensors: the forward
//! pass keeps only each row's log-sum-exp, and the backward pass recomputes the
//! probabilities a block of query rows at a time (FlashAttention's recomputation on the
//! CPU). Composed from candle ops, a 2,000-token sequence kept four score-sized tensors
//! per layer for the backward pass, 4 GB over the model's 30 layers, and most of the
//! time went to the kernel zeroing fresh pages for them.
//!
//! Every product is a single-threaded GEMM on a block, and the heads are shared out on
//! the engine's thread pool, the pool prefill runs on.

use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use gemm::{gemm, Parallelism};

use crate::ops::{exp, values};

/// Query rows per block: the scores of a block are (ROWS, keys).
const ROWS: usize = 64;

/// Softmax(scale · q kᵀ, causal) v for `q` (heads, t, d), `k` and `v` (kv_heads, t, d),
/// query heads sharing key/value heads in consecutive groups; the result is (t, heads·d),
/// head h in columns h·d..(h+1)·d (the output projection's input).
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    if !q.device().is_cpu() {
        return reference_attention(q, k, v, scale);
    }
    q.contiguous()?.apply_op3(
        &k.contiguous()?,
        &v.contiguous()?,
        CausalAttention {
            scale,
            log_sum_exp: OnceLock::new(),
        },
    )
}

/// The same attention composed from candle ops, materialising the scores (off the CPU,
/// and the reference the tests compare with).
pub fn reference_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    let (heads, t, d) = q.dims3()?;
    let kv_heads = k.dim(0)?;
    let group = heads / kv_heads;
    // Query heads sharing a key/value head are stacked as rows: (kv, g·t, d).
    let q = q.reshape((kv_heads, group * t, d))?;
    let probs = crate::ops::causal_softmax(&q.matmul(&k.t()?)?, scale)?;
    probs
        .matmul(v)?
        .reshape((heads, t, d))?
        .transpose(0, 1)?
        .reshape((t, heads * d))
}

struct CausalAttention {
    scale: f32,
    /// Per head and query row, log Σ exp(scale · score) over the keys it sees.
    log_sum_exp: OnceLock<Vec<f32>>,
}

/// Dimensions of one call.
#[derive(Clone, Copy)]
struct Dims {
    heads: usize,
    kv_heads: usize,
    t: usize,
    d: usize,
}

impl Dims {
    fn of(q: &Layout, k: &Layout, v: &Layout) -> Result<Self> {
        let (heads, t, d) = q.shape().dims3()?;
        let (kv_heads, kt, kd) = k.shape().dims3()?;
        if (kt, kd) != (t, d)
            || v.shape().dims3()? != (kv_heads, t, d)
            || kv_heads == 0
            || heads % kv_heads != 0
        {
            candle_core::bail!(
                "causal attention: q {:?}, k {:?}, v {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            )
        }
        Ok(Self {
            heads,
            kv_heads,
            t,
            d,
        })
    }

    fn kv(&self, head: usize) -> usize {
        head / (self.heads / self.kv_heads)
    }

    /// Query-row blocks: (first row, rows).
    fn blocks(&self) -> impl Iterator<Item = (usize, usize)> {
        let t = self.t;
        (0..t).step_by(ROWS).map(move |r0| (r0, ROWS.min(t - r0)))
    }
}

/// A matrix operand: base pointer, column stride, row stride (elements).
#[derive(Clone, Copy)]
struct Mat(*const f32, isize, isize);

/// `dst (m, n) [+]= lhs (m, k) · rhs (k, n)`, single-threaded.
///
/// # Safety
/// Every element addressed through the operands' strides must be valid, and `dst`'s
/// elements written by no other thread meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_row_stride: usize,
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
) {
    unsafe {
        gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_row_stride as isize,
            accumulate,
            lhs.0,
            lhs.1,
            lhs.2,
            rhs.0,
            rhs.1,
            rhs.2,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

/// Row `r`'s scores (`keys` of them) after the causal mask: entries past `r` zeroed,
/// the rest `exp(scale · s − lse)`; returns the row's log-sum-exp when `lse` is None.
fn softmax_row(row: &mut [f32], r: usize, scale: f32, lse: Option<f32>) -> f32 {
    let (seen, masked) = row.split_at_mut(r + 1);
    masked.fill(0.0);
    let lse = lse.unwrap_or_else(|| {
        let max = seen.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) * scale;
        let sum: f32 = seen.iter().map(|&v| exp(v * scale - max)).sum();
        max + sum.ln()
    });
    for v in seen.iter_mut() {
        *v = exp(*v * scale - lse);
    }
    lse
}

impl CustomOp3 for CausalAttention {
    fn name(&self) -> &'static str {
        "causal-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = Dims::of(ql, kl, vl)?;
        let op = "causal attention";
        let (q, k, v) = (
            values(qs, ql, op)?,
            values(ks, kl, op)?,
            values(vs, vl, op)?,
        );
        let Dims { heads, t, d, .. } = dims;
        let width = heads * d;
        let mut out = vec![0f32; t * width];
        let mut lse = vec![0f32; heads * t];
        let (out_ptr, lse_ptr) = (out.as_mut_ptr() as usize, lse.as_mut_ptr() as usize);
        let (q, k, v) = (
            q.as_ptr() as usize,
            k.as_ptr() as usize,
            v.as_ptr() as usize,
        );
        memagent_engine::for_chunks(heads, |range| {
            let mut scores = vec![0f32; ROWS * t];
            for h in range {
                let kv = dims.kv(h);
                let qh = (q as *const f32).wrapping_add(h * t * d);
                let kh = (k as *const f32).wrapping_add(kv * t * d);
                let vh = (v as *const f32).wrapping_add(kv * t * d);
                for (r0, rows) in dims.blocks() {
                    let keys = r0 + rows;
                    let s = &mut scores[..rows * keys];
                    // SAFETY: q (heads, t, d), k and v (kv, t, d) are contiguous and
                    // checked by `Dims::of`; rows r0..r0+rows and keys 0..keys lie
                    // within t; `scores` holds rows·keys; this task alone writes head
                    // h's columns of the output and its log-sum-exp entries.
                    unsafe {
                        // s = q[r0..] kᵀ: (rows, keys).
                        product(
                            rows,
                            keys,
                            d,
                            s.as_mut_ptr(),
                            keys,
                            false,
                            Mat(qh.add(r0 * d), 1, d as isize),
                            Mat(kh, d as isize, 1),
                        );
                        for (i, row) in s.chunks_exact_mut(keys).enumerate() {
                            let l = softmax_row(row, r0 + i, self.scale, None);
                            *(lse_ptr as *mut f32).add(h * t + r0 + i) = l;
                        }
                        // out[r0.., head h] = p v: (rows, d).
                        product(
                            rows,
                            d,
                            keys,
                            (out_ptr as *mut f32).add(r0 * width + h * d),
                            width,
                            false,
                            Mat(s.as_ptr(), 1, keys as isize),
                            Mat(vh, 1, d as isize),
                        );
                    }
                }
            }
        });
        self.log_sum_exp
            .set(lse)
            .map_err(|_| candle_core::Error::Msg("causal attention ran twice".into()))?;
        Ok((CpuStorage::F32(out), Shape::from((t, width))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let Some(lse) = self.log_sum_exp.get() else {
            candle_core::bail!("causal attention: backward before forward")
        };
        let (heads, t, d) = q.dims3()?;
        let kv_heads = k.dim(0)?;
        let dims = Dims {
            heads,
            kv_heads,
            t,
            d,
        };
        let width = heads * d;
        let vec = |x: &Tensor| x.contiguous()?.flatten_all()?.to_vec1::<f32>();
        let (qv, kvv, vv, o, g) = (vec(q)?, vec(k)?, vec(v)?, vec(res)?, vec(grad)?);
        // Per head: dq, and its own dk and dv (summed over each group below).
        let mut dq = vec![0f32; heads * t * d];
        let mut dk = vec![0f32; heads * t * d];
        let mut dv = vec![0f32; heads * t * d];
        let ptrs = [&qv, &kvv, &vv, &o, &g].map(|x| x.as_ptr() as usize);
        let outs = [&mut dq, &mut dk, &mut dv].map(|x| x.as_mut_ptr() as usize);
        memagent_engine::for_chunks(heads, |range| {
            let [q, k, v, o, g] = ptrs.map(|p| p as *const f32);
            let [dq, dk, dv] = outs.map(|p| p as *mut f32);
            let mut p = vec![0f32; ROWS * t];
            let mut dp = vec![0f32; ROWS * t];
            let mut delta = [0f32; ROWS];
            for h in range {
                let kv = dims.kv(h);
                // SAFETY: as in the forward pass, over the same (contiguous, checked)
                // shapes; this task alone writes head h's dq, dk and dv.
                unsafe {
                    let qh = q.add(h * t * d);
                    let kh = k.add(kv * t * d);
                    let vh = v.add(kv * t * d);
                    let (dqh, dkh, dvh) = (dq.add(h * t * d), dk.add(h * t * d), dv.add(h * t * d));
                    for (r0, rows) in dims.blocks() {
                        let keys = r0 + rows;
                        let (p, dp) = (&mut p[..rows * keys], &mut dp[..rows * keys]);
                        let go = g.add(r0 * width + h * d);
                        for (i, di) in delta[..rows].iter_mut().enumerate() {
                            let at = (r0 + i) * width + h * d;
                            *di = (0..d).map(|c| *g.add(at + c) * *o.add(at + c)).sum();
                        }
                        product(
                            rows,
                            keys,
                            d,
                            p.as_mut_ptr(),
                            keys,
                            false,
                            Mat(qh.add(r0 * d), 1, d as isize),
                            Mat(kh, d as isize, 1),
                        );
                        for (i, row) in p.chunks_exact_mut(keys).enumerate() {
                            softmax_row(row, r0 + i, self.scale, Some(lse[h * t + r0 + i]));
                        }
                        // dp = dout vᵀ: (rows, keys).
                        product(
                            rows,
                            keys,
                            d,
                            dp.as_mut_ptr(),
                            keys,
                            false,
                            Mat(go, 1, width as isize),
                            Mat(vh, d as isize, 1),
                        );
                        scores_grad(dp, p, &delta, keys, self.scale);
                        let ds = Mat(dp.as_ptr(), 1, keys as isize);
                        // dq[r0..] = ds k; dk[..keys] += dsᵀ q[r0..]; dv[..keys] += pᵀ dout.
                        product(
                            rows,
                            d,
                            keys,
                            dqh.add(r0 * d),
                            d,
                            false,
                            ds,
                            Mat(kh, 1, d as isize),
                        );
                        product(
                            keys,
                            d,
                            rows,
                            dkh,
                            d,
                            true,
                            Mat(dp.as_ptr(), keys as isize, 1),
                            Mat(qh.add(r0 * d), 1, d as isize),
                        );
                        product(
                            keys,
                            d,
                            rows,
                            dvh,
                            d,
                            true,
                            Mat(p.as_ptr(), keys as isize, 1),
                            Mat(go, 1, width as isize),
                        );
                    }
                }
            }
        });
        let dev = q.device();
        let per_head = |x: Vec<f32>| sum_groups(x, heads / kv_heads, (kv_heads, t, d), dev);
        Ok((
            Some(Tensor::from_vec(dq, (heads, t, d), dev)?),
            Some(per_head(dk)?),
            Some(per_head(dv)?),
        ))
    }
}

/// ds = p ⊙ (dp − Σ dout ⊙ out) · scale, in place of `dp` (rows of `keys`; `delta`:
/// each row's Σ dout ⊙ out).
fn scores_grad(dp: &mut [f32], p: &[f32], delta: &[f32], keys: usize, scale: f32) {
    for ((ds, pr), di) in dp
        .chunks_exact_mut(keys)
        .zip(p.chunks_exact(keys))
        .zip(delta)
    {
        for (x, &pv) in ds.iter_mut().zip(pr) {
            *x = pv * (*x - di) * scale;
        }
    }
}

/// Each key/value head's gradient from the query heads' (`group` consecutive heads
/// share one): their sum, in head order (candle's strided sum over that axis ran on one
/// thread, slowly).
fn sum_groups(
    x: Vec<f32>,
    group: usize,
    (kv_heads, t, d): (usize, usize, usize),
    dev: &candle_core::Device,
) -> Result<Tensor> {
    if group == 1 {
        return Tensor::from_vec(x, (kv_heads, t, d), dev);
    }
    let size = t * d;
    let mut out = Vec::with_capacity(kv_heads * size);
    for heads in x.chunks_exact(group * size) {
        let (first, rest) = heads.split_at(size);
        let start = out.len();
        out.extend_from_slice(first);
        for other in rest.chunks_exact(size) {
            for (o, v) in out[start..].iter_mut().zip(other) {
                *o += v;
            }
        }
    }
    Tensor::from_vec(out, (kv_heads, t, d), dev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::close;
    use candle_core::{Device, Var};

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// Output and gradients equal the composed reference's, over lengths within one
    /// block, across a ragged last block, and several blocks; grouped heads included.
    #[test]
    fn fused_attention_equals_the_composed_one_with_its_gradients() {
        let dev = Device::Cpu;
        for (heads, kv_heads, t, d) in [(2, 1, 5, 4), (3, 3, 64, 8), (4, 2, 150, 16)] {
            let q = Var::randn(0f32, 1.0, (heads, t, d), &dev).unwrap();
            let k = Var::randn(0f32, 1.0, (kv_heads, t, d), &dev).unwrap();
            let v = Var::randn(0f32, 1.0, (kv_heads, t, d), &dev).unwrap();
            let probe = Tensor::randn(0f32, 1.0, (t, heads * d), &dev).unwrap();
            let run = |f: fn(&Tensor, &Tensor, &Tensor, f32) -> Result<Tensor>| {
                let y = f(q.as_tensor(), k.as_tensor(), v.as_tensor(), 0.35).unwrap();
                let grads = (&y * &probe)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let g = |x: &Var| values(grads.get(x).unwrap());
                (values(&y), g(&q), g(&k), g(&v))
            };
            let fused = run(causal_attention);
            let reference = run(reference_attention);
            let shape = format!("({heads}, {kv_heads}, {t}, {d})");
            close(&fused.0, &reference.0, &format!("{shape} output"));
            close(&fused.1, &reference.1, &format!("{shape} dq"));
            close(&fused.2, &reference.2, &format!("{shape} dk"));
            close(&fused.3, &reference.3, &format!("{shape} dv"));
        }
    }
}

//! Causal attention computed one block of queries at a time, so that the score matrix
//! never exceeds a fixed number of elements: memory grows linearly with the prompt.
//! Query heads that share a key/value head (grouped-query attention) are stacked as rows
//! of one matmul instead of copying keys and values per head. Scaling, the causal mask
//! and the softmax run as one fused pass over the scores, in place.

use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};

use super::linear::DENSE_MIN_ROWS;
use super::softmax::softmax_in_place;
use crate::error::Result;

/// Upper bound on score-matrix elements per block (16 MiB of f32).
const MAX_SCORE_ELEMENTS: usize = 1 << 22;
/// Queries per block: small enough that little of the diagonal block is wasted on masked
/// positions, large enough for efficient matmuls.
const MAX_BLOCK: usize = 128;
const MIN_BLOCK: usize = 16;

/// `q`: (b, n_head, t, d) for positions `offset..offset + t`;
/// `k`, `v`: (b, n_kv_head, offset + t, d), the cache including the new positions.
/// With a `window`, a query sees only the keys of the latest `window` positions, its own
/// included (sliding-window layers). Returns (b, n_head, t, d).
pub(crate) fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
    window: Option<usize>,
) -> Result<Tensor> {
    let t = q.dim(2)?;
    // A window that reaches back past position 0 for every query hides nothing.
    let binding = window.filter(|&w| offset + t > w);
    // A few rows (decoding, a verification pass, a batch's sequences) must each get the
    // bits of decoding it alone: the kernel serves them only where it would also serve a
    // single row, and otherwise each row runs as a single row would.
    let few = t < DENSE_MIN_ROWS;
    #[cfg(x86_avx2)]
    if q.device().is_cpu() && binding.is_none() {
        let (b, n_head, _, d) = q.dims4()?;
        let op = |t: usize| super::cache_attention::CacheAttention {
            offset,
            scale: 1.0 / (d as f32).sqrt(),
            block: query_block(b, n_head, t, offset),
        };
        let group = n_head / k.dim(1)?;
        if op(t).applies(group, t, d) && (!few || op(1).applies(group, 1, d)) {
            return Ok(q.contiguous()?.apply_op3_no_bwd(k, v, &op(t))?);
        }
    }
    if few && t > 1 {
        let rows = (0..t)
            .map(|i| {
                let seen = offset + i + 1;
                causal_attention(
                    &q.narrow(2, i, 1)?.contiguous()?,
                    &k.narrow(2, 0, seen)?,
                    &v.narrow(2, 0, seen)?,
                    offset + i,
                    window,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(Tensor::cat(&rows, 2)?);
    }
    blocked_attention(q, k, v, offset, binding.unwrap_or(usize::MAX))
}

/// Queries per block for `t` queries of `n_head` heads after `offset` positions.
fn query_block(b: usize, n_head: usize, t: usize, offset: usize) -> usize {
    (MAX_SCORE_ELEMENTS / (b * n_head * (offset + t)).max(1))
        .clamp(MIN_BLOCK, MAX_BLOCK)
        .min(t)
}

/// [`causal_attention`] through matmuls over blocks of queries, each over the keys its
/// queries may see (those of the latest `window` positions; `usize::MAX`: all).
fn blocked_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
    window: usize,
) -> Result<Tensor> {
    if q.device().is_cpu() {
        return blocked_attention_cpu(q, k, v, offset, window);
    }
    let (b, n_head, t, d) = q.dims4()?;
    let n_kv = k.dim(1)?;
    let group = n_head / n_kv;
    let scale = 1.0 / (d as f32).sqrt();
    let block = query_block(b, n_head, t, offset);
    // (b, n_kv, group, t, d): heads of one group share a key/value head.
    let q = q.reshape((b, n_kv, group, t, d))?;
    let mut outputs = Vec::with_capacity(t.div_ceil(block));
    let mut start = 0;
    while start < t {
        let len = block.min(t - start);
        let first = offset + start;
        let from = (first + 1).saturating_sub(window);
        let keys = first + len - from;
        let qb = if len == t {
            q.reshape((b, n_kv, group * len, d))?
        } else {
            q.narrow(3, start, len)?
                .contiguous()?
                .reshape((b, n_kv, group * len, d))?
        };
        let kb = k.narrow(2, from, keys)?;
        let vb = v.narrow(2, from, keys)?;
        let scores = qb.matmul(&kb.t()?)?;
        let softmax = CausalSoftmax {
            scale,
            first: first - from,
            len,
            window,
        };
        let probs = if scores.device().is_cpu() {
            scores.inplace_op1(&softmax)?;
            scores
        } else {
            softmax.with_tensor_ops(&scores, (b, n_kv, group, len, keys))?
        };
        let out = probs.matmul(&vb)?;
        outputs.push(out.reshape((b, n_kv, group, len, d))?);
        start += len;
    }
    let out = if outputs.len() == 1 {
        outputs.pop().expect("one block")
    } else {
        Tensor::cat(&outputs, 3)?
    };
    Ok(out.reshape((b, n_head, t, d))?)
}

/// [`blocked_attention`] on the CPU: each (sequence, key/value head, block of queries) is
/// a task on the engine's pool that runs the matmul path's products as single-threaded
/// GEMMs of the same shapes and strides (so the same bits), the blocks that see the most
/// keys handed out first. The matmuls ran one after another on candle's rayon pool while
/// the engine's pool spun beside it.
fn blocked_attention_cpu(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
    window: usize,
) -> Result<Tensor> {
    let (b, n_head, t, d) = q.dims4()?;
    let n_kv = k.dim(1)?;
    let group = n_head / n_kv;
    let scale = 1.0 / (d as f32).sqrt();
    let block = query_block(b, n_head, t, offset);
    let q = q.contiguous()?;
    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = k.storage_and_layout();
    let (v_storage, v_layout) = v.storage_and_layout();
    let (
        candle_core::Storage::Cpu(CpuStorage::F32(qs)),
        candle_core::Storage::Cpu(CpuStorage::F32(ks)),
        candle_core::Storage::Cpu(CpuStorage::F32(vs)),
    ) = (&*q_storage, &*k_storage, &*v_storage)
    else {
        return Err(
            candle_core::Error::Msg("attention expects f32 tensors on the CPU".into()).into(),
        );
    };
    let qs = &qs[q_layout.start_offset()..];
    let (k_at, k_strides) = (k_layout.start_offset(), k_layout.stride());
    let (v_at, v_strides) = (v_layout.start_offset(), v_layout.stride());
    let blocks = t.div_ceil(block);
    let heads = b * n_kv;
    let mut out = vec![0f32; b * n_head * t * d];
    let out_ptr = out.as_mut_ptr() as usize;
    super::pool::for_chunks(heads * blocks, |tasks| {
        for task in tasks {
            let (blk, bh) = (blocks - 1 - task / heads, task % heads);
            let (bi, h) = (bh / n_kv, bh % n_kv);
            let start = blk * block;
            let len = block.min(t - start);
            let first = offset + start;
            let from = (first + 1).saturating_sub(window);
            let keys = first + len - from;
            let m = group * len;
            // The group's query rows of this block, (group, len) row by row.
            let rows = |g: usize| (bh * group + g) * t + start;
            let mut lhs = vec![0f32; m * d];
            for g in 0..group {
                let at = rows(g) * d;
                lhs[g * len * d..(g + 1) * len * d].copy_from_slice(&qs[at..at + len * d]);
            }
            let cache = |strides: &[usize], at: usize| {
                at + bi * strides[0] + h * strides[1] + from * strides[2]
            };
            let mut scores = vec![0f32; m * keys];
            // SAFETY: the key rows from..from + keys of head h lie inside k's storage
            // (its layout's shape), as the output and query buffers hold m rows.
            unsafe {
                super::dense::gemm_single(
                    (m, keys, d),
                    (scores.as_mut_ptr(), keys as isize),
                    (lhs.as_ptr(), d as isize, 1),
                    (
                        ks.as_ptr().add(cache(k_strides, k_at)),
                        k_strides[3] as isize,
                        k_strides[2] as isize,
                    ),
                )
            };
            CausalSoftmax {
                scale,
                first: first - from,
                len,
                window,
            }
            .run(&mut scores, keys);
            let mut sums = vec![0f32; m * d];
            // SAFETY: as above, for v's rows.
            unsafe {
                super::dense::gemm_single(
                    (m, d, keys),
                    (sums.as_mut_ptr(), d as isize),
                    (scores.as_ptr(), keys as isize, 1),
                    (
                        vs.as_ptr().add(cache(v_strides, v_at)),
                        v_strides[2] as isize,
                        v_strides[3] as isize,
                    ),
                )
            };
            for g in 0..group {
                // SAFETY: each task writes its own (sequence, head, block) rows of the
                // (b, n_head, t, d) buffer, which outlives the pool call.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        sums.as_ptr().add(g * len * d),
                        (out_ptr as *mut f32).add(rows(g) * d),
                        len * d,
                    )
                };
            }
        }
    });
    drop((q_storage, k_storage, v_storage));
    Ok(Tensor::from_vec(out, (b, n_head, t, d), q.device())?)
}

/// Softmax over the last dimension of scores laid out as rows of `len` queries (repeated
/// for every head), where query `i` sits at key index `first + i` and sees keys
/// `first + i + 1 - window..=first + i` (from 0); scores are multiplied by `scale` first.
struct CausalSoftmax {
    scale: f32,
    first: usize,
    len: usize,
    window: usize,
}

impl CausalSoftmax {
    /// The keys row `row` sees.
    fn visible(&self, row: usize, keys: usize) -> std::ops::Range<usize> {
        let end = (self.first + row % self.len + 1).min(keys);
        end.saturating_sub(self.window)..end
    }

    /// The same computation as separate tensor ops, for GPU devices.
    fn with_tensor_ops(
        &self,
        scores: &Tensor,
        shape: (usize, usize, usize, usize, usize),
    ) -> Result<Tensor> {
        let (len, keys) = (shape.3, shape.4);
        let mut mask = vec![0f32; len * keys];
        for i in 0..len {
            let seen = self.visible(i, keys);
            let row = &mut mask[i * keys..(i + 1) * keys];
            row[..seen.start].fill(f32::NEG_INFINITY);
            row[seen.end..].fill(f32::NEG_INFINITY);
        }
        let mask = Tensor::from_vec(mask, (len, keys), scores.device())?;
        let scores = (scores * f64::from(self.scale))?
            .reshape(shape)?
            .broadcast_add(&mask)?
            .reshape((shape.0, shape.1, shape.2 * len, keys))?;
        Ok(candle_nn::ops::softmax_last_dim(&scores)?)
    }

    fn run(&self, data: &mut [f32], keys: usize) {
        let rows = data.len() / keys;
        let ptr = data.as_mut_ptr() as usize;
        super::pool::for_chunks(rows, |range| {
            for r in range {
                // SAFETY: rows are disjoint slices of `data`, each visited by one task.
                let row = unsafe {
                    std::slice::from_raw_parts_mut((ptr as *mut f32).add(r * keys), keys)
                };
                let seen = self.visible(r, keys);
                row[..seen.start].fill(0.0);
                row[seen.end..].fill(0.0);
                softmax_in_place(&mut row[seen], self.scale);
            }
        });
    }
}

impl InplaceOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("causal-softmax expects f32 scores")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("causal-softmax expects contiguous scores")
        };
        let keys = layout.dims().last().copied().unwrap_or(0);
        if keys > 0 {
            self.run(&mut data[start..end], keys);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values uniform in [-1, 1) from `seed`, the same sequence on every run.
    fn uniform(mut seed: u32) -> impl FnMut() -> f32 {
        move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// Queries of `t` positions and keys and values of `keys`, for heads `(n_head, n_kv,
    /// d)`, drawn from `next` and scaled by `scale`.
    fn qkv(
        next: &mut impl FnMut() -> f32,
        scale: f32,
        (n_head, n_kv, d): (usize, usize, usize),
        t: usize,
        keys: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut fill = |n: usize| -> Vec<f32> { (0..n).map(|_| next() * scale).collect() };
        let q = fill(n_head * t * d);
        let k = fill(n_kv * keys * d);
        (q, k, fill(n_kv * keys * d))
    }

    /// Attention through the cache kernel has exactly the bits of the matmul path, on
    /// caches that are views of longer buffers: one to fifteen rows per head (decoding,
    /// verification) and prefill blocks, keys across the GEMM's depth blocks, partial key
    /// tiles, grouped heads.
    #[cfg(x86_avx2)]
    #[test]
    fn cache_kernel_equals_the_matmul_path_bit_for_bit() {
        let dev = candle_core::Device::Cpu;
        let mut next = uniform(99);
        let mut taken = 0;
        let shapes = [
            (0, 3),
            (30, 1),
            (37, 2),
            (200, 15),
            (511, 1),
            (509, 4),
            (1100, 1),
            (1031, 9),
            (2047, 1),
            (0, 16),
            (0, 200),
            (512, 130),
            (1024, 512),
            (2600, 300),
        ];
        for (n_head, n_kv, d) in [(9, 3, 64), (6, 2, 64), (4, 1, 32)] {
            for (offset, t) in shapes {
                let keys = offset + t;
                let (q, k, v) = qkv(&mut next, 3.0, (n_head, n_kv, d), t, keys);
                // The cache as the model holds it: a buffer with room beyond `keys`, narrowed.
                let room = |x: &[f32]| -> Tensor {
                    let full = Tensor::zeros((1, n_kv, keys + 7, d), candle_core::DType::F32, &dev)
                        .unwrap();
                    let part = Tensor::from_slice(x, (1, n_kv, keys, d), &dev).unwrap();
                    full.slice_set(&part, 2, 0).unwrap();
                    full.narrow(2, 0, keys).unwrap()
                };
                let (kt, vt) = (room(&k), room(&v));
                let qt = Tensor::from_slice(&q, (1, n_head, t, d), &dev).unwrap();
                let flat = |x: Tensor| -> Vec<f32> { x.flatten_all().unwrap().to_vec1().unwrap() };
                let op = crate::kernels::cache_attention::CacheAttention {
                    offset,
                    scale: 1.0 / (d as f32).sqrt(),
                    block: query_block(1, n_head, t, offset),
                };
                if !op.applies(n_head / n_kv, t, d) {
                    continue;
                }
                taken += 1;
                let got = flat(qt.apply_op3_no_bwd(&kt, &vt, &op).unwrap());
                let want = flat(blocked_attention(&qt, &kt, &vt, offset, usize::MAX).unwrap());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "heads {n_head}/{n_kv}, offset {offset}, t {t}, value {i}: {g} vs {w}"
                    );
                }
            }
        }
        // Most shapes above take the kernel.
        assert!(taken >= 30, "{taken} shapes took the cache kernel");
    }

    /// Each query's output has the same bits whether it runs alone after its cache (one
    /// decoded token) or among up to fifteen (a verification pass), with and without a
    /// window that binds: drafting and batching rely on it.
    #[test]
    fn rows_do_not_depend_on_how_many_share_the_call() {
        let dev = candle_core::Device::Cpu;
        let mut next = uniform(3);
        // Head sizes the kernel takes (64) and does not (256); contexts where a single row
        // takes the kernel, and a short one where it does not.
        let shapes = [
            (4, 1, 64, 700, 15),
            (4, 1, 64, 1200, 4),
            (4, 1, 64, 40, 6),
            (4, 1, 256, 700, 15),
            (4, 1, 256, 100, 5),
        ];
        for (n_head, n_kv, d, offset, t) in shapes {
            let keys = offset + t;
            let (q, k, v) = qkv(&mut next, 2.0, (n_head, n_kv, d), t, keys);
            let kt = Tensor::from_slice(&k, (1, n_kv, keys, d), &dev).unwrap();
            let vt = Tensor::from_slice(&v, (1, n_kv, keys, d), &dev).unwrap();
            let qt = Tensor::from_slice(&q, (1, n_head, t, d), &dev).unwrap();
            for window in [None, Some(512), Some(30)] {
                let all = causal_attention(&qt, &kt, &vt, offset, window).unwrap();
                for i in 0..t {
                    let upto = offset + i + 1;
                    let alone = causal_attention(
                        &qt.narrow(2, i, 1).unwrap().contiguous().unwrap(),
                        &kt.narrow(2, 0, upto).unwrap(),
                        &vt.narrow(2, 0, upto).unwrap(),
                        offset + i,
                        window,
                    )
                    .unwrap();
                    let bits = |x: Tensor| -> Vec<u32> {
                        let v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
                        v.iter().map(|f| f.to_bits()).collect()
                    };
                    assert_eq!(
                        bits(all.narrow(2, i, 1).unwrap().contiguous().unwrap()),
                        bits(alone),
                        "head size {d}, offset {offset}, {t} rows, row {i}, window {window:?}"
                    );
                }
            }
        }
    }

    /// Sliding-window attention equals attention over each query's window alone,
    /// computed in f64: decoding, verification and prefill blocks, the window binding
    /// from the first query or only from a later one, grouped heads.
    #[test]
    fn a_window_hides_exactly_the_older_keys() {
        let dev = candle_core::Device::Cpu;
        let mut next = uniform(7);
        let (n_head, n_kv, d) = (4, 2, 16);
        for (offset, t, window) in [
            (40, 1, 8),
            (40, 5, 8),
            (0, 300, 37),
            (20, 30, 32),
            (5, 3, 8),
            (600, 200, 64),
        ] {
            let keys = offset + t;
            let (q, k, v) = qkv(&mut next, 2.0, (n_head, n_kv, d), t, keys);
            let tensor = |x: &[f32], rows: usize, heads: usize| {
                Tensor::from_slice(x, (1, heads, rows, d), &dev).unwrap()
            };
            let got: Vec<f32> = causal_attention(
                &tensor(&q, t, n_head),
                &tensor(&k, keys, n_kv),
                &tensor(&v, keys, n_kv),
                offset,
                Some(window),
            )
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
            for h in 0..n_head {
                let kv = h / (n_head / n_kv);
                for i in 0..t {
                    let p = offset + i;
                    let seen = (p + 1).saturating_sub(window)..p + 1;
                    let qi = &q[(h * t + i) * d..][..d];
                    let scores: Vec<f64> = seen
                        .clone()
                        .map(|j| {
                            let kj = &k[(kv * keys + j) * d..][..d];
                            qi.iter().zip(kj).map(|(a, b)| (a * b) as f64).sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for c in 0..d {
                        let want: f64 = seen
                            .clone()
                            .zip(&e)
                            .map(|(j, w)| w / sum * v[(kv * keys + j) * d + c] as f64)
                            .sum();
                        let g = got[(h * t + i) * d + c] as f64;
                        assert!(
                            (g - want).abs() < 1e-4,
                            "offset {offset}, t {t}, window {window}, head {h}, query {i}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

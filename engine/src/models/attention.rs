//! Causal attention computed one block of queries at a time, so that the score matrix
//! never exceeds a fixed number of elements: memory grows linearly with the prompt.
//! Query heads that share a key/value head (grouped-query attention) are stacked as rows
//! of one matmul instead of copying keys and values per head. Scaling, the causal mask
//! and the softmax run as one fused pass over the scores, in place.

use candle_core::{CpuStorage, CustomOp3, InplaceOp1, Layout, Shape, Tensor};

use crate::error::Result;

/// Fewer query rows than this take [`FewRows`]: one pass per row over the keys and values
/// where they lie in the cache, instead of matmuls that pack the whole cache per call.
/// The same bound as the projections' decode kernels, so that a row is computed the same
/// way whether it is decoded or resumed from a cached prefix.
pub(crate) const FEW_ROWS: usize = super::linear::DENSE_MIN_ROWS;

/// Upper bound on score-matrix elements per block (16 MiB of f32).
const MAX_SCORE_ELEMENTS: usize = 1 << 22;
/// Queries per block: small enough that little of the diagonal block is wasted on masked
/// positions, large enough for efficient matmuls.
const MAX_BLOCK: usize = 128;
const MIN_BLOCK: usize = 16;

/// `q`: (b, n_head, t, d) for positions `offset..offset + t`;
/// `k`, `v`: (b, n_kv_head, offset + t, d), the cache including the new positions.
/// Returns (b, n_head, t, d).
pub(crate) fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
) -> Result<Tensor> {
    let (b, n_head, t, d) = q.dims4()?;
    let n_kv = k.dim(1)?;
    let group = n_head / n_kv;
    let scale = 1.0 / (d as f32).sqrt();
    if t < FEW_ROWS && q.device().is_cpu() {
        return Ok(q
            .contiguous()?
            .apply_op3_no_bwd(k, v, &FewRows { offset, scale })?);
    }
    let total = offset + t;
    let block = (MAX_SCORE_ELEMENTS / (b * n_head * total).max(1))
        .clamp(MIN_BLOCK, MAX_BLOCK)
        .min(t);
    // (b, n_kv, group, t, d): heads of one group share a key/value head.
    let q = q.reshape((b, n_kv, group, t, d))?;
    let mut outputs = Vec::with_capacity(t.div_ceil(block));
    let mut start = 0;
    while start < t {
        let len = block.min(t - start);
        let keys = offset + start + len;
        let qb = if len == t {
            q.reshape((b, n_kv, group * len, d))?
        } else {
            q.narrow(3, start, len)?
                .contiguous()?
                .reshape((b, n_kv, group * len, d))?
        };
        let kb = k.narrow(2, 0, keys)?;
        let vb = v.narrow(2, 0, keys)?;
        let scores = qb.matmul(&kb.t()?)?;
        let softmax = CausalSoftmax {
            scale,
            first: offset + start,
            len,
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

/// Attention for a few query rows (decoding, drafts being verified): each row of each head
/// scores the keys it may see, takes their softmax and sums the values, reading the cache
/// in place. A row's result depends only on its own query and the cache, never on the
/// other rows of the call.
struct FewRows {
    offset: usize,
    scale: f32,
}

impl CustomOp3 for FewRows {
    fn name(&self) -> &'static str {
        "few-rows-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) = (qs, ks, vs) else {
            candle_core::bail!("few-rows-attention expects f32 tensors")
        };
        let (b, n_head, t, d) = ql.shape().dims4()?;
        let (kb, n_kv, keys, kd) = kl.shape().dims4()?;
        if kb != b || kd != d || vl.shape() != kl.shape() || n_kv == 0 || n_head % n_kv != 0 {
            candle_core::bail!(
                "few-rows-attention: q {:?} does not match k {:?} / v {:?}",
                ql.dims(),
                kl.dims(),
                vl.dims()
            )
        }
        let Some((q0, _)) = ql.contiguous_offsets() else {
            candle_core::bail!("few-rows-attention expects a contiguous query")
        };
        // Keys and values may be views of a longer cache: positions d apart, heads strided.
        let (kst, vst) = (kl.stride(), vl.stride());
        if kst[3] != 1 || vst[3] != 1 || kst[2] != d || vst[2] != d {
            candle_core::bail!("few-rows-attention expects cache rows of {d} contiguous values")
        }
        let group = n_head / n_kv;
        let mut out = vec![0f32; b * n_head * t * d];
        let out_ptr = out.as_mut_ptr() as usize;
        let (k0, v0) = (kl.start_offset(), vl.start_offset());
        // One unit per query row of each head: few rows, so each runs on its own.
        candle_core::utils::barrier_pool().execute_chunked(b * n_head * t, |range| {
            let mut scores = Vec::new();
            for unit in range {
                let (bh, row) = (unit / t, unit % t);
                let (batch, head) = (bh / n_head, bh % n_head);
                let kv = head / group;
                let seen = (self.offset + row + 1).min(keys);
                let query = &q[q0 + unit * d..q0 + (unit + 1) * d];
                let kbase = k0 + batch * kst[0] + kv * kst[1];
                let vbase = v0 + batch * vst[0] + kv * vst[1];
                scores.resize(seen, 0.0);
                scores_of(query, &k[kbase..kbase + seen * d], &mut scores);
                softmax_in_place(&mut scores, self.scale);
                // SAFETY: each unit owns its own d outputs of `out`, which outlives the call.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(unit * d), d)
                };
                weighted_sum(&scores, &v[vbase..vbase + seen * d], dst);
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((b, n_head, t, d))))
    }
}

/// `scores[j] = query . keys[j]` for rows of `query.len()` values.
fn scores_of(query: &[f32], keys: &[f32], scores: &mut [f32]) {
    let d = query.len();
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if d.is_multiple_of(LANES) {
        let mut j = 0;
        while j + 4 <= scores.len() {
            // SAFETY: four whole key rows of d values from j on; d is a multiple of 8.
            let s = unsafe { avx2::dots::<4>(query, keys.as_ptr().add(j * d)) };
            scores[j..j + 4].copy_from_slice(&s);
            j += 4;
        }
        for (jj, score) in scores.iter_mut().enumerate().skip(j) {
            // SAFETY: as above, one row.
            *score = unsafe { avx2::dots::<1>(query, keys.as_ptr().add(jj * d)) }[0];
        }
        return;
    }
    for (score, key) in scores.iter_mut().zip(keys.chunks_exact(d)) {
        *score = query.iter().zip(key).map(|(a, b)| a * b).sum();
    }
}

/// `dst += sum_j weights[j] * values[j]`, j in order, for rows of `dst.len()` values.
fn weighted_sum(weights: &[f32], values: &[f32], dst: &mut [f32]) {
    let d = dst.len();
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if d.is_multiple_of(4 * LANES) {
        for c in (0..d).step_by(4 * LANES) {
            // SAFETY: columns c..c + 32 of every value row and of dst are in bounds.
            unsafe { avx2::weighted_sum_32(weights, values.as_ptr().add(c), d, &mut dst[c..]) };
        }
        return;
    }
    for (&p, value) in weights.iter().zip(values.chunks_exact(d)) {
        for (o, &x) in dst.iter_mut().zip(value) {
            *o += p * x;
        }
    }
}

/// Softmax over the last dimension of scores laid out as rows of `len` queries (repeated
/// for every head), where query `i` sits at position `first + i` and sees keys
/// `0..=first + i`; scores are multiplied by `scale` first.
struct CausalSoftmax {
    scale: f32,
    first: usize,
    len: usize,
}

impl CausalSoftmax {
    fn visible(&self, row: usize, keys: usize) -> usize {
        (self.first + row % self.len + 1).min(keys)
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
            mask[i * keys + self.visible(i, keys)..(i + 1) * keys].fill(f32::NEG_INFINITY);
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
        candle_core::utils::barrier_pool().execute_chunked(rows, |range| {
            for r in range {
                // SAFETY: rows are disjoint slices of `data`, each visited by one task.
                let row = unsafe {
                    std::slice::from_raw_parts_mut((ptr as *mut f32).add(r * keys), keys)
                };
                let (seen, hidden) = row.split_at_mut(self.visible(r, keys));
                softmax_in_place(seen, self.scale);
                hidden.fill(0.0);
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

/// `x <- softmax(x * scale)`, in three passes the compiler vectorises (max, exp, scale).
pub(crate) fn softmax_in_place(x: &mut [f32], scale: f32) {
    let max = lanes_fold(x, f32::NEG_INFINITY, f32::max);
    exp_shifted_in_place(x, max, scale);
    let inv = 1.0 / lanes_fold(x, 0.0, |a, b| a + b);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

const LANES: usize = 8;

/// A reduction kept in eight independent lanes so that it maps onto SIMD registers.
#[inline(always)]
fn lanes_fold(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    let acc = chunks.fold([init; LANES], |mut acc, c| {
        for i in 0..LANES {
            acc[i] = f(acc[i], c[i]);
        }
        acc
    });
    tail.iter().chain(acc.iter()).fold(init, |a, &b| f(a, b))
}

/// e^x for x <= 0 (softmax arguments), relative error below 6e-7; written so that the
/// compiler vectorises it: x = n ln 2 + y with integer n, e^y by its Taylor polynomial.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two (Cody-Waite) so that x - n ln 2 is exact enough.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding then subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    // Plain comparisons (not f32::max, whose NaN rules block vectorisation); below -87
    // the result is under f32's normal range and is flushed to e^-87.
    let x = if x < -87.0 { -87.0 } else { x };
    let r = x * LOG2E + ROUND;
    let n = r - ROUND;
    // The integer n sits in the low mantissa bits of r.
    let n_int = r.to_bits() as i32 - ROUND.to_bits() as i32;
    let y = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + y * (1.0
            + y * (0.5
                + y * (1.0 / 6.0 + y * (1.0 / 24.0 + y * (1.0 / 120.0 + y * (1.0 / 720.0))))));
    f32::from_bits(((n_int + 127) as u32) << 23) * p
}

/// Applies [`exp`] to `(v - max) * scale` in place.
fn exp_shifted_in_place(x: &mut [f32], max: f32, scale: f32) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    let x = {
        let mut chunks = x.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            // SAFETY: the chunk holds exactly eight f32; AVX2 and FMA are compiled in.
            unsafe { avx2::exp_shifted_8(chunk.as_mut_ptr(), max, scale) };
        }
        chunks.into_remainder()
    };
    for v in x {
        *v = exp((*v - max) * scale);
    }
}

/// [`exp`] on eight lanes with AVX2/FMA intrinsics, the same steps and constants.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    /// Dot products of `q` (a multiple of 8 values) with `N` consecutive rows of the same
    /// length at `k`: `q` is read once per group of rows. Each product sums in the same
    /// order whatever `N`.
    ///
    /// # Safety
    /// `k` must point to `N * q.len()` readable f32.
    #[inline(always)]
    pub(super) unsafe fn dots<const N: usize>(q: &[f32], k: *const f32) -> [f32; N] {
        // SAFETY: loads stay inside q and the caller's N rows.
        unsafe {
            let d = q.len();
            let mut acc = [_mm256_setzero_ps(); N];
            for c in (0..d).step_by(8) {
                let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(r * d + c)), *a);
                }
            }
            acc.map(|a| {
                let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
            })
        }
    }

    /// Columns `0..32` of `dst += sum_j w[j] * v[j]`, rows of `v` `stride` apart, with
    /// the 32 sums held in registers.
    ///
    /// # Safety
    /// `v` must point to `w.len()` rows of at least 32 readable f32, `stride` apart.
    #[inline(always)]
    pub(super) unsafe fn weighted_sum_32(w: &[f32], v: *const f32, stride: usize, dst: &mut [f32]) {
        // SAFETY: loads stay inside the caller's rows; dst holds at least 32 values.
        unsafe {
            assert!(dst.len() >= 32);
            let o = dst.as_mut_ptr();
            let mut acc = [
                _mm256_loadu_ps(o),
                _mm256_loadu_ps(o.add(8)),
                _mm256_loadu_ps(o.add(16)),
                _mm256_loadu_ps(o.add(24)),
            ];
            for (j, &p) in w.iter().enumerate() {
                let pv = _mm256_set1_ps(p);
                let row = v.add(j * stride);
                for (c, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(pv, _mm256_loadu_ps(row.add(8 * c)), *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(8 * c), *a);
            }
        }
    }

    /// # Safety
    /// `p` must point to eight readable and writable f32.
    #[inline(always)]
    pub(super) unsafe fn exp_shifted_8(p: *mut f32, max: f32, scale: f32) {
        // SAFETY: the caller guarantees eight f32 at `p`; the intrinsics only need AVX2/FMA.
        unsafe {
            let v = _mm256_loadu_ps(p);
            let x = _mm256_mul_ps(_mm256_sub_ps(v, _mm256_set1_ps(max)), _mm256_set1_ps(scale));
            let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
            let round = _mm256_set1_ps(12_582_912.0);
            let r = _mm256_fmadd_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), round);
            let n = _mm256_sub_ps(r, round);
            let n_int = _mm256_sub_epi32(_mm256_castps_si256(r), _mm256_castps_si256(round));
            let y = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
            let y = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), y);
            let mut q = _mm256_set1_ps(1.0 / 720.0);
            for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
                q = _mm256_fmadd_ps(q, y, _mm256_set1_ps(c));
            }
            let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n_int, _mm256_set1_epi32(127)));
            _mm256_storeu_ps(p, _mm256_mul_ps(q, _mm256_castsi256_ps(pow2)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain f64 attention of query rows at positions offset.. against a cache.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: (usize, usize, usize, usize),
        offset: usize,
    ) -> Vec<f64> {
        let (n_head, n_kv, t, d) = dims;
        let keys = offset + t;
        let mut out = vec![0f64; n_head * t * d];
        for h in 0..n_head {
            let kv = h / (n_head / n_kv);
            for r in 0..t {
                let seen = offset + r + 1;
                let qr = &q[(h * t + r) * d..(h * t + r + 1) * d];
                let s: Vec<f64> = (0..seen)
                    .map(|j| {
                        let kj = &k[(kv * keys + j) * d..(kv * keys + j + 1) * d];
                        qr.iter()
                            .zip(kj)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for c in 0..d {
                        out[(h * t + r) * d + c] += p / z * f64::from(v[(kv * keys + j) * d + c]);
                    }
                }
            }
        }
        out
    }

    /// Few query rows (the decode path) and many (the blocked matmul path) both agree with
    /// plain attention, on caches that are views of longer buffers; a row's result is the
    /// same bit for bit whether it comes alone or with other rows.
    #[test]
    fn few_and_many_rows_agree_with_plain_attention() {
        let (n_head, n_kv, d) = (6, 2, 64);
        let mut seed = 99u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        };
        let dev = candle_core::Device::Cpu;
        for (offset, t) in [
            (0, 1),
            (37, 1),
            (40, 5),
            (3, 9),
            (200, 15),
            (50, 16),
            (130, 40),
        ] {
            let keys = offset + t;
            let q: Vec<f32> = (0..n_head * t * d).map(|_| next()).collect();
            let k: Vec<f32> = (0..n_kv * keys * d).map(|_| next()).collect();
            let v: Vec<f32> = (0..n_kv * keys * d).map(|_| next()).collect();
            // The cache as the model holds it: a buffer with room beyond `keys`, narrowed.
            let room = |x: &[f32]| -> Tensor {
                let full =
                    Tensor::zeros((1, n_kv, keys + 7, d), candle_core::DType::F32, &dev).unwrap();
                let part = Tensor::from_slice(x, (1, n_kv, keys, d), &dev).unwrap();
                full.slice_set(&part, 2, 0).unwrap();
                full.narrow(2, 0, keys).unwrap()
            };
            let (kt, vt) = (room(&k), room(&v));
            let qt = Tensor::from_slice(&q, (1, n_head, t, d), &dev).unwrap();
            let got: Vec<f32> = causal_attention(&qt, &kt, &vt, offset)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let want = reference(&q, &k, &v, (n_head, n_kv, t, d), offset);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() < 1e-5,
                    "offset {offset}, t {t}, value {i}: {g} vs {w}"
                );
            }
            if t < FEW_ROWS {
                // The last row alone, after the others: the same bits.
                let last = qt.narrow(2, t - 1, 1).unwrap();
                let alone: Vec<f32> = causal_attention(&last, &kt, &vt, offset + t - 1)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                for h in 0..n_head {
                    let row = &got[(h * t + t - 1) * d..(h * t + t) * d];
                    let one = &alone[h * d..(h + 1) * d];
                    assert!(
                        row.iter().zip(one).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "head {h}"
                    );
                }
            }
        }
    }

    #[test]
    fn exp_is_accurate_over_softmax_range() {
        for i in 0..17_400 {
            let x = -(i as f32) * 0.005;
            let (got, want) = (exp(x), x.exp());
            assert!(
                (got - want).abs() <= 6e-7 * want + 1e-38,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn vector_and_scalar_paths_agree() {
        let mut x: Vec<f32> = (0..29).map(|i| -(i as f32) * 0.77).collect();
        let want: Vec<f32> = x.iter().map(|&v| exp((v - 0.5) * 0.9)).collect();
        exp_shifted_in_place(&mut x, 0.5, 0.9);
        for (g, w) in x.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w, "{g} vs {w}");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_orders_like_inputs() {
        let mut x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let orig = x.clone();
        softmax_in_place(&mut x, 0.5);
        let sum: f32 = x.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5);
        let m = orig.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let denom: f32 = orig.iter().map(|v| ((v - m) * 0.5).exp()).sum();
        for (p, v) in x.iter().zip(&orig) {
            assert!((p - ((v - m) * 0.5).exp() / denom).abs() < 1e-6);
        }
    }
}

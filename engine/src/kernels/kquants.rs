//! Matrix-vector products on the K-quant formats (Q4_K, Q5_K, Q6_K) for CPU decode,
//! several rows of activations per pass over the weights.
//!
//! Activations are quantized as llama.cpp's `quantize_row_q8_K` does (256 values per block,
//! an f32 scale, sums of each 16 bytes); a super-block's weights are unpacked once into
//! bytes and 16-bit scales and every row's product is summed in integers, then scaled,
//! in the same order whatever the number of rows, so a row's result never depends on the
//! rows beside it.

use super::rows::half_at;
#[cfg(x86_avx2)]
use super::rows::in_groups;

/// Values per super-block.
pub(crate) const QK_K: usize = 256;

/// The K-quant block formats these kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KFormat {
    /// d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles:
    /// w = d sc q - dmin m over 8 sub-blocks of 32.
    Q4K,
    /// As Q4K with a fifth bit per weight (32 bytes of high bits).
    Q5K,
    /// 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed 8-bit scales, d (f16):
    /// w = d sc (q - 32) over 16 sub-blocks of 16.
    Q6K,
}

impl KFormat {
    pub(crate) const fn block_bytes(self) -> usize {
        match self {
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }
}

/// One row of activations in Q8_K form.
pub(crate) struct Q8KRow {
    d: Vec<f32>,
    qs: Vec<i8>,
    /// Sums of each 16 bytes.
    bsums: Vec<i16>,
}

/// Quantizes one row (a whole number of super-blocks) as llama.cpp's `quantize_row_q8_K`:
/// the scale is set by the value of largest magnitude, which maps to -127.
pub(crate) fn quantize_row(x: &[f32]) -> Q8KRow {
    let blocks = x.len() / QK_K;
    let mut row = Q8KRow {
        d: Vec::with_capacity(blocks),
        qs: vec![0; x.len()],
        bsums: Vec::with_capacity(blocks * QK_K / 16),
    };
    for (xs, qs) in x.chunks_exact(QK_K).zip(row.qs.chunks_exact_mut(QK_K)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            row.d.push(0.0);
            row.bsums.extend([0i16; QK_K / 16]);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in qs.iter_mut().zip(xs) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        row.bsums.extend(
            qs.chunks_exact(16)
                .map(|g| g.iter().map(|&q| i16::from(q)).sum::<i16>()),
        );
        row.d.push(1.0 / iscale);
    }
    row
}

/// llama.cpp's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min.
fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// A super-block unpacked: 256 weights as integers (Q6K's already less 32), a scale per
/// 16 weights, and for Q4K/Q5K a min per 32.
pub(crate) struct Unpacked {
    pub(crate) q: [i8; QK_K],
    pub(crate) scales: [i16; QK_K / 16],
    pub(crate) mins: [i16; 8],
    pub(crate) d: f32,
    pub(crate) dmin: f32,
}

pub(crate) fn unpack(format: KFormat, b: &[u8]) -> Unpacked {
    let mut u = Unpacked {
        q: [0; QK_K],
        scales: [0; QK_K / 16],
        mins: [0; 8],
        d: 0.0,
        dmin: 0.0,
    };
    match format {
        KFormat::Q4K | KFormat::Q5K => {
            u.d = half_at(b, 0);
            u.dmin = half_at(b, 2);
            let scales = &b[4..16];
            for j in 0..8 {
                let (sc, m) = scale_min(j, scales);
                u.scales[2 * j] = i16::from(sc);
                u.scales[2 * j + 1] = i16::from(sc);
                u.mins[j] = i16::from(m);
            }
            let (qh, qs) = match format {
                KFormat::Q5K => (Some(&b[16..48]), &b[48..176]),
                _ => (None, &b[16..144]),
            };
            for c in 0..4 {
                for l in 0..32 {
                    let byte = qs[32 * c + l];
                    let (mut lo, mut hi) = (byte & 0x0F, byte >> 4);
                    if let Some(qh) = qh {
                        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    u.q[64 * c + l] = lo as i8;
                    u.q[64 * c + 32 + l] = hi as i8;
                }
            }
        }
        KFormat::Q6K => {
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            u.d = half_at(b, 208);
            for (s, &v) in u.scales.iter_mut().zip(sc) {
                *s = i16::from(v as i8);
            }
            for h in 0..2 {
                let (ql, qh) = (&ql[64 * h..], &qh[32 * h..]);
                for l in 0..32 {
                    let q =
                        |low: u8, shift: u32| ((low | (((qh[l] >> shift) & 3) << 4)) as i8) - 32;
                    u.q[128 * h + l] = q(ql[l] & 0x0F, 0);
                    u.q[128 * h + 32 + l] = q(ql[l + 32] & 0x0F, 2);
                    u.q[128 * h + 64 + l] = q(ql[l] >> 4, 4);
                    u.q[128 * h + 96 + l] = q(ql[l + 32] >> 4, 6);
                }
            }
        }
    }
    u
}

/// The reference product of one weight row with one row of activations: per super-block,
/// d dy Σ sc Σ q y - dmin dy Σ m Σ y.
#[cfg_attr(x86_avx2, allow(dead_code))]
pub(crate) fn dot_scalar(format: KFormat, w: &[u8], x: &Q8KRow) -> f32 {
    let mut sum = 0f32;
    for (b, block) in w.chunks_exact(format.block_bytes()).enumerate() {
        let u = unpack(format, block);
        let y = &x.qs[b * QK_K..(b + 1) * QK_K];
        let mut sumi = 0i32;
        for g in 0..QK_K / 16 {
            let s: i32 = (0..16)
                .map(|l| i32::from(u.q[16 * g + l]) * i32::from(y[16 * g + l]))
                .sum();
            sumi += i32::from(u.scales[g]) * s;
        }
        let bs = &x.bsums[b * 16..(b + 1) * 16];
        let mins: i32 = (0..8)
            .map(|j| i32::from(u.mins[j]) * (i32::from(bs[2 * j]) + i32::from(bs[2 * j + 1])))
            .sum();
        sum += u.d * x.d[b] * sumi as f32 - u.dmin * x.d[b] * mins as f32;
    }
    sum
}

/// Dot products of one weight row with several rows of activations into `out`, each row
/// summed exactly as it would be alone.
pub(crate) fn dots(format: KFormat, w: &[u8], xs: &[&Q8KRow], out: &mut [f32]) {
    #[cfg(x86_avx2)]
    in_groups(xs, out, |x, o| {
        // SAFETY: the features are compiled in; `w` holds whole blocks and every row of
        // `x` as many super-blocks (checked by the caller's shapes).
        unsafe {
            match format {
                KFormat::Q4K => avx2::dots_of::<{ avx2::Q4K }>(w, x, o),
                KFormat::Q5K => avx2::dots_of::<{ avx2::Q5K }>(w, x, o),
                KFormat::Q6K => avx2::dots_of::<{ avx2::Q6K }>(w, x, o),
            }
        }
    });
    #[cfg(not(x86_avx2))]
    for (o, x) in out.iter_mut().zip(xs) {
        *o = dot_scalar(format, w, x);
    }
}

#[cfg(x86_avx2)]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::blocks::avx2::{hsum, prefetch};
    use super::{half_at, scale_min, KFormat, Q8KRow, QK_K};

    /// The formats, as const parameters: each gets its own kernel.
    pub(super) const Q4K: u8 = 0;
    pub(super) const Q5K: u8 = 1;
    pub(super) const Q6K: u8 = 2;

    const fn format(f: u8) -> KFormat {
        match f {
            Q4K => KFormat::Q4K,
            Q5K => KFormat::Q5K,
            _ => KFormat::Q6K,
        }
    }

    /// Weights of format `F` times up to four rows of activations.
    ///
    /// # Safety
    /// As [`dots`], with `xs.len()` rows, at most four.
    #[inline]
    pub(super) unsafe fn dots_of<const F: u8>(w: &[u8], xs: &[&Q8KRow], out: &mut [f32]) {
        // SAFETY: as this function's.
        unsafe {
            match xs.len() {
                4 => dots::<F, 4>(w, xs, out),
                3 => dots::<F, 3>(w, xs, out),
                2 => dots::<F, 2>(w, xs, out),
                _ => dots::<F, 1>(w, xs, out),
            }
        }
    }

    /// A super-block in registers: eight runs of 32 weights (signed bytes), the 16-bit
    /// scale of each of their 16 pairs' halves, and the mins (16-bit lanes 2j and 2j + 1:
    /// sub-block j's, beside the activations' sums of its two halves of 16).
    struct Block {
        q: [__m256i; 8],
        scales: [__m256i; 8],
        mins: __m256i,
        d: f32,
        dmin: f32,
    }

    /// Two scales, the first for lanes 0-7 (bytes 0-15), the second for lanes 8-15.
    #[inline(always)]
    fn scale_pair(a: i16, b: i16) -> __m256i {
        // SAFETY: AVX2 is compiled in (this module exists only then).
        unsafe { _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a)) }
    }

    /// Bytes of `v` shifted right by `n` (0-7) within each 16-bit lane, masked to `mask`.
    #[inline(always)]
    fn bits(v: __m256i, n: i32, mask: i8) -> __m256i {
        // SAFETY: AVX2 is compiled in.
        unsafe {
            _mm256_and_si256(
                _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)),
                _mm256_set1_epi8(mask),
            )
        }
    }

    /// The sum of eight 32-bit lanes.
    #[inline(always)]
    fn hsum_i32(v: __m256i) -> i32 {
        // SAFETY: AVX2 is compiled in.
        unsafe {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
        }
    }

    /// # Safety
    /// `b` holds a whole block of `format`.
    #[inline(always)]
    unsafe fn unpack(format: KFormat, b: &[u8]) -> Block {
        // SAFETY: every load reads inside the block (sizes in `KFormat::block_bytes`).
        unsafe {
            let zero = _mm256_setzero_si256();
            let mut k = Block {
                q: [zero; 8],
                scales: [zero; 8],
                mins: zero,
                d: 0.0,
                dmin: 0.0,
            };
            match format {
                KFormat::Q4K | KFormat::Q5K => {
                    k.d = half_at(b, 0);
                    k.dmin = half_at(b, 2);
                    let mut mins = [0i16; 16];
                    for j in 0..8 {
                        let (sc, m) = scale_min(j, &b[4..16]);
                        k.scales[j] = _mm256_set1_epi16(i16::from(sc));
                        mins[2 * j] = i16::from(m);
                        mins[2 * j + 1] = i16::from(m);
                    }
                    k.mins = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
                    let (qh, qs) = match format {
                        KFormat::Q5K => (
                            Some(_mm256_loadu_si256(b.as_ptr().add(16) as *const __m256i)),
                            b.as_ptr().add(48),
                        ),
                        _ => (None, b.as_ptr().add(16)),
                    };
                    for c in 0..4 {
                        let raw = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
                        let mut lo = bits(raw, 0, 0x0F);
                        let mut hi = bits(raw, 4, 0x0F);
                        if let Some(qh) = qh {
                            let c = c as i32;
                            lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(bits(qh, 2 * c, 1)));
                            hi =
                                _mm256_or_si256(hi, _mm256_slli_epi16::<4>(bits(qh, 2 * c + 1, 1)));
                        }
                        k.q[2 * c] = lo;
                        k.q[2 * c + 1] = hi;
                    }
                }
                KFormat::Q6K => {
                    k.d = half_at(b, 208);
                    let sc = |i: usize| i16::from(b[192 + i] as i8);
                    let off = _mm256_set1_epi8(32);
                    for h in 0..2 {
                        let ql = b.as_ptr().add(64 * h);
                        let l0 = _mm256_loadu_si256(ql as *const __m256i);
                        let l1 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                        let qh = _mm256_loadu_si256(b.as_ptr().add(128 + 32 * h) as *const __m256i);
                        let parts = [
                            (bits(l0, 0, 0x0F), 0),
                            (bits(l1, 0, 0x0F), 2),
                            (bits(l0, 4, 0x0F), 4),
                            (bits(l1, 4, 0x0F), 6),
                        ];
                        for (i, (low, shift)) in parts.into_iter().enumerate() {
                            let high = _mm256_slli_epi16::<4>(bits(qh, shift, 3));
                            k.q[4 * h + i] = _mm256_sub_epi8(_mm256_or_si256(low, high), off);
                            let s = 8 * h + 2 * i;
                            k.scales[4 * h + i] = scale_pair(sc(s), sc(s + 1));
                        }
                    }
                }
            }
            k
        }
    }

    /// # Safety
    /// `w` holds whole blocks of format `F`, every row of `xs` at least as many
    /// super-blocks, and `xs` and `out` have `N` entries.
    #[inline(always)]
    unsafe fn dots<const F: u8, const N: usize>(w: &[u8], xs: &[&Q8KRow], out: &mut [f32]) {
        let format = format(F);
        // SAFETY: loads read 32 of a row's 256 bytes per super-block at offsets below 256.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            let mut mins = [0f32; N];
            let signed = format == KFormat::Q6K;
            let ahead = crate::kernels::prefetch::ahead();
            for (b, block) in w.chunks_exact(format.block_bytes()).enumerate() {
                for line in (0..format.block_bytes()).step_by(64) {
                    prefetch(block.as_ptr().wrapping_add(line), ahead);
                }
                let k = unpack(format, block);
                // Q6K's weights are signed: the sign moves onto the activations so that
                // the unsigned-by-signed byte product applies.
                let wq = k.q.map(|q| if signed { _mm256_sign_epi8(q, q) } else { q });
                for r in 0..N {
                    let x = xs[r];
                    let y = x.qs.as_ptr().add(b * QK_K);
                    let mut sumi = _mm256_setzero_si256();
                    for (j, (&w, &q)) in wq.iter().zip(&k.q).enumerate() {
                        let mut yq = _mm256_loadu_si256(y.add(32 * j) as *const __m256i);
                        if signed {
                            yq = _mm256_sign_epi8(yq, q);
                        }
                        let pairs = _mm256_maddubs_epi16(w, yq);
                        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, k.scales[j]));
                    }
                    let dy = x.d[b];
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_set1_ps(k.d * dy), _mm256_cvtepi32_ps(sumi), acc[r]);
                    if !signed {
                        // Σ_j min_j × (the sums of sub-block j's two halves): exact in
                        // integers, so the scalar sum's value.
                        let bs = x.bsums[b * 16..b * 16 + 16].as_ptr() as *const __m256i;
                        let m = hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256(bs), k.mins));
                        mins[r] += k.dmin * dy * m as f32;
                    }
                }
            }
            for r in 0..N {
                out[r] = hsum(acc[r]) - mins[r];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(count: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..count)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// The unpacked weights times their scales are candle's (llama.cpp's) dequantized
    /// values, for each format.
    #[test]
    fn unpacking_gives_the_dequantized_weights() {
        use candle_core::quantized::{GgmlDType, QTensor};
        use candle_core::{Device, Tensor};
        for (format, dtype) in [
            (KFormat::Q4K, GgmlDType::Q4K),
            (KFormat::Q5K, GgmlDType::Q5K),
            (KFormat::Q6K, GgmlDType::Q6K),
        ] {
            let w = Tensor::from_vec(values(2 * QK_K, 5), (2, QK_K), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, dtype).unwrap();
            let dense: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let data = q.data().unwrap();
            for (b, block) in data.chunks_exact(format.block_bytes()).enumerate() {
                let u = unpack(format, block);
                for i in 0..QK_K {
                    let v = u.d * f32::from(u.scales[i / 16]) * f32::from(u.q[i])
                        - u.dmin * f32::from(u.mins[i / 32]);
                    let want = dense[b * QK_K + i];
                    assert!(
                        (v - want).abs() <= 1e-6 * want.abs().max(1e-3),
                        "{format:?} block {b} weight {i}: {v} vs {want}"
                    );
                }
            }
        }
    }

    /// The quantized activations and their block sums restore the row within half a step.
    #[test]
    fn activations_round_trip() {
        let x = values(3 * QK_K, 9);
        let q = quantize_row(&x);
        for (i, &v) in x.iter().enumerate() {
            let d = q.d[i / QK_K];
            assert!((d * f32::from(q.qs[i]) - v).abs() <= d.abs() * 0.5 + 1e-7);
        }
        for (g, &s) in q.bsums.iter().enumerate() {
            let want: i16 = q.qs[16 * g..16 * g + 16]
                .iter()
                .map(|&v| i16::from(v))
                .sum();
            assert_eq!(s, want);
        }
        let zero = quantize_row(&[0.0; QK_K]);
        assert_eq!(zero.d, [0.0]);
        assert!(zero.qs.iter().all(|&v| v == 0));
    }
}

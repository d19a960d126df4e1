//! Softmax over attention scores, shared by the matmul path ([`super::attention`]) and
//! the cache path ([`super::cache_attention`]), so both sum in one order: an `exp` the
//! compiler vectorises (with an AVX2/FMA twin of the same steps) and lane-wise reductions.

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
    #[cfg(x86_avx2)]
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
#[cfg(x86_avx2)]
mod avx2 {
    use std::arch::x86_64::*;

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

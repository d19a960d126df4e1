//! Matrix-vector products on Q4_1 and Q5_0 weights for CPU decode. candle runs both with
//! scalar code only; these kernels are llama.cpp's: activations quantized to 8-bit blocks
//! (Q8_1 for Q4_1, Q8_0 for Q5_0: the same bytes and scale, Q8_1 adds their sum), products
//! summed in integers with AVX2 where the build has it, so decode reads the file's 20 or
//! 22 bytes per 32 weights and rounds as llama.cpp does.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use half::f16;

const QK: usize = 32;
/// Output rows per parallel work item.
const ROWS_PER_TASK: usize = 32;

/// The block formats these kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// d (f16), m (f16), 16 bytes of nibbles: w = d q + m.
    Q4_1,
    /// d (f16), 4 bytes of fifth bits, 16 bytes of nibbles: w = d (q - 16).
    Q5_0,
}

impl Format {
    const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
        }
    }
}

/// A (n, k) weight matrix of Q4_1 or Q5_0 blocks, rows of k/32 blocks.
pub(crate) struct BlockMatrix {
    format: Format,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

/// One row of activations in Q8_1 form.
struct Q8_1Row {
    d: Vec<f32>,
    s: Vec<f32>,
    qs: Vec<i8>,
}

impl BlockMatrix {
    pub(crate) fn new(format: Format, n: usize, k: usize, data: Vec<u8>) -> Option<Self> {
        let whole = data.len() == n * k / QK * format.block_bytes();
        (k.is_multiple_of(QK) && whole).then_some(Self { format, n, k, data })
    }

    fn row(&self, i: usize) -> &[u8] {
        let bytes = self.k / QK * self.format.block_bytes();
        &self.data[i * bytes..(i + 1) * bytes]
    }
}

/// Quantizes one row the way llama.cpp's AVX2 `quantize_row_q8_1` does.
fn quantize_q8_1(x: &[f32]) -> Q8_1Row {
    let blocks = x.len() / QK;
    let mut row = Q8_1Row {
        d: Vec::with_capacity(blocks),
        s: Vec::with_capacity(blocks),
        qs: vec![0; x.len()],
    };
    for (xs, qs) in x.chunks_exact(QK).zip(row.qs.chunks_exact_mut(QK)) {
        let xs: &[f32; QK] = xs.try_into().expect("a whole block");
        let qs: &mut [i8; QK] = qs.try_into().expect("a whole block");
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        // SAFETY: the features are compiled in.
        let (d, sum) = unsafe { avx2::quantize_block(xs, qs) };
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        )))]
        let (d, sum) = quantize_block(xs, qs);
        row.d.push(f16::from_f32(d).to_f32());
        row.s.push(f16::from_f32(d * sum as f32).to_f32());
    }
    row
}

/// One block of 32 activations as bytes: the scale d (largest magnitude / 127) and the
/// sum of the bytes.
#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ),
    allow(dead_code)
)]
fn quantize_block(xs: &[f32; QK], qs: &mut [i8; QK]) -> (f32, i32) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(xs) {
        *q = (v * id).round_ties_even() as i8;
        sum += i32::from(*q);
    }
    (d, sum)
}

fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Dot product of a weight row with a row of activations (the kernel uses it for single
/// rows).
#[cfg(test)]
fn dot(format: Format, w: &[u8], x: &Q8_1Row) -> f32 {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the features are compiled in; lengths agree by construction.
        unsafe {
            match format {
                Format::Q4_1 => avx2::dot(w, x),
                Format::Q5_0 => avx2::dot_q5_0(w, x),
            }
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    dot_scalar(format, w, x)
}

/// Dot products of one Q4_1 row with several Q8_1 rows: the weights are read and
/// unpacked once per group of rows, and each row's sum is computed in exactly the order
/// of a single product, so a result never depends on the other rows.
fn dots(format: Format, w: &[u8], xs: &[&Q8_1Row], out: &mut [f32]) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        let mut at = 0;
        while at < xs.len() {
            let n = (xs.len() - at).min(avx2::GROUP);
            let (x, o) = (&xs[at..at + n], &mut out[at..at + n]);
            // SAFETY: the features are compiled in; lengths agree by construction.
            unsafe {
                match (format, n) {
                    (Format::Q4_1, 4) => avx2::dots::<4>(w, x, o),
                    (Format::Q4_1, 3) => avx2::dots::<3>(w, x, o),
                    (Format::Q4_1, 2) => avx2::dots::<2>(w, x, o),
                    // One row (decode): the plain product, a little faster.
                    (Format::Q4_1, _) => o[0] = avx2::dot(w, x[0]),
                    (Format::Q5_0, 4) => avx2::dots_q5_0::<4>(w, x, o),
                    (Format::Q5_0, 3) => avx2::dots_q5_0::<3>(w, x, o),
                    (Format::Q5_0, 2) => avx2::dots_q5_0::<2>(w, x, o),
                    (Format::Q5_0, _) => o[0] = avx2::dot_q5_0(w, x[0]),
                }
            }
            at += n;
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    for (o, x) in out.iter_mut().zip(xs) {
        *o = dot_scalar(format, w, x);
    }
}

#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ),
    allow(dead_code)
)]
fn dot_scalar(format: Format, w: &[u8], x: &Q8_1Row) -> f32 {
    if format == Format::Q5_0 {
        return dot_scalar_q5_0(w, x);
    }
    let mut sum = 0f32;
    for (b, block) in w.chunks_exact(Format::Q4_1.block_bytes()).enumerate() {
        let (d, m) = (half_at(block, 0), half_at(block, 2));
        let qs = &x.qs[b * QK..(b + 1) * QK];
        let mut acc = 0i32;
        for j in 0..QK / 2 {
            let byte = block[4 + j];
            acc += i32::from(byte & 0x0F) * i32::from(qs[j]);
            acc += i32::from(byte >> 4) * i32::from(qs[j + QK / 2]);
        }
        sum += d * x.d[b] * acc as f32 + m * x.s[b];
    }
    sum
}

/// llama.cpp's reference Q5_0 x Q8_0 product: w = d (q - 16), q of five bits, the
/// fifth from the block's 32-bit mask.
#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ),
    allow(dead_code)
)]
fn dot_scalar_q5_0(w: &[u8], x: &Q8_1Row) -> f32 {
    let mut sum = 0f32;
    for (b, block) in w.chunks_exact(Format::Q5_0.block_bytes()).enumerate() {
        let d = half_at(block, 0);
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        let qs = &x.qs[b * QK..(b + 1) * QK];
        let mut acc = 0i32;
        for j in 0..QK / 2 {
            let byte = block[6 + j];
            let high_lo = (((qh >> j) << 4) & 0x10) as u8;
            let high_hi = ((qh >> (j + 12)) & 0x10) as u8;
            let lo = i32::from((byte & 0x0F) | high_lo) - 16;
            let hi = i32::from((byte >> 4) | high_hi) - 16;
            acc += lo * i32::from(qs[j]) + hi * i32::from(qs[j + QK / 2]);
        }
        sum += d * x.d[b] * acc as f32;
    }
    sum
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{half_at, Format, Q8_1Row, QK};

    const BLOCK_BYTES: usize = Format::Q4_1.block_bytes();
    const Q5_0_BYTES: usize = Format::Q5_0.block_bytes();

    /// # Safety
    /// `w` holds whole Q4_1 blocks and `x` at least as many Q8_1 blocks.
    #[inline]
    pub(super) unsafe fn dot(w: &[u8], x: &Q8_1Row) -> f32 {
        // SAFETY: every load reads inside `w` (20-byte blocks) or `x.qs` (32 per block).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0f32;
            let low = _mm256_set1_epi8(0x0F);
            let ones = _mm256_set1_epi16(1);
            for (b, block) in w.chunks_exact(BLOCK_BYTES).enumerate() {
                let d = half_at(block, 0) * x.d[b];
                summs += half_at(block, 2) * x.s[b];
                let packed = _mm_loadu_si128(block.as_ptr().add(4) as *const __m128i);
                let nibbles = _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed);
                let wq = _mm256_and_si256(nibbles, low);
                let xq = _mm256_loadu_si256(x.qs.as_ptr().add(b * QK) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(wq, xq);
                let sums = _mm256_madd_epi16(pairs, ones);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
            }
            hsum(acc) + summs
        }
    }

    /// The sum of eight lanes, in the order every product here uses.
    #[inline(always)]
    fn hsum(acc: __m256) -> f32 {
        // SAFETY: AVX2 is compiled in (this module exists only then).
        unsafe {
            let hi = _mm256_extractf128_ps::<1>(acc);
            let s = _mm_add_ps(_mm256_castps256_ps128(acc), hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// [`super::quantize_block`] eight lanes at a time: the same maximum, products and
    /// rounding (to nearest, ties to even), so the same bytes.
    ///
    /// # Safety
    /// AVX2 must be available (it is compiled in).
    #[inline]
    pub(super) unsafe fn quantize_block(xs: &[f32; QK], qs: &mut [i8; QK]) -> (f32, i32) {
        // SAFETY: four loads of eight inside the 32 values, one store of 32 bytes.
        unsafe {
            let p = xs.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for x in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *x));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            let q = v.map(|x| _mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(x, id))));
            let total =
                _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let t4 = _mm_add_epi32(
                _mm256_castsi256_si128(total),
                _mm256_extracti128_si256::<1>(total),
            );
            let t4 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(t4, _mm_shuffle_epi32::<1>(t4)));
            // Packing works within 128-bit halves; the permute puts the bytes in order.
            let words = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let bytes =
                _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes);
            (d, sum)
        }
    }

    /// A Q5_0 block's 32 weights as signed bytes q - 16 (llama.cpp's unpacking: the
    /// nibbles, with 0xF0 set where the fifth bit is clear).
    ///
    /// # Safety
    /// `block` holds a whole Q5_0 block; AVX2 is compiled in.
    #[inline(always)]
    unsafe fn q5_0_bytes(block: &[u8]) -> __m256i {
        // SAFETY: reads 4 bytes at 2 and 16 bytes at 6 of a 22-byte block.
        unsafe {
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let packed = _mm_loadu_si128(block.as_ptr().add(6) as *const __m128i);
            let nibbles = _mm256_and_si256(
                _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed),
                _mm256_set1_epi8(0x0F),
            );
            // Byte j all ones where bit j of qh is set.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(qh as i32),
                _mm256_set_epi64x(
                    0x0303_0303_0303_0303,
                    0x0202_0202_0202_0202,
                    0x0101_0101_0101_0101,
                    0,
                ),
            );
            let bits = _mm256_cmpeq_epi8(
                _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
                _mm256_set1_epi64x(-1),
            );
            let high = _mm256_andnot_si256(bits, _mm256_set1_epi8(0xF0u8 as i8));
            _mm256_or_si256(nibbles, high)
        }
    }

    /// Eight sums of four products of signed bytes, as floats (llama.cpp's
    /// `mul_sum_i8_pairs_float`).
    #[inline(always)]
    fn mul_sum_i8(w: __m256i, x: __m256i) -> __m256 {
        // SAFETY: AVX2 is compiled in (this module exists only then).
        unsafe {
            let ax = _mm256_sign_epi8(w, w);
            let sy = _mm256_sign_epi8(x, w);
            let pairs = _mm256_maddubs_epi16(ax, sy);
            _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    /// # Safety
    /// `w` holds whole Q5_0 blocks and `x` at least as many 8-bit blocks.
    #[inline]
    pub(super) unsafe fn dot_q5_0(w: &[u8], x: &Q8_1Row) -> f32 {
        // SAFETY: every load reads inside `w` (22-byte blocks) or `x.qs` (32 per block).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for (b, block) in w.chunks_exact(Q5_0_BYTES).enumerate() {
                let d = half_at(block, 0) * x.d[b];
                let xq = _mm256_loadu_si256(x.qs.as_ptr().add(b * QK) as *const __m256i);
                let q = mul_sum_i8(q5_0_bytes(block), xq);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), q, acc);
            }
            hsum(acc)
        }
    }

    /// [`dot_q5_0`] for `N` rows of activations at once, each summed in its order.
    ///
    /// # Safety
    /// As [`dots`], with Q5_0 blocks.
    #[inline]
    pub(super) unsafe fn dots_q5_0<const N: usize>(w: &[u8], xs: &[&Q8_1Row], out: &mut [f32]) {
        // SAFETY: every load reads inside `w` (22-byte blocks) or `x.qs` (32 per block).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            for (b, block) in w.chunks_exact(Q5_0_BYTES).enumerate() {
                let wd = half_at(block, 0);
                let wq = q5_0_bytes(block);
                for r in 0..N {
                    let x = xs[r];
                    let xq = _mm256_loadu_si256(x.qs.as_ptr().add(b * QK) as *const __m256i);
                    let q = mul_sum_i8(wq, xq);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * x.d[b]), q, acc[r]);
                }
            }
            for r in 0..N {
                out[r] = hsum(acc[r]);
            }
        }
    }

    /// Rows of activations sharing one pass over a weight row.
    pub(super) const GROUP: usize = 4;

    /// # Safety
    /// `w` holds whole Q4_1 blocks, every row of `xs` at least as many Q8_1 blocks, and
    /// `xs` and `out` have `N` entries.
    #[inline]
    pub(super) unsafe fn dots<const N: usize>(w: &[u8], xs: &[&Q8_1Row], out: &mut [f32]) {
        // SAFETY: every load reads inside `w` (20-byte blocks) or `x.qs` (32 per block).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            let mut summs = [0f32; N];
            let low = _mm256_set1_epi8(0x0F);
            let ones = _mm256_set1_epi16(1);
            for (b, block) in w.chunks_exact(BLOCK_BYTES).enumerate() {
                let (wd, wm) = (half_at(block, 0), half_at(block, 2));
                let packed = _mm_loadu_si128(block.as_ptr().add(4) as *const __m128i);
                let nibbles = _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed);
                let wq = _mm256_and_si256(nibbles, low);
                for r in 0..N {
                    let x = xs[r];
                    let d = wd * x.d[b];
                    summs[r] += wm * x.s[b];
                    let xq = _mm256_loadu_si256(x.qs.as_ptr().add(b * QK) as *const __m256i);
                    let pairs = _mm256_maddubs_epi16(wq, xq);
                    let sums = _mm256_madd_epi16(pairs, ones);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc[r]);
                }
            }
            for r in 0..N {
                out[r] = hsum(acc[r]) + summs[r];
            }
        }
    }
}

impl CustomOp1 for BlockMatrix {
    fn name(&self) -> &'static str {
        match self.format {
            Format::Q4_1 => "q4_1-matmul",
            Format::Q5_0 => "q5_0-matmul",
        }
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("q4_1-matmul expects f32 input")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("q4_1-matmul expects a contiguous input")
        };
        let dims = layout.dims();
        if dims.last() != Some(&self.k) {
            candle_core::bail!("q4_1-matmul: input {dims:?} does not end in {}", self.k)
        }
        let quantized: Vec<Q8_1Row> = data[start..end]
            .chunks_exact(self.k)
            .map(quantize_q8_1)
            .collect();
        let rows: Vec<&Q8_1Row> = quantized.iter().collect();
        let m = rows.len();
        // Output laid out row-major (m, n); work split over the n output columns.
        let mut out_t = vec![0f32; self.n * m];
        let out_ptr = out_t.as_mut_ptr() as usize;
        // candle's own pool: one set of engine threads, no second pool competing for cores.
        super::pool::for_chunks(self.n.div_ceil(ROWS_PER_TASK), |tasks| {
            for task in tasks {
                for j in task * ROWS_PER_TASK..self.n.min((task + 1) * ROWS_PER_TASK) {
                    // SAFETY: each output row j (m cells) is written by exactly one
                    // task, inside the n * m buffer that outlives the pool call.
                    let cells = unsafe {
                        std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(j * m), m)
                    };
                    dots(self.format, self.row(j), &rows, cells);
                }
            }
        });
        let out = if m == 1 {
            out_t
        } else {
            let mut out = vec![0f32; m * self.n];
            for (j, cols) in out_t.chunks_exact(m).enumerate() {
                for (i, v) in cols.iter().enumerate() {
                    out[i * self.n + j] = *v;
                }
            }
            out
        };
        let mut shape = dims.to_vec();
        *shape.last_mut().expect("rank >= 1") = self.n;
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random Q4_1 blocks and activations: the SIMD path (when built) equals the scalar
    /// one, and both approximate the f32 product of the dequantized weights.
    #[test]
    fn dot_matches_scalar_and_dequantized_product() {
        let k = 96;
        let mut seed = 12345u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed >> 8
        };
        let mut w = Vec::new();
        let mut dense = Vec::new();
        for _ in 0..k / QK {
            let d = f16::from_f32(0.01 + (next() % 100) as f32 * 1e-4);
            let m = f16::from_f32(-0.05 - (next() % 100) as f32 * 1e-4);
            let qs: Vec<u8> = (0..QK / 2).map(|_| (next() & 0xFF) as u8).collect();
            w.extend_from_slice(&d.to_le_bytes());
            w.extend_from_slice(&m.to_le_bytes());
            w.extend_from_slice(&qs);
            let mut block = [0f32; QK];
            for j in 0..QK / 2 {
                block[j] = d.to_f32() * f32::from(qs[j] & 0x0F) + m.to_f32();
                block[j + QK / 2] = d.to_f32() * f32::from(qs[j] >> 4) + m.to_f32();
            }
            dense.extend_from_slice(&block);
        }
        let x: Vec<f32> = (0..k)
            .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let q = quantize_q8_1(&x);
        let exact: f32 = dense.iter().zip(&x).map(|(a, b)| a * b).sum();
        let (fast, slow) = (dot(Format::Q4_1, &w, &q), dot_scalar(Format::Q4_1, &w, &q));
        assert!(
            (fast - slow).abs() <= 1e-4 * slow.abs().max(1.0),
            "{fast} vs {slow}"
        );
        assert!(
            (fast - exact).abs() <= 0.02 * exact.abs().max(1.0),
            "{fast} vs {exact}"
        );
    }

    /// The vector quantizer (when built) gives the scalar one's bytes, scale and sum,
    /// including halfway values that round to even and an all-zero block.
    #[test]
    fn block_quantizer_matches_scalar() {
        let mut seed = 4242u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed >> 8
        };
        let mut blocks: Vec<[f32; QK]> = (0..200)
            .map(|_| std::array::from_fn(|_| (next() % 20_001) as f32 / 1000.0 - 10.0))
            .collect();
        // 127 / 127 scaling keeps the values: halves land exactly between integers.
        blocks.push(std::array::from_fn(|i| {
            if i == 0 {
                127.0
            } else {
                i as f32 - 16.5
            }
        }));
        blocks.push([0.0; QK]);
        for (i, xs) in blocks.iter().enumerate() {
            let (mut want, mut got) = ([0i8; QK], [0i8; QK]);
            let (d, sum) = quantize_block(xs, &mut want);
            let row = quantize_q8_1(xs);
            got.copy_from_slice(&row.qs);
            assert_eq!(got, want, "block {i}");
            assert_eq!(row.d[0].to_bits(), f16::from_f32(d).to_f32().to_bits());
            assert_eq!(
                row.s[0].to_bits(),
                f16::from_f32(d * sum as f32).to_f32().to_bits()
            );
        }
    }

    /// Products with several rows at once equal one-row products bit for bit, whatever
    /// the number of rows (groups of four and the remainders).
    #[test]
    fn grouped_products_equal_single_products_exactly() {
        let k = 128;
        let mut seed = 777u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed >> 8
        };
        let mut w = Vec::new();
        for _ in 0..k / QK {
            w.extend_from_slice(&f16::from_f32(0.02 + (next() % 50) as f32 * 1e-4).to_le_bytes());
            w.extend_from_slice(&f16::from_f32(-0.1 + (next() % 50) as f32 * 1e-3).to_le_bytes());
            w.extend((0..QK / 2).map(|_| (next() & 0xFF) as u8));
        }
        let rows: Vec<Q8_1Row> = (0..11)
            .map(|_| {
                let x: Vec<f32> = (0..k)
                    .map(|_| (next() % 4000) as f32 / 997.0 - 2.0)
                    .collect();
                quantize_q8_1(&x)
            })
            .collect();
        each_row_alone(Format::Q4_1, &w, &rows);
    }

    /// Products with the first 1, 2, … of `rows` at once equal one-row products bit for
    /// bit, whatever the number of rows (groups of four and the remainders).
    fn each_row_alone(format: Format, w: &[u8], rows: &[Q8_1Row]) {
        for m in 1..=rows.len() {
            let refs: Vec<&Q8_1Row> = rows[..m].iter().collect();
            let mut out = vec![0f32; m];
            dots(format, w, &refs, &mut out);
            for (i, x) in rows[..m].iter().enumerate() {
                assert_eq!(
                    out[i].to_bits(),
                    dot(format, w, x).to_bits(),
                    "{format:?}: {m} rows, row {i}"
                );
            }
        }
    }

    /// Random Q5_0 blocks (with `k` weights) and their f32 values.
    fn q5_0_blocks(k: usize, next: &mut impl FnMut() -> u32) -> (Vec<u8>, Vec<f32>) {
        let (mut w, mut dense) = (Vec::new(), Vec::new());
        for _ in 0..k / QK {
            let d = f16::from_f32(0.01 + (next() % 100) as f32 * 1e-4);
            let qh = next() ^ (next() << 16);
            let qs: Vec<u8> = (0..QK / 2).map(|_| (next() & 0xFF) as u8).collect();
            w.extend_from_slice(&d.to_le_bytes());
            w.extend_from_slice(&qh.to_le_bytes());
            w.extend_from_slice(&qs);
            let mut block = [0f32; QK];
            for j in 0..QK / 2 {
                let lo = (qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
                let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                block[j] = d.to_f32() * (lo as f32 - 16.0);
                block[j + QK / 2] = d.to_f32() * (hi as f32 - 16.0);
            }
            dense.extend_from_slice(&block);
        }
        (w, dense)
    }

    /// Q5_0: the SIMD product (when built) equals llama.cpp's scalar reference and
    /// approximates the f32 product of the dequantized weights; products of several rows
    /// equal one-row products bit for bit.
    #[test]
    fn q5_0_products_match_the_reference_and_each_row_alone() {
        let k = 160;
        let mut seed = 9090u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed >> 8
        };
        let (w, dense) = q5_0_blocks(k, &mut next);
        let rows: Vec<Q8_1Row> = (0..11)
            .map(|_| {
                let x: Vec<f32> = (0..k)
                    .map(|_| (next() % 4000) as f32 / 997.0 - 2.0)
                    .collect();
                let exact: f32 = dense.iter().zip(&x).map(|(a, b)| a * b).sum();
                let q = quantize_q8_1(&x);
                let (fast, slow) = (dot(Format::Q5_0, &w, &q), dot_scalar(Format::Q5_0, &w, &q));
                assert!(
                    (fast - slow).abs() <= 1e-4 * slow.abs().max(1.0),
                    "{fast} vs {slow}"
                );
                assert!(
                    (fast - exact).abs() <= 0.02 * exact.abs().max(1.0),
                    "{fast} vs {exact}"
                );
                q
            })
            .collect();
        each_row_alone(Format::Q5_0, &w, &rows);
    }
}

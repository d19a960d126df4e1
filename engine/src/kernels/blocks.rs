//! Matrix-vector products on quantized weights for CPU decode, draft verification and
//! batches: Q4_0, Q4_1, Q5_0 and Q8_0 here (llama.cpp's products: activations quantized
//! to 8-bit blocks, Q8_1 for Q4_1 and Q8_0 for the others, the same bytes and scale with
//! Q8_1 adding their sum; summed in integers with AVX2 where the build has it), the
//! K-quants in [`super::kquants`]. Each pass over a weight row serves up to four rows of
//! activations, each summed in the order of a product alone, so a batch reads the weights
//! once and every row gets the bits it would get by itself.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use half::f16;

use super::kquants::{self, KFormat, Q8KRow, QK_K};
use super::rows::{half_at, GROUP};

const QK: usize = 32;
/// Output rows per parallel work item.
const ROWS_PER_TASK: usize = 32;

/// The block formats these kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// d (f16), 16 bytes of nibbles: w = d (q - 8).
    Q4_0,
    /// d (f16), m (f16), 16 bytes of nibbles: w = d q + m.
    Q4_1,
    /// d (f16), 4 bytes of fifth bits, 16 bytes of nibbles: w = d (q - 16).
    Q5_0,
    /// d (f16), 32 signed bytes: w = d q.
    Q8_0,
    /// Super-blocks of 256 weights.
    K(KFormat),
}

impl Format {
    /// The format of a tensor type, for the types these kernels read.
    pub(crate) fn of(dtype: candle_core::quantized::GgmlDType) -> Option<Self> {
        use candle_core::quantized::GgmlDType;
        Some(match dtype {
            GgmlDType::Q4_0 => Self::Q4_0,
            GgmlDType::Q4_1 => Self::Q4_1,
            GgmlDType::Q5_0 => Self::Q5_0,
            GgmlDType::Q8_0 => Self::Q8_0,
            GgmlDType::Q4K => Self::K(KFormat::Q4K),
            GgmlDType::Q5K => Self::K(KFormat::Q5K),
            GgmlDType::Q6K => Self::K(KFormat::Q6K),
            _ => return None,
        })
    }

    pub(crate) const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::K(f) => f.block_bytes(),
        }
    }

    /// Weights per block.
    pub(crate) const fn block_len(self) -> usize {
        match self {
            Self::K(_) => QK_K,
            _ => QK,
        }
    }
}

/// A (n, k) weight matrix of blocks of one format, rows of whole blocks.
pub(crate) struct BlockMatrix {
    format: Format,
    n: usize,
    k: usize,
    weight: Arc<QTensor>,
}

/// One row of activations in Q8_1 form.
pub(crate) struct Q8_1Row {
    /// Each block's scale d and scaled sum s, side by side (d0, s0, d1, s1, …): a kernel
    /// loads a block's two in one 64-bit load.
    pub(crate) ds: Vec<f32>,
    pub(crate) qs: Vec<i8>,
}

impl Q8_1Row {
    /// Block b's scale.
    pub(crate) fn d(&self, b: usize) -> f32 {
        self.ds[2 * b]
    }

    /// Block b's scale times the sum of its bytes.
    pub(crate) fn s(&self, b: usize) -> f32 {
        self.ds[2 * b + 1]
    }
}

/// Up to [`GROUP`] rows of activations that share each pass over a weight row, with
/// every block's scales of all the rows side by side ((d, s) of each row in turn, four
/// rows wide, padded with zeros), so that one product scales every row of the group. A
/// single row's own scales serve as they are.
pub(crate) struct Q8_1Group<'a> {
    rows: Vec<&'a Q8_1Row>,
    #[cfg_attr(not(x86_avx2), allow(dead_code))]
    ds: Cow<'a, [f32]>,
}

impl<'a> Q8_1Group<'a> {
    /// `rows` in groups of up to [`GROUP`], in order.
    pub(crate) fn of(rows: &[&'a Q8_1Row]) -> Vec<Self> {
        rows.chunks(GROUP)
            .map(|rows| {
                let ds = match rows {
                    [row] => Cow::Borrowed(&row.ds[..]),
                    _ => {
                        let blocks = rows.iter().map(|r| r.ds.len() / 2).min().unwrap_or(0);
                        let mut ds = vec![0f32; blocks * 2 * GROUP];
                        for (b, cell) in ds.chunks_exact_mut(2 * GROUP).enumerate() {
                            for (r, row) in rows.iter().enumerate() {
                                cell[2 * r] = row.d(b);
                                cell[2 * r + 1] = row.s(b);
                            }
                        }
                        Cow::Owned(ds)
                    }
                };
                Self {
                    rows: rows.to_vec(),
                    ds,
                }
            })
            .collect()
    }
}

impl BlockMatrix {
    /// The matrix over a CPU tensor's own bytes (shared, never copied: a tied embedding
    /// and output head stay one allocation), or `None` where its rows are not whole blocks.
    pub(crate) fn new(format: Format, weight: Arc<QTensor>) -> candle_core::Result<Option<Self>> {
        let (n, k) = weight.shape().dims2()?;
        let whole = k.is_multiple_of(format.block_len())
            && weight.data()?.len() == n * k / format.block_len() * format.block_bytes();
        Ok(whole.then_some(Self {
            format,
            n,
            k,
            weight,
        }))
    }

    /// Each output column j of the (m, n) product, computed by `column(weight row j, the
    /// m cells of column j)`, over the pool; the result laid out row-major (m, n), each
    /// task writing its own columns in place (no transposition after, no zeroing before).
    fn columns(
        &self,
        m: usize,
        column: impl Fn(&[u8], &mut [f32]) + Sync,
    ) -> candle_core::Result<Vec<f32>> {
        let data = self.weight.data()?;
        let (n, row_bytes) = (
            self.n,
            self.k / self.format.block_len() * self.format.block_bytes(),
        );
        let mut out = Vec::<f32>::with_capacity(m * n);
        let out_ptr = out.as_mut_ptr() as usize;
        // candle's own pool: one set of engine threads, no second pool competing for cores.
        super::pool::for_chunks(n.div_ceil(ROWS_PER_TASK), |tasks| {
            let mut cells = vec![0f32; m];
            for task in tasks {
                for j in task * ROWS_PER_TASK..n.min((task + 1) * ROWS_PER_TASK) {
                    column(&data[j * row_bytes..(j + 1) * row_bytes], &mut cells);
                    for (i, &v) in cells.iter().enumerate() {
                        // SAFETY: cell (i, j) lies inside the m * n capacity, which
                        // outlives the pool call, and column j belongs to this task alone.
                        unsafe { (out_ptr as *mut f32).add(i * n + j).write(v) };
                    }
                }
            }
        });
        // SAFETY: the tasks cover every column j < n, each writing all m of its cells.
        unsafe { out.set_len(m * n) };
        Ok(out)
    }
}

/// Quantizes one row the way llama.cpp's AVX2 `quantize_row_q8_1` does.
pub(crate) fn quantize_q8_1(x: &[f32]) -> Q8_1Row {
    let mut row = Q8_1Row {
        ds: Vec::with_capacity(x.len() / QK * 2),
        qs: vec![0; x.len()],
    };
    for (xs, qs) in x.chunks_exact(QK).zip(row.qs.chunks_exact_mut(QK)) {
        let (d, s) = quantize_q8_1_block(xs, qs);
        row.ds.extend([d, s]);
    }
    row
}

/// [`quantize_q8_1`] into the caller's buffers: `qs` as long as `x`, a scale `d` and a
/// scaled sum `s` per block of 32.
pub(crate) fn quantize_q8_1_into(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let blocks = x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK));
    for ((xs, qs), (d, s)) in blocks.zip(d.iter_mut().zip(s.iter_mut())) {
        (*d, *s) = quantize_q8_1_block(xs, qs);
    }
}

/// One block of 32 activations as bytes, with its scale and scaled sum in f16 precision.
fn quantize_q8_1_block(xs: &[f32], qs: &mut [i8]) -> (f32, f32) {
    let xs: &[f32; QK] = xs.try_into().expect("a whole block");
    let qs: &mut [i8; QK] = qs.try_into().expect("a whole block");
    #[cfg(x86_avx2)]
    // SAFETY: the features are compiled in.
    let (scale, sum) = unsafe { avx2::quantize_block(xs, qs) };
    #[cfg(not(x86_avx2))]
    let (scale, sum) = quantize_block(xs, qs);
    (
        f16::from_f32(scale).to_f32(),
        f16::from_f32(scale * sum as f32).to_f32(),
    )
}

/// One block of 32 activations as bytes: the scale d (largest magnitude / 127) and the
/// sum of the bytes.
#[cfg_attr(x86_avx2, allow(dead_code))]
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

/// Dot product of a weight row with a row of activations alone.
#[cfg(test)]
fn dot(format: Format, w: &[u8], x: &Q8_1Row) -> f32 {
    let mut out = [0f32];
    dots(format, w, &Q8_1Group::of(&[x]), &mut out);
    out[0]
}

/// Dequantizes whole Q4_1 or Q5_0 blocks into `out` with AVX2, bit for bit the values of
/// llama.cpp's reference dequantization (candle's `to_float`: q d + m, d (q - 16)), for
/// prefill's tiles. `false` (nothing written) for other formats or without AVX2.
pub(crate) fn dequantize(format: Format, bytes: &[u8], out: &mut [f32]) -> bool {
    #[cfg(x86_avx2)]
    if matches!(format, Format::Q4_1 | Format::Q5_0) {
        let blocks = bytes.chunks_exact(format.block_bytes());
        assert_eq!(blocks.len() * QK, out.len(), "dequantize: lengths differ");
        for (block, ys) in blocks.zip(out.chunks_exact_mut(QK)) {
            // SAFETY: the features are compiled in; `block` is whole, `ys` holds 32.
            unsafe { avx2::dequantize_block(format, block, ys) };
        }
        return true;
    }
    let _ = (format, bytes, out);
    false
}

/// Dot products of one weight row with several rows of activations: the weights are read
/// and unpacked once per group of rows, and each row's sum is computed in exactly the
/// order of a single product, so a result never depends on the other rows.
fn dots(format: Format, w: &[u8], groups: &[Q8_1Group], out: &mut [f32]) {
    #[cfg(x86_avx2)]
    {
        let mut outs = out;
        for g in groups {
            let (o, rest) = outs.split_at_mut(g.rows.len());
            outs = rest;
            // SAFETY: the features are compiled in; the kernels check the lengths.
            unsafe {
                match (format, g.rows.len()) {
                    (Format::Q4_1, 4) => avx2::dots::<4>(w, g, o),
                    (Format::Q4_1, 3) => avx2::dots::<3>(w, g, o),
                    (Format::Q4_1, 2) => avx2::dots::<2>(w, g, o),
                    (Format::Q4_1, _) => avx2::dots::<1>(w, g, o),
                    (Format::Q4_0, _) => avx2::dots_signed::<{ avx2::Q4_0 }>(w, g, o),
                    (Format::Q5_0, _) => avx2::dots_signed::<{ avx2::Q5_0 }>(w, g, o),
                    (Format::Q8_0, _) => avx2::dots_signed::<{ avx2::Q8_0 }>(w, g, o),
                    (Format::K(_), _) => unreachable!("K-quants take kquants::dots"),
                }
            }
        }
    }
    #[cfg(not(x86_avx2))]
    for (o, x) in out.iter_mut().zip(groups.iter().flat_map(|g| &g.rows)) {
        *o = dot_scalar(format, w, x);
    }
}

#[cfg_attr(x86_avx2, allow(dead_code))]
fn dot_scalar(format: Format, w: &[u8], x: &Q8_1Row) -> f32 {
    if format != Format::Q4_1 {
        return dot_scalar_signed(format, w, x);
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
        sum += d * x.d(b) * acc as f32 + m * x.s(b);
    }
    sum
}

/// A Q4_0, Q5_0 or Q8_0 block's scale and 32 weights as signed integers (llama.cpp's
/// reference unpacking: Q4_0 q - 8; Q5_0 q - 16, q of five bits, the fifth from the
/// block's 32-bit mask).
pub(crate) fn signed_block(format: Format, block: &[u8]) -> (f32, [i8; QK]) {
    let mut q = [0i8; QK];
    match format {
        Format::Q4_0 => {
            for j in 0..QK / 2 {
                q[j] = (block[2 + j] & 0x0F) as i8 - 8;
                q[j + QK / 2] = (block[2 + j] >> 4) as i8 - 8;
            }
        }
        Format::Q5_0 => {
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            for j in 0..QK / 2 {
                let byte = block[6 + j];
                let high_lo = (((qh >> j) << 4) & 0x10) as u8;
                let high_hi = ((qh >> (j + 12)) & 0x10) as u8;
                q[j] = ((byte & 0x0F) | high_lo) as i8 - 16;
                q[j + QK / 2] = ((byte >> 4) | high_hi) as i8 - 16;
            }
        }
        Format::Q8_0 => {
            for (v, &b) in q.iter_mut().zip(&block[2..2 + QK]) {
                *v = b as i8;
            }
        }
        Format::Q4_1 | Format::K(_) => unreachable!("{format:?} is not a signed 32-block"),
    }
    (half_at(block, 0), q)
}

/// llama.cpp's reference Q4_0, Q5_0 and Q8_0 x Q8_0 products.
#[cfg_attr(x86_avx2, allow(dead_code))]
fn dot_scalar_signed(format: Format, w: &[u8], x: &Q8_1Row) -> f32 {
    let mut sum = 0f32;
    for (b, block) in w.chunks_exact(format.block_bytes()).enumerate() {
        let (d, q) = signed_block(format, block);
        let qs = &x.qs[b * QK..(b + 1) * QK];
        let acc: i32 = q
            .iter()
            .zip(qs)
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum();
        sum += d * x.d(b) * acc as f32;
    }
    sum
}

#[cfg(x86_avx2)]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::{half_at, Format, Q8_1Group, QK};

    const BLOCK_BYTES: usize = Format::Q4_1.block_bytes();

    /// A block's first two f16 values (a Q4_1 block's d and m; lane 0 alone for the
    /// others) in f32, lanes 0 and 1: one conversion straight from memory, which keeps
    /// the shuffle port free (lanes 2 and 3 hold the next bytes, never used).
    ///
    /// # Safety
    /// `block` points at 8 readable bytes.
    #[inline(always)]
    unsafe fn block_scales(block: *const u8) -> __m128 {
        // SAFETY: as this function's.
        unsafe { _mm_cvtph_ps(_mm_loadl_epi64(block as *const __m128i)) }
    }

    /// A Q4_1 block's 32 weights as bytes: the 16 bytes loaded once into both halves, the
    /// upper half shifted by a nibble (whole dwords: the bits that cross into the next
    /// byte are masked off with the rest), so no instruction moves data across halves.
    ///
    /// # Safety
    /// `block` points at a whole Q4_1 block.
    #[inline(always)]
    unsafe fn q4_1_bytes(block: *const u8) -> __m256i {
        // SAFETY: reads bytes 4..20 of the block.
        unsafe {
            let packed =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(block.add(4) as *const __m128i));
            let shifted = _mm256_srlv_epi32(packed, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
            _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
        }
    }

    /// Asks for the cache line `ahead` bytes past `at` (the distance this CPU decodes
    /// fastest with, [`crate::kernels::prefetch::ahead`], read once a row). Past a row's
    /// last block it asks for the next rows' bytes, or for nothing: a prefetch never
    /// faults.
    #[inline(always)]
    pub(crate) fn prefetch(at: *const u8, ahead: usize) {
        // SAFETY: a prefetch reads nothing and never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(ahead) as *const i8) }
    }

    /// The sum of eight lanes, in the order every product here uses.
    #[inline(always)]
    pub(crate) fn hsum(acc: __m256) -> f32 {
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

    /// One Q4_1 or Q5_0 block's 32 weights in f32 (see [`super::dequantize`]).
    ///
    /// # Safety
    /// `block` holds a whole block of `format`, `ys` 32 values.
    #[inline]
    pub(super) unsafe fn dequantize_block(format: Format, block: &[u8], ys: &mut [f32]) {
        // SAFETY: loads inside the block; four stores of eight into the 32 of `ys`.
        unsafe {
            let d = _mm256_set1_ps(half_at(block, 0));
            let (bytes, m) = match format {
                Format::Q5_0 => (q5_0_bytes(block), None),
                _ => {
                    let packed = _mm_loadu_si128(block.as_ptr().add(4) as *const __m128i);
                    let nibbles = _mm256_and_si256(
                        _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed),
                        _mm256_set1_epi8(0x0F),
                    );
                    (nibbles, Some(_mm256_set1_ps(half_at(block, 2))))
                }
            };
            let lo = _mm256_castsi256_si128(bytes);
            let hi = _mm256_extracti128_si256::<1>(bytes);
            let eights = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
            for (i, e) in eights.into_iter().enumerate() {
                // Q5_0's bytes are signed (q - 16), Q4_1's nibbles unsigned.
                let q = match m {
                    None => _mm256_cvtepi8_epi32(e),
                    Some(_) => _mm256_cvtepu8_epi32(e),
                };
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
                let v = match m {
                    Some(m) => _mm256_add_ps(v, m),
                    None => v,
                };
                _mm256_storeu_ps(ys.as_mut_ptr().add(8 * i), v);
            }
        }
    }

    /// Eight sums of four products of unsigned bytes `u` and signed bytes `s` (lane i: bytes
    /// 4i to 4i + 3): one `vpdpbusd` where the build has AVX-512 VNNI, else llama.cpp's
    /// pairs of 16-bit sums. The same integers either way: a pair's sum stays under 2^15
    /// (u at most 128, |s| at most 127).
    #[inline(always)]
    fn sum4(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the features are compiled in (this module exists only with AVX2).
        unsafe {
            #[cfg(x86_vnni)]
            return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
            #[cfg(not(x86_vnni))]
            return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
        }
    }

    /// A block's signed weights, ready for sums of four products with rows of signed
    /// activations (llama.cpp's `mul_sum_i8_pairs`): with VNNI, the activations are offset
    /// to unsigned bytes and each lane starts at -128 × its four weights; without, the
    /// weights' magnitudes meet the activations carrying the weights' signs. The same
    /// integers either way, so the same bits.
    struct SignedWeights {
        w: __m256i,
        /// VNNI: -128 × each lane's four weights. AVX2: the weights' magnitudes.
        prepared: __m256i,
    }

    impl SignedWeights {
        #[inline(always)]
        fn new(w: __m256i) -> Self {
            // SAFETY: the features are compiled in (this module exists only with AVX2).
            unsafe {
                #[cfg(x86_vnni)]
                let prepared = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), w),
                );
                #[cfg(not(x86_vnni))]
                let prepared = _mm256_sign_epi8(w, w);
                Self { w, prepared }
            }
        }

        /// Eight sums of four products with the signed bytes `x`.
        #[inline(always)]
        fn sum4(&self, x: __m256i) -> __m256i {
            // SAFETY: as in `new`.
            unsafe {
                #[cfg(x86_vnni)]
                return _mm256_dpbusd_epi32(
                    self.prepared,
                    _mm256_xor_si256(x, _mm256_set1_epi8(-128)),
                    self.w,
                );
                #[cfg(not(x86_vnni))]
                return sum4(self.prepared, _mm256_sign_epi8(x, self.w));
            }
        }
    }

    /// The signed 32-blocks, as const parameters: each format gets its own kernel.
    pub(super) const Q4_0: u8 = 0;
    pub(super) const Q5_0: u8 = 1;
    pub(super) const Q8_0: u8 = 2;

    /// The format `F`'s block bytes.
    const fn signed_block_bytes(f: u8) -> usize {
        match f {
            Q4_0 => Format::Q4_0.block_bytes(),
            Q5_0 => Format::Q5_0.block_bytes(),
            _ => Format::Q8_0.block_bytes(),
        }
    }

    /// A Q4_0, Q5_0 or Q8_0 block's 32 weights as signed bytes (llama.cpp's unpacking).
    ///
    /// # Safety
    /// `block` holds a whole block of format `F`; AVX2 is compiled in.
    #[inline(always)]
    unsafe fn signed_bytes<const F: u8>(block: &[u8]) -> __m256i {
        // SAFETY: reads inside the block (18, 22 or 34 bytes).
        unsafe {
            match F {
                Q5_0 => q5_0_bytes(block),
                Q8_0 => _mm256_loadu_si256(block.as_ptr().add(2) as *const __m256i),
                _ => {
                    let packed = _mm_loadu_si128(block.as_ptr().add(2) as *const __m128i);
                    let nibbles = _mm256_and_si256(
                        _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed),
                        _mm256_set1_epi8(0x0F),
                    );
                    _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8))
                }
            }
        }
    }

    /// Q4_0, Q5_0 or Q8_0 weights (format `F`) times a group of rows of Q8_0 activations.
    ///
    /// # Safety
    /// `w` holds whole blocks of format `F` (the lengths of the rest are checked).
    #[inline]
    pub(super) unsafe fn dots_signed<const F: u8>(w: &[u8], g: &Q8_1Group, out: &mut [f32]) {
        // SAFETY: as this function's.
        unsafe {
            match g.rows.len() {
                4 => dots_signed_n::<F, 4>(w, g, out),
                3 => dots_signed_n::<F, 3>(w, g, out),
                2 => dots_signed_n::<F, 2>(w, g, out),
                _ => dots_signed_n::<F, 1>(w, g, out),
            }
        }
    }

    /// [`dots_signed`] for exactly `N` rows, each summed in the order of llama.cpp's
    /// one-row product.
    ///
    /// # Safety
    /// As [`dots_signed`], with `N` rows.
    #[inline(always)]
    unsafe fn dots_signed_n<const F: u8, const N: usize>(w: &[u8], g: &Q8_1Group, out: &mut [f32]) {
        let blocks = w.len() / signed_block_bytes(F);
        check_group::<N>(g, blocks, out);
        let ds = g.ds.as_ptr();
        // SAFETY: every load reads inside `w` (whole blocks), `g.ds` (two per block and
        // row) or a row's `qs` (32 per block), as checked above.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            let ahead = crate::kernels::prefetch::ahead();
            for (b, block) in w.chunks_exact(signed_block_bytes(F)).enumerate() {
                prefetch(block.as_ptr(), ahead);
                let wd = block_scales(block.as_ptr());
                let wq = signed_bytes::<F>(block);
                let signed = SignedWeights::new(wq);
                // Lane 2r: d × d_r (rounded as a scalar product).
                let scales = match N {
                    1 => _mm256_castps128_ps256(_mm_mul_ss(wd, _mm_load_ss(ds.add(2 * b)))),
                    _ => _mm256_mul_ps(
                        _mm256_broadcastss_ps(wd),
                        _mm256_loadu_ps(ds.add(2 * super::GROUP * b)),
                    ),
                };
                for (r, (acc, x)) in acc.iter_mut().zip(&g.rows).enumerate() {
                    let xq = _mm256_loadu_si256(x.qs.as_ptr().add(b * QK) as *const __m256i);
                    let q = _mm256_cvtepi32_ps(signed.sum4(xq));
                    *acc = _mm256_fmadd_ps(row_scale::<N>(scales, r), q, *acc);
                }
            }
            for r in 0..N {
                out[r] = hsum(acc[r]);
            }
        }
    }

    /// Each row's scale in lanes 2r (of eight) for a group of `N` rows: `scales` of a
    /// single row (its lane 0), or of a group four rows wide.
    #[inline(always)]
    fn row_scale<const N: usize>(scales: __m256, r: usize) -> __m256 {
        // SAFETY: AVX2 is compiled in.
        unsafe {
            match N {
                1 => _mm256_broadcastss_ps(_mm256_castps256_ps128(scales)),
                _ => _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(2 * r as i32)),
            }
        }
    }

    /// Checks that `g` (with `N` rows) and `out` cover `blocks` blocks of each row.
    fn check_group<const N: usize>(g: &Q8_1Group, blocks: usize, out: &[f32]) {
        let width = if N == 1 { 1 } else { super::GROUP };
        assert!(g.rows.len() == N && out.len() == N && g.ds.len() >= 2 * width * blocks);
        assert!(g.rows.iter().all(|x| x.qs.len() >= blocks * QK));
    }

    /// Q4_1 weights times a group of `N` rows of Q8_1 activations.
    ///
    /// # Safety
    /// `w` holds whole Q4_1 blocks (the lengths of the rest are checked).
    #[inline]
    pub(super) unsafe fn dots<const N: usize>(w: &[u8], g: &Q8_1Group, out: &mut [f32]) {
        let blocks = w.len() / BLOCK_BYTES;
        check_group::<N>(g, blocks, out);
        let ds = g.ds.as_ptr();
        // SAFETY: every load reads inside `w` (whole 20-byte blocks), `g.ds` (two per
        // block and row) or a row's `qs` (32 per block), as checked above.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            // Lane 2r + 1 for row r: the sum of m × s in block order, as a scalar sum
            // would be; a single row keeps it in 128 bits.
            let mut summs_one = _mm_setzero_ps();
            let mut summs = _mm256_setzero_ps();
            let ahead = crate::kernels::prefetch::ahead();
            for b in 0..blocks {
                let block = w.as_ptr().add(b * BLOCK_BYTES);
                prefetch(block, ahead);
                let dm = block_scales(block);
                let wq = q4_1_bytes(block);
                // Lanes 2r and 2r + 1: d × d_r and m × s_r (rounded as scalar products).
                let scales = if N == 1 {
                    let xds = _mm_castpd_ps(_mm_load_sd(ds.add(2 * b) as *const f64));
                    let scales = _mm_mul_ps(dm, xds);
                    summs_one = _mm_add_ps(summs_one, scales);
                    _mm256_castps128_ps256(scales)
                } else {
                    let dm = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(dm)));
                    let scales = _mm256_mul_ps(dm, _mm256_loadu_ps(ds.add(2 * super::GROUP * b)));
                    summs = _mm256_add_ps(summs, scales);
                    scales
                };
                for (r, (acc, x)) in acc.iter_mut().zip(&g.rows).enumerate() {
                    let xq = _mm256_loadu_si256(x.qs.as_ptr().add(b * QK) as *const __m256i);
                    let sums = _mm256_cvtepi32_ps(sum4(wq, xq));
                    *acc = _mm256_fmadd_ps(row_scale::<N>(scales, r), sums, *acc);
                }
            }
            let mut lanes = [0f32; 8];
            match N {
                1 => lanes[1] = _mm_cvtss_f32(_mm_movehdup_ps(summs_one)),
                _ => _mm256_storeu_ps(lanes.as_mut_ptr(), summs),
            }
            for r in 0..N {
                out[r] = hsum(acc[r]) + lanes[2 * r + 1];
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Each lane is exactly the sum of its four byte products, at the bytes' extremes
        /// too: the VNNI and AVX2 builds get the same integers, so the same bits.
        #[test]
        fn lanes_are_exact_sums_of_four_products() {
            let mut seed = 31u32;
            let mut byte = || {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 24) as u8
            };
            for round in 0..200 {
                let mut w = [0i8; 32];
                let mut x = [0i8; 32];
                let mut u = [0u8; 32];
                for i in 0..32 {
                    w[i] = match round {
                        0 => -128,
                        1 => 127,
                        _ => byte() as i8,
                    };
                    // Activations are rounded to -127..=127.
                    x[i] = (byte() as i8).max(-127);
                    u[i] = match round {
                        0 => 128,
                        _ => byte() % 129,
                    };
                }
                // SAFETY: AVX2 is compiled in; the loads and stores are 32 bytes.
                let (signed, unsigned) = unsafe {
                    let load = |p: *const i8| _mm256_loadu_si256(p as *const __m256i);
                    let (wv, xv) = (load(w.as_ptr()), load(x.as_ptr()));
                    let mut out = [[0i32; 8]; 2];
                    let sums = [
                        SignedWeights::new(wv).sum4(xv),
                        sum4(load(u.as_ptr() as *const i8), xv),
                    ];
                    for (o, v) in out.iter_mut().zip(sums) {
                        _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, v);
                    }
                    (out[0], out[1])
                };
                for lane in 0..8 {
                    let four = 4 * lane..4 * lane + 4;
                    let want: i32 = four
                        .clone()
                        .map(|i| i32::from(w[i]) * i32::from(x[i]))
                        .sum();
                    assert_eq!(signed[lane], want, "signed, round {round}, lane {lane}");
                    let want: i32 = four.map(|i| i32::from(u[i]) * i32::from(x[i])).sum();
                    assert_eq!(unsigned[lane], want, "unsigned, round {round}, lane {lane}");
                }
            }
        }
    }
}

impl CustomOp1 for BlockMatrix {
    fn name(&self) -> &'static str {
        "block-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("block-matmul expects f32 input")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("block-matmul expects a contiguous input")
        };
        let dims = layout.dims();
        if dims.last() != Some(&self.k) {
            candle_core::bail!("block-matmul: input {dims:?} does not end in {}", self.k)
        }
        let x = data[start..end].chunks_exact(self.k);
        let m = x.len();
        // Output laid out row-major (m, n); work split over the n output columns.
        let out = match self.format {
            Format::K(format) => {
                let quantized: Vec<Q8KRow> = x.map(kquants::quantize_row).collect();
                let rows: Vec<&Q8KRow> = quantized.iter().collect();
                self.columns(m, |w, cells| kquants::dots(format, w, &rows, cells))?
            }
            format => {
                let quantized: Vec<Q8_1Row> = x.map(quantize_q8_1).collect();
                let rows: Vec<&Q8_1Row> = quantized.iter().collect();
                let groups = Q8_1Group::of(&rows);
                self.columns(m, |w, cells| dots(format, w, &groups, cells))?
            }
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
            assert_eq!(row.d(0).to_bits(), f16::from_f32(d).to_f32().to_bits());
            assert_eq!(
                row.s(0).to_bits(),
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
            dots(format, w, &Q8_1Group::of(&refs), &mut out);
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

    /// Every format on random matrices, through the whole operation (activations
    /// quantized, work shared over the pool): within 1e-3 of the f32 product of the
    /// dequantized weights (relative to the sum of the products' magnitudes, which the
    /// 8-bit activations bound), within 1e-4 of candle's product (llama.cpp's algorithm:
    /// the same integer sums, summed in another order), and each row of a product of 1 to
    /// 15 rows bit for bit that row's product alone.
    #[test]
    fn every_format_matches_the_dequantized_product_and_each_row_alone() {
        use candle_core::quantized::{GgmlDType, QMatMul};
        use candle_core::{Device, Module, Tensor};
        let device = Device::Cpu;
        let values = super::super::linear::probe_values;
        let rows = 15;
        for (format, dtype) in [
            (Format::Q4_0, GgmlDType::Q4_0),
            (Format::Q4_1, GgmlDType::Q4_1),
            (Format::Q5_0, GgmlDType::Q5_0),
            (Format::Q8_0, GgmlDType::Q8_0),
            (Format::K(KFormat::Q4K), GgmlDType::Q4K),
            (Format::K(KFormat::Q5K), GgmlDType::Q5K),
            (Format::K(KFormat::Q6K), GgmlDType::Q6K),
        ] {
            let (n, k) = (70, 512);
            let w = Tensor::from_vec(values(n * k, 11), (n, k), &device).unwrap();
            let q = Arc::new(QTensor::quantize(&w, dtype).unwrap());
            let m = BlockMatrix::new(format, q.clone())
                .unwrap()
                .expect("whole blocks");
            let dense = q.dequantize(&device).unwrap();
            let x = Tensor::from_vec(values(rows * k, 12), (rows, k), &device).unwrap();
            let got: Vec<f32> = x
                .apply_op1_no_bwd(&m)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let f32_product: Vec<f32> = x
                .matmul(&dense.t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let candle: Vec<f32> = QMatMul::from_arc(q.clone())
                .unwrap()
                .forward(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let magnitude: Vec<f32> = x
                .abs()
                .unwrap()
                .matmul(&dense.abs().unwrap().t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for i in 0..rows * n {
                let scale = magnitude[i];
                assert!(
                    (got[i] - f32_product[i]).abs() <= 1e-3 * scale,
                    "{format:?} cell {i}: {} vs f32 {} (scale {scale})",
                    got[i],
                    f32_product[i]
                );
                assert!(
                    (got[i] - candle[i]).abs() <= 1e-4 * scale,
                    "{format:?} cell {i}: {} vs candle {}",
                    got[i],
                    candle[i]
                );
            }
            let bits = |t: Tensor| -> Vec<u32> {
                t.flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f32::to_bits)
                    .collect()
            };
            let alone: Vec<Vec<u32>> = (0..rows)
                .map(|r| bits(x.narrow(0, r, 1).unwrap().apply_op1_no_bwd(&m).unwrap()))
                .collect();
            for count in 2..=rows {
                let all = bits(x.narrow(0, 0, count).unwrap().apply_op1_no_bwd(&m).unwrap());
                for (r, one) in alone.iter().take(count).enumerate() {
                    assert!(
                        all[r * n..(r + 1) * n] == one[..],
                        "{format:?}: row {r} of {count} differs from the row alone"
                    );
                }
            }
        }
    }

    /// The vector dequantization gives candle's (llama.cpp's reference) values bit for bit.
    #[test]
    fn dequantization_matches_the_reference() {
        use candle_core::quantized::GgmlDType;
        use candle_core::{Device, Tensor};
        let device = Device::Cpu;
        for (format, dtype) in [
            (Format::Q4_1, GgmlDType::Q4_1),
            (Format::Q5_0, GgmlDType::Q5_0),
        ] {
            let w = Tensor::from_vec(
                super::super::linear::probe_values(64 * 96, 21),
                (64, 96),
                &device,
            )
            .unwrap();
            let q = QTensor::quantize(&w, dtype).unwrap();
            let want: Vec<u32> = q
                .dequantize(&device)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .into_iter()
                .map(f32::to_bits)
                .collect();
            let mut got = vec![0f32; 64 * 96];
            if dequantize(format, &q.data().unwrap(), &mut got) {
                let got: Vec<u32> = got.into_iter().map(f32::to_bits).collect();
                assert_eq!(got, want, "{format:?}");
            }
        }
    }
}

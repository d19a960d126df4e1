//! Prefill's `x · wᵀ` in 8-bit integers, on CPUs with AVX-512 VNNI or AVX2.
//!
//! The activations are quantized once per call, each block of 32 to signed bytes with an
//! f16 scale and the block's sum (decode's Q8_1 rows); each task unpacks its block of
//! weight rows from the file's own bytes into signed bytes with a scale per block (32
//! weights, 16 for Q6_K) and, for the formats with one, a min. A block's product is summed
//! exactly in 32-bit integers (`vpdpbusd`, 64 products per instruction against 16 for an
//! f32 FMA), then scaled and added in f32:
//!
//! ```text
//! y[i][j] = Σ_b  Σq·qx (as f32) · (scale[j][b] · dx[i][b])  +  min[j][b] · sx[i][b]
//! ```
//!
//! one fused multiply-add after the other in block order. Every output's operations are
//! the same whatever rows or features share its call, so a row's bits never depend on the
//! others, and [`reference`] gives them on any CPU.

use std::ops::Range;

use candle_core::quantized::QTensor;

use super::blocks::{self, Format};
use super::kquants::{self, KFormat, QK_K};

/// Activations per quantization block.
const QK: usize = 32;
/// Features per group: the i32 lanes of one 512-bit register.
const LANES: usize = 16;
/// Features each task unpacks and multiplies: whole pairs of groups.
const FEATURES_PER_TASK: usize = 64;
/// Rows of activations per micro-kernel call.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const ROWS: usize = 4;
/// Rows per AVX2 micro-kernel call: its sixteen registers hold two rows' sums.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX2_ROWS: usize = 2;

/// How this CPU multiplies in 8-bit integers (elsewhere than x86-64, always portably).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Kernel {
    /// AVX-512 VNNI: `vpdpbusd`, 64 products per instruction, for every block format.
    Vnni,
    /// AVX2: `vpmaddubsw` (16-bit sums of byte pairs, which saturate past ±32,767).
    /// Weights within ±32 (every format but Q8_0) multiply the offset activations and
    /// add two steps (at most 32,640) before widening; weights within ±127 (Q8_0)
    /// multiply the activations' magnitudes by the weights with the activations' signs
    /// (at most 32,258 a pair), one step at a time.
    Avx2,
    /// Portable loops: the same bits, far slower; prefill keeps f32 tiles instead.
    Portable,
}

/// The kernel chosen for this process: the fastest this CPU runs, unless a caller asked
/// for another first ([`prefer_integer_kernel`]).
#[cfg(target_arch = "x86_64")]
static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();

/// The fastest kernel this CPU runs, or with `preference` (`avx2`, `portable`) a slower
/// one it also runs.
#[cfg(target_arch = "x86_64")]
fn detect(preference: Option<&str>) -> Kernel {
    let vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni");
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    match preference {
        Some("portable") => Kernel::Portable,
        Some("avx2") if avx2 => Kernel::Avx2,
        _ if vnni => Kernel::Vnni,
        _ if avx2 => Kernel::Avx2,
        _ => Kernel::Portable,
    }
}

/// This CPU's kernel (chosen once).
fn kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    return *KERNEL.get_or_init(|| detect(None));
    #[cfg(not(target_arch = "x86_64"))]
    Kernel::Portable
}

/// Asks for a slower integer kernel than this CPU's best, to measure what CPUs without
/// AVX-512 VNNI get: `avx2` (where the CPU has it) or `portable`. Takes effect only
/// before the first product of the process; returns whether it did.
pub fn prefer_integer_kernel(name: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    return KERNEL.set(detect(Some(name))).is_ok();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = name;
        false
    }
}

/// Whether this CPU multiplies weights of `format` in integers at speed: every block
/// format with AVX-512 VNNI or AVX2.
pub(crate) fn available(format: Format) -> bool {
    let _ = format;
    kernel() != Kernel::Portable
}

/// The instruction set prefill's integer products run on here ("AVX-512 VNNI" or
/// "AVX2"), or `None` where they do not run at speed.
pub fn integer_prefill_kernel() -> Option<&'static str> {
    match kernel() {
        Kernel::Vnni => Some("AVX-512 VNNI"),
        Kernel::Avx2 => Some("AVX2"),
        Kernel::Portable => None,
    }
}

/// Rows of activations quantized for the product: bytes offset by 128 (the unsigned
/// operand of `vpdpbusd`), and per block of 32 the scale and the scaled sum.
pub(crate) struct Activations {
    k: usize,
    q: Vec<u8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

impl Activations {
    /// `x` (rows, k) row-major, k a multiple of 32.
    pub(crate) fn quantize(x: &[f32], rows: usize, k: usize) -> Self {
        assert!(k.is_multiple_of(QK) && x.len() >= rows * k);
        let blocks = rows * k / QK;
        let mut acts = Self {
            k,
            q: vec![0; rows * k],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
        };
        // Rows in groups on the engine's pool: each group's bytes, scales and sums are
        // its own, and the values are those of one pass over every row.
        const ROWS_PER_TASK: usize = 16;
        let (q, d, s) = (
            acts.q.as_mut_ptr() as usize,
            acts.d.as_mut_ptr() as usize,
            acts.s.as_mut_ptr() as usize,
        );
        let per_row = k / QK;
        super::pool::for_chunks(rows.div_ceil(ROWS_PER_TASK), |tasks| {
            let first = tasks.start * ROWS_PER_TASK;
            let end = (tasks.end * ROWS_PER_TASK).min(rows);
            let (len, blocks) = ((end - first) * k, (end - first) * per_row);
            // SAFETY: rows first..end of each buffer belong to this task alone, and the
            // buffers outlive the pool call; i8 and u8 share size and alignment.
            let (q, d, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut((q as *mut i8).add(first * k), len),
                    std::slice::from_raw_parts_mut((d as *mut f32).add(first * per_row), blocks),
                    std::slice::from_raw_parts_mut((s as *mut f32).add(first * per_row), blocks),
                )
            };
            blocks::quantize_q8_1_into(&x[first * k..end * k], q, d, s);
            for v in q.iter_mut() {
                *v = (*v as u8 ^ 0x80) as i8;
            }
        });
        acts
    }

    fn rows(&self) -> usize {
        self.q.len() / self.k.max(1)
    }
}

/// Weight rows unpacked for the product, in groups of [`LANES`] features (zero rows pad
/// the last group): for each group and each step of 4 along the depth, the 4 bytes of
/// each feature side by side (the layout `vpdpbusd` multiplies lane by lane); for each
/// group and block, the features' scales, mins and offsets (128 × the block's byte sum,
/// what the activations' offset adds).
#[derive(Clone)]
struct Unpacked {
    features: usize,
    k: usize,
    block: usize,
    q: Vec<i8>,
    scale: Vec<f32>,
    min: Option<Vec<f32>>,
    offset: Vec<i32>,
    /// The largest weight magnitude (128 for -128): which AVX2 product is exact.
    max_abs: u8,
}

impl Unpacked {
    /// Groups held: whole pairs.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn groups(&self) -> usize {
        self.features.div_ceil(2 * LANES) * 2
    }

    fn blocks(&self) -> usize {
        self.k / self.block
    }

    /// Unpacks the rows `features` of a (n, k) weight of `format` held in `bytes`,
    /// padded to whole pairs of groups.
    fn new(format: Format, bytes: &[u8], n: usize, k: usize, features: Range<usize>) -> Self {
        let block = match format {
            Format::K(KFormat::Q6K) => 16,
            _ => QK,
        };
        let has_min = matches!(
            format,
            Format::Q4_1 | Format::K(KFormat::Q4K) | Format::K(KFormat::Q5K)
        );
        let blocks = k / block;
        let steps = k / 4;
        let groups = features.len().div_ceil(2 * LANES) * 2;
        let mut u = Self {
            features: features.len(),
            k,
            block,
            q: vec![0; groups * LANES * k],
            scale: vec![0.0; groups * blocks * LANES],
            min: has_min.then(|| vec![0.0; groups * blocks * LANES]),
            offset: vec![0; groups * blocks * LANES],
            max_abs: 0,
        };
        let row_bytes = bytes.len() / n;
        let mut q = vec![0i8; k];
        let mut scale = vec![0f32; blocks];
        let mut min = vec![0f32; blocks];
        for (f, j) in features.enumerate() {
            let row = &bytes[j * row_bytes..(j + 1) * row_bytes];
            unpack_row(format, row, &mut q, &mut scale, &mut min);
            let (g, lane) = (f / LANES, f % LANES);
            u.max_abs = q.iter().map(|v| v.unsigned_abs()).fold(u.max_abs, u8::max);
            let dst = &mut u.q[g * steps * 4 * LANES..(g + 1) * steps * 4 * LANES];
            for (s, four) in q.chunks_exact(4).enumerate() {
                dst[(s * LANES + lane) * 4..(s * LANES + lane) * 4 + 4].copy_from_slice(four);
            }
            for b in 0..blocks {
                let at = (g * blocks + b) * LANES + lane;
                u.scale[at] = scale[b];
                let sum: i32 = q[b * block..(b + 1) * block]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                u.offset[at] = 128 * sum;
                if let Some(m) = u.min.as_mut() {
                    m[at] = min[b];
                }
            }
        }
        u
    }
}

/// One weight row as signed bytes with a scale (and a min) per block, the block of 32 (16
/// for Q6_K): the weights are `scale · q + min`, as the format dequantizes.
fn unpack_row(format: Format, row: &[u8], q: &mut [i8], scale: &mut [f32], min: &mut [f32]) {
    match format {
        Format::Q4_0 | Format::Q5_0 | Format::Q8_0 => {
            for (b, block) in row.chunks_exact(format.block_bytes()).enumerate() {
                let (d, qs) = blocks::signed_block(format, block);
                q[b * QK..(b + 1) * QK].copy_from_slice(&qs);
                scale[b] = d;
            }
        }
        Format::Q4_1 => {
            for (b, block) in row.chunks_exact(format.block_bytes()).enumerate() {
                scale[b] = super::rows::half_at(block, 0);
                min[b] = super::rows::half_at(block, 2);
                for l in 0..QK / 2 {
                    q[b * QK + l] = (block[4 + l] & 0x0F) as i8;
                    q[b * QK + QK / 2 + l] = (block[4 + l] >> 4) as i8;
                }
            }
        }
        Format::K(kf) => {
            for (b, block) in row.chunks_exact(kf.block_bytes()).enumerate() {
                let u = kquants::unpack(kf, block);
                q[b * QK_K..(b + 1) * QK_K].copy_from_slice(&u.q);
                match kf {
                    KFormat::Q6K => {
                        for (g, &sc) in u.scales.iter().enumerate() {
                            scale[b * 16 + g] = u.d * f32::from(sc);
                        }
                    }
                    KFormat::Q4K | KFormat::Q5K => {
                        for j in 0..8 {
                            scale[b * 8 + j] = u.d * f32::from(u.scales[2 * j]);
                            min[b * 8 + j] = -(u.dmin * f32::from(u.mins[j]));
                        }
                    }
                }
            }
        }
    }
}

/// `x` (rows, k) times the (n, k) weight of `format` held in `bytes`, transposed: (rows,
/// n) row-major, on the engine's thread pool. Runs the AVX-512 kernel where the CPU has
/// it ([`available`]), portable loops otherwise; the bits are the same.
pub(crate) fn matmul_t(
    format: Format,
    bytes: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    rows: usize,
) -> Vec<f32> {
    product(format, bytes, (n, k), x, rows, kernel())
}

/// A frozen weight multiplied by prefill's integer product, for callers outside the
/// engine (the trainer's frozen projections, forward and back): the (n, k) rows in one of
/// the block formats [`Format::of`] takes, kept as bytes.
#[derive(Clone)]
pub struct IntegerWeight {
    format: Format,
    bytes: Vec<u8>,
    n: usize,
    k: usize,
    /// Every task's rows unpacked once ([`IntegerWeight::unpacked`]).
    unpacked: Option<std::sync::Arc<Vec<Unpacked>>>,
}

impl IntegerWeight {
    /// `w` in its file's own bytes: `None` where its type has no integer product or its
    /// rows are not whole blocks.
    pub fn of(w: &QTensor) -> candle_core::Result<Option<Self>> {
        let Some(format) = Format::of(w.dtype()) else {
            return Ok(None);
        };
        let (n, k) = w.shape().dims2()?;
        if !k.is_multiple_of(format.block_len()) {
            return Ok(None);
        }
        let bytes = w.data()?.into_owned();
        Ok(Some(Self {
            format,
            bytes,
            n,
            k,
            unpacked: None,
        }))
    }

    /// `w` (n, k) row-major rounded to Q8_0 (blocks of 32 signed bytes and an f16
    /// scale): `None` where k is not a multiple of 32.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> candle_core::Result<Option<Self>> {
        if !k.is_multiple_of(QK) || w.len() != n * k {
            return Ok(None);
        }
        let t = candle_core::Tensor::from_slice(w, (n, k), &candle_core::Device::Cpu)?;
        let q = QTensor::quantize(&t, candle_core::quantized::GgmlDType::Q8_0)?;
        let bytes = q.data()?.into_owned();
        Ok(Some(Self {
            format: Format::Q8_0,
            bytes,
            n,
            k,
            unpacked: None,
        }))
    }

    /// The weight with its rows unpacked once for every later product, where each
    /// product would unpack them again: for a weight multiplied many times over (a
    /// frozen weight in training). Costs about 1.25 bytes per weight in place of the
    /// file's own bytes, which it drops; the products' bits are unchanged.
    pub fn unpacked(mut self) -> Self {
        let tasks = (0..self.n.div_ceil(FEATURES_PER_TASK))
            .map(|task| {
                let features = task * FEATURES_PER_TASK..self.n.min((task + 1) * FEATURES_PER_TASK);
                Unpacked::new(self.format, &self.bytes, self.n, self.k, features)
            })
            .collect();
        self.unpacked = Some(std::sync::Arc::new(tasks));
        // The products read the unpacked rows alone from here on.
        self.bytes = Vec::new();
        self
    }

    /// (rows, features).
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// `x` (rows, k) times this weight transposed: (rows, n) row-major, on the engine's
    /// pool; the AVX-512 VNNI kernel where the CPU has it, the same bits from portable
    /// loops (far slower) elsewhere.
    pub fn matmul_t(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        match &self.unpacked {
            Some(tasks) => product_of(n, k, x, rows, kernel(), |task, _| {
                std::borrow::Cow::Borrowed(&tasks[task])
            }),
            None => product(self.format, &self.bytes, (n, k), x, rows, kernel()),
        }
    }
}

/// Whether this CPU runs the integer products at speed (AVX-512 VNNI or AVX2);
/// elsewhere [`IntegerWeight::matmul_t`] falls back to portable loops.
pub fn integer_products_fast() -> bool {
    kernel() != Kernel::Portable
}

/// [`matmul_t`] with `kernel` (tests run the portable loops beside the others).
fn product(
    format: Format,
    bytes: &[u8],
    (n, k): (usize, usize),
    x: &[f32],
    rows: usize,
    kernel: Kernel,
) -> Vec<f32> {
    product_of(n, k, x, rows, kernel, |_, features| {
        std::borrow::Cow::Owned(Unpacked::new(format, bytes, n, k, features))
    })
}

/// [`product`], with each task's unpacked rows from `unpacked(task, features)`.
fn product_of<'a>(
    n: usize,
    k: usize,
    x: &[f32],
    rows: usize,
    kernel: Kernel,
    unpacked: impl Fn(usize, Range<usize>) -> std::borrow::Cow<'a, Unpacked> + Sync,
) -> Vec<f32> {
    if rows == 0 || n == 0 {
        return vec![0f32; rows * n];
    }
    let acts = Activations::quantize(x, rows, k);
    // Not zero-filled: the tasks write every output once (a pass over the whole
    // buffer saved, on the calling thread alone).
    let mut out: Vec<f32> = Vec::with_capacity(rows * n);
    let out_ptr = out.as_mut_ptr() as usize;
    super::pool::for_chunks(n.div_ceil(FEATURES_PER_TASK), |tasks| {
        for task in tasks {
            let features = task * FEATURES_PER_TASK..n.min((task + 1) * FEATURES_PER_TASK);
            let w = unpacked(task, features.clone());
            // SAFETY: each task writes only its own features' columns of the (rows, n)
            // buffer, which outlives the pool call.
            unsafe { multiply(&acts, &w, out_ptr as *mut f32, n, features.start, kernel) };
        }
    });
    // SAFETY: the tasks above wrote every row's output for every feature 0..n (each
    // task its features, every row), so all rows · n values are initialised.
    unsafe { out.set_len(rows * n) };
    out
}

/// The product of every row of `acts` with the unpacked features, into the columns from
/// `j0` of the (rows, n) buffer at `out`.
///
/// # Safety
/// `out` must be a (rows, n) buffer whose columns `j0..j0 + w.features` no one else writes.
unsafe fn multiply(
    acts: &Activations,
    w: &Unpacked,
    out: *mut f32,
    n: usize,
    j0: usize,
    kernel: Kernel,
) {
    let rows = acts.rows();
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Vnni {
        for pair in 0..w.groups() / 2 {
            let mut i = 0;
            while i < rows {
                let r = ROWS.min(rows - i);
                // SAFETY: the CPU has the features (`kernel`); the rest is the caller's.
                unsafe {
                    match (r, w.min.is_some()) {
                        (4, false) => vnni::tile::<4, false>(acts, i, w, pair, out, n, j0),
                        (4, true) => vnni::tile::<4, true>(acts, i, w, pair, out, n, j0),
                        (3, false) => vnni::tile::<3, false>(acts, i, w, pair, out, n, j0),
                        (3, true) => vnni::tile::<3, true>(acts, i, w, pair, out, n, j0),
                        (2, false) => vnni::tile::<2, false>(acts, i, w, pair, out, n, j0),
                        (2, true) => vnni::tile::<2, true>(acts, i, w, pair, out, n, j0),
                        (_, false) => vnni::tile::<1, false>(acts, i, w, pair, out, n, j0),
                        (_, true) => vnni::tile::<1, true>(acts, i, w, pair, out, n, j0),
                    }
                }
                i += r;
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2 && (w.max_abs <= 32 || w.max_abs <= 127 && w.min.is_none()) {
        let signed = w.max_abs > 32;
        for g in 0..w.groups() {
            if g * LANES >= w.features {
                break;
            }
            let mut i = 0;
            while i < rows {
                let r = AVX2_ROWS.min(rows - i);
                // SAFETY: the CPU has the features (`kernel`), and the weights are within
                // ±32, or within ±127 for the signed product (checked above); the rest is
                // the caller's.
                unsafe {
                    match (r, w.min.is_some(), signed) {
                        (2, false, false) => {
                            avx2::tile::<2, false, false>(acts, i, w, g, out, n, j0)
                        }
                        (2, true, false) => avx2::tile::<2, true, false>(acts, i, w, g, out, n, j0),
                        (2, _, true) => avx2::tile::<2, false, true>(acts, i, w, g, out, n, j0),
                        (_, false, false) => {
                            avx2::tile::<1, false, false>(acts, i, w, g, out, n, j0)
                        }
                        (_, true, false) => avx2::tile::<1, true, false>(acts, i, w, g, out, n, j0),
                        (_, _, true) => avx2::tile::<1, false, true>(acts, i, w, g, out, n, j0),
                    }
                }
                i += r;
            }
        }
        return;
    }
    let _ = kernel;
    for i in 0..rows {
        for f in 0..w.features {
            // SAFETY: the caller's promise.
            unsafe { *out.add(i * n + j0 + f) = output(acts, i, w, f) };
        }
    }
}

/// One output, in the kernel's order of operations.
fn output(acts: &Activations, i: usize, w: &Unpacked, f: usize) -> f32 {
    let (k, blocks, steps) = (w.k, w.blocks(), w.k / 4);
    let (g, lane) = (f / LANES, f % LANES);
    let x = &acts.q[i * k..(i + 1) * k];
    let mut acc = 0f32;
    for b in 0..blocks {
        let mut sum = 0i32;
        for s in b * w.block / 4..(b + 1) * w.block / 4 {
            for t in 0..4 {
                let wq = w.q[((g * steps + s) * LANES + lane) * 4 + t];
                sum += i32::from(x[4 * s + t]) * i32::from(wq);
            }
        }
        let at = (g * blocks + b) * LANES + lane;
        let a = i * (k / QK) + b * w.block / QK;
        let isum = sum - w.offset[at];
        acc = (isum as f32).mul_add(w.scale[at] * acts.d[a], acc);
        if let Some(min) = &w.min {
            acc = min[at].mul_add(acts.s[a], acc);
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{Activations, Unpacked, LANES, QK};

    /// Rows `i0..i0 + R` of `acts` times the features of groups `2 pair` and `2 pair + 1`,
    /// written to their columns (from `j0 + 32 pair`) of the (rows, n) buffer at `out`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI; `i0 + R` rows must exist; `out` as in
    /// [`super::multiply`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    // The register tile is indexed by row and column, as the product is.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn tile<const R: usize, const MIN: bool>(
        acts: &Activations,
        i0: usize,
        w: &Unpacked,
        pair: usize,
        out: *mut f32,
        n: usize,
        j0: usize,
    ) {
        let (k, blocks, steps) = (w.k, w.blocks(), w.k / 4);
        let act_blocks = k / QK;
        let per_block = w.block / 4;
        let g = [2 * pair, 2 * pair + 1];
        // SAFETY: every pointer stays inside its vector: groups < w.groups(), rows
        // i0 + R <= acts.rows(), steps and blocks within k.
        unsafe {
            let wq = g.map(|g| w.q.as_ptr().add(g * steps * 4 * LANES));
            let x: [*const u8; R] = std::array::from_fn(|r| acts.q.as_ptr().add((i0 + r) * k));
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for b in 0..blocks {
                let mut sums = [[_mm512_setzero_si512(); 2]; R];
                for s in b * per_block..(b + 1) * per_block {
                    let w0 = _mm512_loadu_si512(wq[0].add(s * 4 * LANES) as *const _);
                    let w1 = _mm512_loadu_si512(wq[1].add(s * 4 * LANES) as *const _);
                    for r in 0..R {
                        let a = _mm512_set1_epi32((x[r].add(4 * s) as *const i32).read_unaligned());
                        sums[r][0] = _mm512_dpbusd_epi32(sums[r][0], a, w0);
                        sums[r][1] = _mm512_dpbusd_epi32(sums[r][1], a, w1);
                    }
                }
                let a = b * w.block / QK;
                for c in 0..2 {
                    let at = (g[c] * blocks + b) * LANES;
                    let scale = _mm512_loadu_ps(w.scale.as_ptr().add(at));
                    let offset = _mm512_loadu_si512(w.offset.as_ptr().add(at) as *const _);
                    for r in 0..R {
                        let row = (i0 + r) * act_blocks + a;
                        let isum = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r][c], offset));
                        let ds = _mm512_mul_ps(scale, _mm512_set1_ps(*acts.d.get_unchecked(row)));
                        acc[r][c] = _mm512_fmadd_ps(isum, ds, acc[r][c]);
                        if MIN {
                            let min =
                                _mm512_loadu_ps(w.min.as_ref().unwrap_unchecked().as_ptr().add(at));
                            acc[r][c] = _mm512_fmadd_ps(
                                min,
                                _mm512_set1_ps(*acts.s.get_unchecked(row)),
                                acc[r][c],
                            );
                        }
                    }
                }
            }
            for c in 0..2 {
                let first = (2 * pair + c) * LANES;
                if first >= w.features {
                    break;
                }
                let valid = (w.features - first).min(LANES);
                let mask: __mmask16 = if valid == LANES {
                    !0
                } else {
                    (1u16 << valid) - 1
                };
                for r in 0..R {
                    _mm512_mask_storeu_ps(out.add((i0 + r) * n + j0 + first), mask, acc[r][c]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Activations, Unpacked, LANES, QK};

    /// Rows `i0..i0 + R` of `acts` times the features of group `g` (two registers of
    /// eight), written to their columns (from `j0 + 16 g`) of the (rows, n) buffer at
    /// `out`. Each step's byte products are summed in pairs to 16 bits (`vpmaddubsw`),
    /// two steps' sums added, then widened to the 32-bit lanes `vpdpbusd` fills: the
    /// same integers, so the same bits as [`super::vnni::tile`] and [`super::output`].
    /// `SIGNED` (weights beyond ±32): each step alone, the activations' magnitudes times
    /// the weights with the activations' signs, which sums Σ q·w without the offset.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; every weight within ±32, or within ±127 when
    /// `SIGNED`; `i0 + R` rows must exist; `out` as in [`super::multiply`].
    #[target_feature(enable = "avx2,fma")]
    // The register tile is indexed by row and half, as the product is.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn tile<const R: usize, const MIN: bool, const SIGNED: bool>(
        acts: &Activations,
        i0: usize,
        w: &Unpacked,
        g: usize,
        out: *mut f32,
        n: usize,
        j0: usize,
    ) {
        let (k, blocks, steps) = (w.k, w.blocks(), w.k / 4);
        let act_blocks = k / QK;
        let per_block = w.block / 4;
        // SAFETY: every pointer stays inside its vector: g < w.groups(), rows
        // i0 + R <= acts.rows(), steps and blocks within k (whole pairs of steps: a
        // block holds 4 or 8).
        unsafe {
            let wq = w.q.as_ptr().add(g * steps * 4 * LANES);
            let x: [*const u8; R] = std::array::from_fn(|r| acts.q.as_ptr().add((i0 + r) * k));
            let ones = _mm256_set1_epi16(1);
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for b in 0..blocks {
                let mut sums = [[_mm256_setzero_si256(); 2]; R];
                let mut s = b * per_block;
                while SIGNED && s < (b + 1) * per_block {
                    let w0 = [0, 1]
                        .map(|h| _mm256_loadu_si256(wq.add(s * 4 * LANES + 32 * h) as *const _));
                    for r in 0..R {
                        let a = _mm256_set1_epi32((x[r].add(4 * s) as *const i32).read_unaligned());
                        let signed = _mm256_xor_si256(a, _mm256_set1_epi8(-128));
                        let size = _mm256_abs_epi8(signed);
                        for h in 0..2 {
                            let pairs = _mm256_maddubs_epi16(size, _mm256_sign_epi8(w0[h], signed));
                            sums[r][h] =
                                _mm256_add_epi32(sums[r][h], _mm256_madd_epi16(pairs, ones));
                        }
                    }
                    s += 1;
                }
                while !SIGNED && s < (b + 1) * per_block {
                    let at = |s: usize, h: usize| {
                        _mm256_loadu_si256(wq.add(s * 4 * LANES + 32 * h) as *const _)
                    };
                    let w0 = [at(s, 0), at(s, 1)];
                    let w1 = [at(s + 1, 0), at(s + 1, 1)];
                    for r in 0..R {
                        let a0 =
                            _mm256_set1_epi32((x[r].add(4 * s) as *const i32).read_unaligned());
                        let a1 =
                            _mm256_set1_epi32((x[r].add(4 * s + 4) as *const i32).read_unaligned());
                        for h in 0..2 {
                            let pairs = _mm256_add_epi16(
                                _mm256_maddubs_epi16(a0, w0[h]),
                                _mm256_maddubs_epi16(a1, w1[h]),
                            );
                            sums[r][h] =
                                _mm256_add_epi32(sums[r][h], _mm256_madd_epi16(pairs, ones));
                        }
                    }
                    s += 2;
                }
                let a = b * w.block / QK;
                for h in 0..2 {
                    let at = (g * blocks + b) * LANES + 8 * h;
                    let scale = _mm256_loadu_ps(w.scale.as_ptr().add(at));
                    let offset = _mm256_loadu_si256(w.offset.as_ptr().add(at) as *const _);
                    for r in 0..R {
                        let row = (i0 + r) * act_blocks + a;
                        let isum = if SIGNED {
                            _mm256_cvtepi32_ps(sums[r][h])
                        } else {
                            _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r][h], offset))
                        };
                        let ds = _mm256_mul_ps(scale, _mm256_set1_ps(*acts.d.get_unchecked(row)));
                        acc[r][h] = _mm256_fmadd_ps(isum, ds, acc[r][h]);
                        if MIN {
                            let min =
                                _mm256_loadu_ps(w.min.as_ref().unwrap_unchecked().as_ptr().add(at));
                            acc[r][h] = _mm256_fmadd_ps(
                                min,
                                _mm256_set1_ps(*acts.s.get_unchecked(row)),
                                acc[r][h],
                            );
                        }
                    }
                }
            }
            for h in 0..2 {
                let first = g * LANES + 8 * h;
                if first >= w.features {
                    break;
                }
                let valid = (w.features - first).min(8);
                for r in 0..R {
                    let dst = out.add((i0 + r) * n + j0 + first);
                    if valid == 8 {
                        _mm256_storeu_ps(dst, acc[r][h]);
                    } else {
                        let mut lanes = [0f32; 8];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][h]);
                        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::kernels::linear::probe_values;

    const TYPES: [GgmlDType; 7] = [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q8_0,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];

    /// A random (n, k) weight of `dtype`: its bytes and its dequantized values.
    fn weight(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let w = Tensor::from_vec(probe_values(n * k, seed), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap();
        (
            q.data().unwrap().to_vec(),
            dense.flatten_all().unwrap().to_vec1().unwrap(),
        )
    }

    /// Every output is the dequantized weights times the activations as their 8-bit blocks
    /// give them back, within 1e-3 of the sum of the terms' magnitudes (what the f16 sums
    /// of the min formats and f32 rounding leave), and near the product with the
    /// activations unrounded.
    #[test]
    fn products_equal_the_dequantized_weights_times_the_rounded_activations() {
        let (rows, n, k) = (7, 100, 512);
        let x = probe_values(rows * k, 11);
        for dtype in TYPES {
            let format = Format::of(dtype).unwrap();
            let (bytes, w) = weight(dtype, n, k, 12);
            let got = matmul_t(format, &bytes, n, k, &x, rows);
            let rounded: Vec<f32> = x
                .chunks_exact(k)
                .flat_map(|row| {
                    let q = blocks::quantize_q8_1(row);
                    q.qs.iter()
                        .enumerate()
                        .map(|(c, &v)| q.d(c / QK) * f32::from(v))
                        .collect::<Vec<_>>()
                })
                .collect();
            for i in 0..rows {
                for j in 0..n {
                    let terms = |x: &[f32]| {
                        let (mut sum, mut size) = (0f64, 0f64);
                        for c in 0..k {
                            let t = f64::from(w[j * k + c]) * f64::from(x[i * k + c]);
                            sum += t;
                            size += t.abs();
                        }
                        (sum, size)
                    };
                    let v = f64::from(got[i * n + j]);
                    let (want, size) = terms(&rounded);
                    assert!(
                        (v - want).abs() <= 1e-3 * size,
                        "{dtype:?} ({i}, {j}): {v} against {want} (terms {size})"
                    );
                    let (exact, size) = terms(&x);
                    assert!(
                        (v - exact).abs() <= 2e-2 * size,
                        "{dtype:?} ({i}, {j}): {v} against {exact} unrounded"
                    );
                }
            }
        }
    }

    /// The public weight gives the file-format product's bits from a QTensor (its rows
    /// unpacked at each product or once), and from f32 values the product of their Q8_0
    /// rounding; widths without whole blocks are refused.
    #[test]
    fn integer_weights_from_blocks_and_from_values() {
        let (rows, n, k) = (5, 70, 256);
        let x = probe_values(rows * k, 31);
        let w = Tensor::from_vec(probe_values(n * k, 32), (n, k), &Device::Cpu).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let q = QTensor::quantize(&w, GgmlDType::Q4K).unwrap();
        let of = IntegerWeight::of(&q).unwrap().unwrap();
        assert_eq!(of.dims(), (n, k));
        let bytes = q.data().unwrap();
        let want = bits(&matmul_t(Format::K(KFormat::Q4K), &bytes, n, k, &x, rows));
        assert_eq!(bits(&of.matmul_t(&x, rows)), want);
        assert_eq!(bits(&of.unpacked().matmul_t(&x, rows)), want);
        let values: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        let q8 = IntegerWeight::quantize(&values, n, k).unwrap().unwrap();
        let (q8_bytes, _) = weight(GgmlDType::Q8_0, n, k, 32);
        assert_eq!(
            bits(&q8.matmul_t(&x, rows)),
            bits(&matmul_t(Format::Q8_0, &q8_bytes, n, k, &x, rows))
        );
        assert!(IntegerWeight::quantize(&values[..n * 48], n, 48)
            .unwrap()
            .is_none());
        let f16 = QTensor::quantize(&w, GgmlDType::F16).unwrap();
        assert!(IntegerWeight::of(&f16).unwrap().is_none());
    }

    /// A Q8_0 byte of -128 (no quantizer writes one, a file may hold one) has no
    /// magnitude the AVX2 signed product takes: those rows run the portable loops, with
    /// the same bits.
    #[test]
    fn a_weight_of_minus_128_keeps_its_bits() {
        let (n, k, rows) = (40, 256, 3);
        let mut x = probe_values(rows * k, 41);
        let (mut bytes, _) = weight(GgmlDType::Q8_0, n, k, 42);
        // Feature 1, depth 37; negative activations there flip the weight's sign.
        bytes[Format::Q8_0.block_bytes() * 9 + 2 + 5] = 0x80;
        for i in 0..rows {
            x[i * k + 37] = -1.0;
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let portable = product(Format::Q8_0, &bytes, (n, k), &x, rows, Kernel::Portable);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let avx2 = product(Format::Q8_0, &bytes, (n, k), &x, rows, Kernel::Avx2);
            assert_eq!(bits(&avx2), bits(&portable));
        }
        assert_eq!(
            bits(&matmul_t(Format::Q8_0, &bytes, n, k, &x, rows)),
            bits(&portable)
        );
    }

    /// A row's outputs have the same bits whether it is multiplied alone or among up to
    /// fifteen others, and the same as the portable loops'.
    #[test]
    fn each_row_has_its_bits_alone_and_on_every_cpu() {
        let (n, k) = (80, 512);
        let x = probe_values(15 * k, 21);
        for dtype in TYPES {
            let format = Format::of(dtype).unwrap();
            let (bytes, _) = weight(dtype, n, k, 22);
            let all = matmul_t(format, &bytes, n, k, &x, 15);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let portable = bits(&product(format, &bytes, (n, k), &x, 15, Kernel::Portable));
            assert_eq!(
                bits(&all),
                portable,
                "{dtype:?}: kernel against the portable loops ({:?})",
                kernel()
            );
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                for rows in [15, 1, 2, 3] {
                    assert_eq!(
                        bits(&product(
                            format,
                            &bytes,
                            (n, k),
                            &x[..rows * k],
                            rows,
                            Kernel::Avx2
                        )),
                        portable[..rows * n],
                        "{dtype:?}: the AVX2 kernel against the portable loops, {rows} rows"
                    );
                }
            }
            for rows in 1..15 {
                let some = matmul_t(format, &bytes, n, k, &x[..rows * k], rows);
                assert_eq!(
                    bits(&some),
                    bits(&all[..rows * n]),
                    "{dtype:?}, {rows} rows"
                );
            }
        }
    }
}

//! Prefill's `x · wᵀ` on CPU: the same GEMM candle runs, split over the output features
//! on the engine's one thread pool.
//!
//! candle hands the GEMM to rayon's pool while every other kernel (attention, norms,
//! element-wise ops, decode) runs on its barrier pool. The barrier pool's worker spins a
//! while after each kernel waiting for the next, and with a GEMM next it spins on a core
//! that rayon's two threads need: on two cores a (512 x 576) · (576 x 576) projection ran
//! at 140 instead of 185 GFLOP/s that way. Here each task is one single-threaded GEMM
//! over a block of output features, so the GEMM runs on the threads that were spinning.
//!
//! Every output still comes out of the same micro-kernel with the same depth blocks
//! (gemm picks them from the depth alone), so the bits are those of candle's matmul,
//! and of the attention kernels that follow its blocking. Feature blocks are multiples
//! of the micro-kernel's 16 rows and wider than 64, below which gemm would change its
//! depth blocks.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use gemm::{gemm, Parallelism};

use crate::error::Result;

/// Output features per task: a multiple of 16 and over 64.
const FEATURES_PER_TASK: usize = 96;

/// `x` (rows, k) times `w` (n, k) transposed: (rows, n).
pub fn matmul_t(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == candle_core::DType::F32 {
        Ok(x.contiguous()?.apply_op2_no_bwd(w, &MatmulT)?)
    } else {
        Ok(x.matmul(&w.t()?)?)
    }
}

/// `x` (`rows`, `k`) times `w` (`n`, `k`) transposed, as a (`rows`, `n`) row-major
/// vector: [`matmul_t`] on slices, split over the output features on the engine's
/// thread pool. Rows computed in whole tiles of the micro-kernel (16 rows, from a
/// multiple of 16) get the same bits whatever rows they are computed with; a partial
/// tile goes through another kernel, whose last bits differ.
pub fn gemm_t(x: &[f32], rows: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert!(
        x.len() >= rows * k && w.len() >= n * k,
        "gemm_t: operands too short"
    );
    // SAFETY: w is (n, k) row-major and long enough (checked above): feature j's
    // weights start at j·k, one depth step apart.
    unsafe { split_gemm(x, rows, k, n, w.as_ptr(), |j| j * k, k as isize, 1) }
}

/// `x` (`rows`, `k`) times `w` (`k`, `n`), as a (`rows`, `n`) row-major vector, split
/// over the output columns on the engine's thread pool like [`gemm_t`]: the product a
/// backward pass needs to bring a gradient back through a `x · wᵀ` projection.
pub fn gemm_n(x: &[f32], rows: usize, w: &[f32], k: usize, n: usize) -> Vec<f32> {
    assert!(
        x.len() >= rows * k && w.len() >= n * k,
        "gemm_n: operands too short"
    );
    // SAFETY: w is (k, n) row-major and long enough (checked above): column j starts
    // at j, one depth step is a row of n.
    unsafe { split_gemm(x, rows, k, n, w.as_ptr(), |j| j, 1, n as isize) }
}

/// `x` (rows, k) times the (k, n) right-hand side whose element (d, j) is at
/// `w + at(j) + d · depth_stride` (`at` linear in j with `column_stride`), each task
/// computing a block of output columns with a single-threaded GEMM.
///
/// # Safety
/// `w` must be valid for every element so addressed, for d < k and j < n.
#[allow(clippy::too_many_arguments)]
unsafe fn split_gemm(
    x: &[f32],
    rows: usize,
    k: usize,
    n: usize,
    w: *const f32,
    at: impl Fn(usize) -> usize + Sync,
    column_stride: isize,
    depth_stride: isize,
) -> Vec<f32> {
    let mut out = vec![0f32; rows * n];
    if rows == 0 || n == 0 {
        return out;
    }
    let (x_ptr, w_ptr, out_ptr) = (x.as_ptr() as usize, w as usize, out.as_mut_ptr() as usize);
    let blocks = feature_blocks(n);
    super::pool::for_chunks(blocks.len(), |tasks| {
        for features in &blocks[tasks] {
            // SAFETY: x is (rows, k), contiguous (the callers check its length); each
            // task writes the output columns of its own features, within the (rows, n)
            // buffer that outlives the pool call; the right-hand side is the caller's
            // promise.
            unsafe {
                block_gemm(
                    (x_ptr, rows, k),
                    (out_ptr, n),
                    features,
                    (w_ptr as *const f32).add(at(features.start)),
                    column_stride,
                    depth_stride,
                )
            }
        }
    });
    out
}

/// One task's single-threaded GEMM: the output columns `features` of the (rows, n)
/// buffer at `out`, from `x` (rows, k) and the right-hand side's columns at `rhs`.
///
/// # Safety
/// `x` must be (rows, k) contiguous f32, `out` a (rows, n) f32 buffer no other task
/// writes these columns of, and `rhs` valid for (d, j) at `rhs + j·column_stride +
/// d·depth_stride` for d < k and j < features.len().
unsafe fn block_gemm(
    (x, rows, k): (usize, usize, usize),
    (out, n): (usize, usize),
    features: &std::ops::Range<usize>,
    rhs: *const f32,
    column_stride: isize,
    depth_stride: isize,
) {
    // SAFETY: the caller's promise.
    unsafe {
        gemm_single(
            (rows, features.len(), k),
            ((out as *mut f32).add(features.start), n as isize),
            (x as *const f32, k as isize, 1),
            (rhs, depth_stride, column_stride),
        )
    }
}

/// A single-threaded GEMM (candle's, as its matmul calls it): `dst` (m, n), rows
/// `dst_row` apart, = `lhs` (m, depth) times `rhs` (depth, n), each operand given as its
/// pointer, row stride and column stride in elements.
///
/// # Safety
/// Every element so addressed must be valid, and `dst`'s writable.
pub(crate) unsafe fn gemm_single(
    (m, n, depth): (usize, usize, usize),
    (dst, dst_row): (*mut f32, isize),
    (lhs, lhs_row, lhs_col): (*const f32, isize, isize),
    (rhs, rhs_row, rhs_col): (*const f32, isize, isize),
) {
    // SAFETY: the caller's promise.
    unsafe {
        gemm(
            m,
            n,
            depth,
            dst,
            1,
            dst_row,
            false,
            lhs,
            lhs_col,
            lhs_row,
            rhs,
            rhs_col,
            rhs_row,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

/// `x` (`rows`, `k`) times `w` (`n`, `k`) transposed without `w` in f32: `tile(features)`
/// gives the f32 rows of `w` for one block of output features (features × k, row-major),
/// made by the task that multiplies them, so only a block per thread is ever dense. The
/// blocks and the micro-kernel are [`gemm_t`]'s, so the result is bit for bit [`gemm_t`]'s
/// on the whole f32 matrix.
pub fn gemm_t_tiles<E: Send>(
    x: &[f32],
    rows: usize,
    n: usize,
    k: usize,
    tile: impl Fn(std::ops::Range<usize>) -> std::result::Result<Vec<f32>, E> + Sync,
) -> std::result::Result<Vec<f32>, E> {
    assert!(x.len() >= rows * k, "gemm_t_tiles: x too short");
    let mut out = vec![0f32; rows * n];
    if rows == 0 || n == 0 {
        return Ok(out);
    }
    let (x_ptr, out_ptr) = (x.as_ptr() as usize, out.as_mut_ptr() as usize);
    let blocks = feature_blocks(n);
    let failed = std::sync::Mutex::new(None);
    super::pool::for_chunks(blocks.len(), |tasks| {
        for features in &blocks[tasks] {
            let w = match tile(features.clone()) {
                Ok(w) if w.len() >= features.len() * k => w,
                Ok(_) => panic!(
                    "gemm_t_tiles: a tile of {} rows is too short",
                    features.len()
                ),
                Err(e) => {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    return;
                }
            };
            // SAFETY: as in split_gemm; the tile is (features, k) row-major and lives
            // until the product is done.
            unsafe {
                block_gemm(
                    (x_ptr, rows, k),
                    (out_ptr, n),
                    features,
                    w.as_ptr(),
                    k as isize,
                    1,
                )
            }
        }
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

struct MatmulT;

/// Feature ranges of the tasks: 96 wide, the last one taking a remainder of 64 or less.
fn feature_blocks(n: usize) -> Vec<std::ops::Range<usize>> {
    let mut blocks = Vec::with_capacity(n / FEATURES_PER_TASK + 1);
    let mut start = 0;
    while start < n {
        let end = if n - start <= FEATURES_PER_TASK + 64 {
            n
        } else {
            start + FEATURES_PER_TASK
        };
        blocks.push(start..end);
        start = end;
    }
    blocks
}

impl CustomOp2 for MatmulT {
    fn name(&self) -> &'static str {
        "matmul-t"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(w)) = (xs, ws) else {
            candle_core::bail!("matmul-t expects f32 tensors")
        };
        let (Some((x0, _)), Some((w0, _))) = (xl.contiguous_offsets(), wl.contiguous_offsets())
        else {
            candle_core::bail!("matmul-t expects contiguous tensors")
        };
        let (m, k) = xl.shape().dims2()?;
        let (n, wk) = wl.shape().dims2()?;
        if k != wk {
            candle_core::bail!("matmul-t: ({m}, {k}) times ({n}, {wk}) transposed")
        }
        let out = gemm_t(&x[x0..], m, &w[w0..], n, k);
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    #[test]
    fn blocks_cover_the_features_and_stay_over_64_wide() {
        for n in [1, 64, 96, 160, 161, 192, 576, 960, 1000, 3072] {
            let blocks = super::feature_blocks(n);
            assert_eq!(blocks.first().map(|b| b.start), Some(0));
            assert_eq!(blocks.last().map(|b| b.end), Some(n));
            for pair in blocks.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
            }
            for b in &blocks {
                assert!(b.len() > 64 || b.len() == n, "{n}: {b:?}");
                assert_eq!(b.start % 16, 0);
            }
        }
    }

    /// Values in [-1, 1) from a linear congruential generator.
    fn uniform(mut seed: u32) -> impl FnMut() -> f32 {
        move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// Whole tiles of rows give the same bits whatever rows they are computed with: the
    /// rows of a block, computed alone, give the block's bits (what packing texts for
    /// the embedder relies on).
    #[test]
    fn a_rows_product_does_not_depend_on_the_other_rows() {
        let mut next = uniform(5);
        for (k, n) in [(384, 1152), (384, 384), (1536, 384), (384, 1536)] {
            let rows = 512;
            let x: Vec<f32> = (0..rows * k).map(|_| next()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
            let all = super::gemm_t(&x, rows, &w, n, k);
            let mut start = 0;
            for len in [16, 32, 64, 80, 96, 224] {
                let part = super::gemm_t(&x[start * k..], len, &w, n, k);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&part),
                    bits(&all[start * n..(start + len) * n]),
                    "rows {start}..{} of ({rows}, {k}) x ({n}, {k})ᵀ",
                    start + len
                );
                start += len;
            }
        }
    }

    /// `gemm_n` is `x · w` for a row-major `w`, whatever the split.
    #[test]
    fn gemm_n_multiplies_by_the_untransposed_weight() {
        let mut next = uniform(3);
        for (m, k, n) in [(1, 7, 5), (37, 576, 1536), (20, 1536, 576), (64, 960, 576)] {
            let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let w: Vec<f32> = (0..k * n).map(|_| next()).collect();
            let got = super::gemm_n(&x, m, &w, k, n);
            let x = Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap();
            let w = Tensor::from_vec(w, (k, n), &Device::Cpu).unwrap();
            let want: Vec<f32> = x
                .matmul(&w)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "({m}, {k}) x ({k}, {n}): {worst}");
        }
    }

    /// The split GEMM gives candle's matmul bit for bit: the model's widths and depths
    /// (several depth blocks at 1,536), row counts from the smallest dense prefill (16)
    /// through ones that are no multiple of the micro-kernel, and a ragged last block.
    #[test]
    fn split_gemm_equals_candles_matmul_bit_for_bit() {
        let mut next = uniform(11);
        for (m, k, n) in [
            (16, 576, 960),
            (37, 576, 576),
            (130, 1536, 576),
            (200, 576, 1000),
            (512, 576, 3072),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
            let x = Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap();
            let w = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            let split = super::matmul_t(&x, &w).unwrap();
            let reference = x.matmul(&w.t().unwrap()).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                t.flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(bits(&split), bits(&reference), "({m}, {k}) x ({n}, {k})ᵀ");
        }
    }
}

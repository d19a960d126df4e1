//! Attention for a few query rows (decoding, drafts being verified), reading the key/value
//! cache where it lies instead of through matmuls that pack and copy it on every call.
//!
//! The sums run in exactly the order of the matmul path ([`super::attention`]), so a row
//! gives the same bits either way and greedy outputs do not move:
//! - a score is one fused multiply-add chain over the head dimension, from zero, as in the
//!   GEMM micro-kernel (one depth block: the head dimension is far below its block size);
//! - a weighted sum of values runs over the keys in blocks of [`VALUE_BLOCK`], each block
//!   one chain from zero, the blocks added in order, as the GEMM does for an output of at
//!   most 64 × 64 (the block size is then fixed, not derived from the cache sizes);
//! - keys a row may not see get probability zero and are summed all the same.
//!
//! Shapes for which the GEMM takes another route (a single row, tiny products, larger
//! heads) stay on the matmul path: see [`applies`]. Built for x86-64 with AVX2 and FMA,
//! whose GEMM kernels these orders are.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape};

use super::attention::softmax_in_place;

/// Fewer query rows than this per head may come here: the bound of the projections'
/// decode kernels, so that a row is computed one way whether decoded or resumed from a
/// cached prefix.
pub(crate) const FEW_ROWS: usize = super::linear::DENSE_MIN_ROWS;
/// Depth block of the GEMM for an output of at most 64 × 64.
const VALUE_BLOCK: usize = 512;
/// Keys scored per parallel work item.
const KEY_CHUNK: usize = 128;
/// The GEMM's small-output bound (rows and columns) below which its block size is fixed.
const SMALL_OUTPUT: usize = 64;
/// Products of at most this many outputs take the GEMM's horizontal kernel instead.
const HORIZONTAL_MAX: usize = 16 * 16;

/// Whether `rows` query rows (all heads of one key/value head) of dimension `d` against
/// `keys` keys run here with the matmul's exact sums.
pub(crate) fn applies(rows: usize, keys: usize, d: usize) -> bool {
    (2..=SMALL_OUTPUT).contains(&rows)
        && rows * keys > HORIZONTAL_MAX
        && d <= SMALL_OUTPUT
        && d.is_multiple_of(32)
}

/// Attention of `t` query rows per head at positions `offset..offset + t` against a cache
/// of `offset + t` keys. Inputs (b, n_head, t, d) and (b, n_kv, keys, d); out (b, n_head, t, d).
pub(crate) struct FewRows {
    pub(crate) offset: usize,
    pub(crate) scale: f32,
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
        let rows = n_head / n_kv * t;
        if !applies(rows, keys, d) || self.offset + t != keys {
            candle_core::bail!("few-rows-attention: {rows} rows of {d} against {keys} keys")
        }
        let Some((q0, _)) = ql.contiguous_offsets() else {
            candle_core::bail!("few-rows-attention expects a contiguous query")
        };
        // Keys and values may be views of a longer cache: positions d apart, heads strided.
        let (kst, vst) = (kl.stride(), vl.stride());
        if kst[3] != 1 || vst[3] != 1 || kst[2] != d || vst[2] != d {
            candle_core::bail!("few-rows-attention expects cache rows of {d} contiguous values")
        }
        let heads = b * n_kv;
        let base =
            |st: &[usize], start: usize, h: usize| start + h / n_kv * st[0] + h % n_kv * st[1];
        let pool = candle_core::utils::barrier_pool();

        // Scores: (heads, rows, keys), every key of a chunk against all rows of its head.
        let mut scores = vec![0f32; heads * rows * keys];
        let chunks = keys.div_ceil(KEY_CHUNK);
        let scores_ptr = scores.as_mut_ptr() as usize;
        pool.execute_chunked(heads * chunks, |range| {
            for unit in range {
                let (h, chunk) = (unit / chunks, unit % chunks);
                let from = chunk * KEY_CHUNK;
                let to = keys.min(from + KEY_CHUNK);
                let query = &q[q0 + h * rows * d..q0 + (h + 1) * rows * d];
                let kbase = base(kst, kl.start_offset(), h);
                // SAFETY: each unit writes columns from..to of its own head's rows only.
                unsafe {
                    let dst = (scores_ptr as *mut f32).add(h * rows * keys);
                    avx2::score_chunk(query, &k[kbase..kbase + keys * d], d, from..to, dst, keys);
                }
            }
        });

        // Causal softmax of every row, exactly as on the matmul path.
        let ptr = scores_ptr;
        pool.execute_chunked(heads * rows, |range| {
            for r in range {
                // SAFETY: rows are disjoint slices of `scores`, each visited by one task.
                let row = unsafe {
                    std::slice::from_raw_parts_mut((ptr as *mut f32).add(r * keys), keys)
                };
                let seen = (self.offset + r % rows % t + 1).min(keys);
                let (seen, hidden) = row.split_at_mut(seen);
                softmax_in_place(seen, self.scale);
                hidden.fill(0.0);
            }
        });

        // Weighted sums of values: per head, 32 columns per work item.
        let mut out = vec![0f32; heads * rows * d];
        let out_ptr = out.as_mut_ptr() as usize;
        let col_blocks = d / 32;
        pool.execute_chunked(heads * col_blocks, |range| {
            for unit in range {
                let (h, col) = (unit / col_blocks, unit % col_blocks * 32);
                let vbase = base(vst, vl.start_offset(), h) + col;
                let probs = &scores[h * rows * keys..(h + 1) * rows * keys];
                // SAFETY: each unit writes columns col..col + 32 of its own head's rows.
                unsafe {
                    let dst = (out_ptr as *mut f32).add(h * rows * d + col);
                    avx2::weighted_sums(probs, keys, v[vbase..].as_ptr(), d, dst);
                }
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((b, n_head, t, d))))
    }
}

mod avx2 {
    use std::arch::x86_64::*;

    use super::VALUE_BLOCK;

    /// Keys per tile: two vectors of eight, transposed so that lanes are keys.
    const TILE: usize = 16;
    /// Rows sharing one pass over a tile.
    const ROW_GROUP: usize = 4;

    /// Scores of keys `range` against every row of `query` (rows of `d`), into `dst` (rows
    /// of `stride`).
    ///
    /// # Safety
    /// `dst` must hold `query.len() / d` rows of `stride` values, columns `range` writable;
    /// `d` a multiple of 8 and at most 64.
    pub(super) unsafe fn score_chunk(
        query: &[f32],
        keys: &[f32],
        d: usize,
        range: std::ops::Range<usize>,
        dst: *mut f32,
        stride: usize,
    ) {
        let rows = query.len() / d;
        // The tile transposed: tile[c * TILE + l] = key (j + l), value c.
        let mut tile = [0f32; 64 * TILE];
        let mut padded = [0f32; 64 * TILE];
        let mut j = range.start;
        while j < range.end {
            let n = TILE.min(range.end - j);
            // SAFETY: whole tiles read n = 16 rows inside `keys`; a last partial tile is
            // copied into a zero-padded buffer first. Writes stay in row i, columns j..j + n.
            unsafe {
                let src = if n == TILE {
                    keys.as_ptr().add(j * d)
                } else {
                    padded[..n * d].copy_from_slice(&keys[j * d..(j + n) * d]);
                    padded[n * d..TILE * d].fill(0.0);
                    padded.as_ptr()
                };
                transpose_tile(src, d, &mut tile);
                let mut i = 0;
                while i < rows {
                    let g = ROW_GROUP.min(rows - i);
                    let q = query.as_ptr().add(i * d);
                    let sums = match g {
                        4 => dots::<4>(q, d, &tile),
                        3 => pad(dots::<3>(q, d, &tile)),
                        2 => pad(dots::<2>(q, d, &tile)),
                        _ => pad(dots::<1>(q, d, &tile)),
                    };
                    for (r, s) in sums.iter().take(g).enumerate() {
                        let row = dst.add((i + r) * stride + j);
                        if n == TILE {
                            _mm256_storeu_ps(row, s[0]);
                            _mm256_storeu_ps(row.add(8), s[1]);
                        } else {
                            let mut lanes = [0f32; TILE];
                            _mm256_storeu_ps(lanes.as_mut_ptr(), s[0]);
                            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), s[1]);
                            std::ptr::copy_nonoverlapping(lanes.as_ptr(), row, n);
                        }
                    }
                    i += g;
                }
            }
            j += n;
        }
    }

    fn pad<const G: usize>(s: [[__m256; 2]; G]) -> [[__m256; 2]; ROW_GROUP] {
        // SAFETY: AVX is compiled in.
        let mut out = [[unsafe { _mm256_setzero_ps() }; 2]; ROW_GROUP];
        out[..G].copy_from_slice(&s);
        out
    }

    /// `G` rows of `q` (rows of `d`) against the 16 keys of `tile`: per key and row one
    /// multiply-add chain over c = 0..d from zero.
    ///
    /// # Safety
    /// `q` must point to `G * d` readable values.
    #[inline(always)]
    unsafe fn dots<const G: usize>(
        q: *const f32,
        d: usize,
        tile: &[f32; 64 * TILE],
    ) -> [[__m256; 2]; G] {
        // SAFETY: c < d <= 64 keeps tile reads in bounds; q reads stay in its G rows.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for c in 0..d {
                let k0 = _mm256_loadu_ps(tile.as_ptr().add(c * TILE));
                let k1 = _mm256_loadu_ps(tile.as_ptr().add(c * TILE + 8));
                for (r, a) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*q.add(r * d + c));
                    a[0] = _mm256_fmadd_ps(x, k0, a[0]);
                    a[1] = _mm256_fmadd_ps(x, k1, a[1]);
                }
            }
            acc
        }
    }

    /// Transposes 16 rows of `d` values (`src`, rows `d` apart) into `tile`.
    ///
    /// # Safety
    /// `src` must point to 16 rows of `d` readable values, `d` a multiple of 8, at most 64.
    #[inline(always)]
    unsafe fn transpose_tile(src: *const f32, d: usize, tile: &mut [f32; 64 * TILE]) {
        // SAFETY: reads stay within the 16 rows; writes within tile (c < 64).
        unsafe {
            for half in 0..2 {
                let rows: [*const f32; 8] = std::array::from_fn(|r| src.add((half * 8 + r) * d));
                for c0 in (0..d).step_by(8) {
                    // Row pairs (r, r + 4) share a register: low lane row r, high lane r + 4.
                    let pair = |r: usize, at: usize| {
                        _mm256_insertf128_ps::<1>(
                            _mm256_castps128_ps256(_mm_loadu_ps(rows[r].add(at))),
                            _mm_loadu_ps(rows[r + 4].add(at)),
                        )
                    };
                    for part in 0..2 {
                        let at = c0 + 4 * part;
                        let (r0, r1, r2, r3) = (pair(0, at), pair(1, at), pair(2, at), pair(3, at));
                        let t0 = _mm256_unpacklo_ps(r0, r1);
                        let t1 = _mm256_unpackhi_ps(r0, r1);
                        let t2 = _mm256_unpacklo_ps(r2, r3);
                        let t3 = _mm256_unpackhi_ps(r2, r3);
                        let cols = [
                            _mm256_shuffle_ps::<0x44>(t0, t2),
                            _mm256_shuffle_ps::<0xEE>(t0, t2),
                            _mm256_shuffle_ps::<0x44>(t1, t3),
                            _mm256_shuffle_ps::<0xEE>(t1, t3),
                        ];
                        for (x, col) in cols.iter().enumerate() {
                            _mm256_storeu_ps(
                                tile.as_mut_ptr().add((at + x) * TILE + half * 8),
                                *col,
                            );
                        }
                    }
                }
            }
        }
    }

    /// `dst[i][0..32] = sum_j probs[i][j] * values[j][0..32]` for every row i of `probs`
    /// (rows of `keys`), values `d` apart, summed in [`VALUE_BLOCK`] blocks.
    ///
    /// # Safety
    /// `values` must point to `keys` rows of 32 readable values `d` apart; `dst` to rows of
    /// 32 writable values `d` apart, one per row of `probs`.
    pub(super) unsafe fn weighted_sums(
        probs: &[f32],
        keys: usize,
        values: *const f32,
        d: usize,
        dst: *mut f32,
    ) {
        let rows = probs.len() / keys;
        let mut i = 0;
        while i < rows {
            let g = 3.min(rows - i);
            // SAFETY: forwarded; rows i..i + g exist in probs and dst.
            unsafe {
                match g {
                    3 => rows_sum::<3>(&probs[i * keys..], keys, values, d, dst.add(i * d)),
                    2 => rows_sum::<2>(&probs[i * keys..], keys, values, d, dst.add(i * d)),
                    _ => rows_sum::<1>(&probs[i * keys..], keys, values, d, dst.add(i * d)),
                }
            }
            i += g;
        }
    }

    /// `G` rows of `probs` (rows of `keys`) times the values, 32 columns, in blocks.
    ///
    /// # Safety
    /// As [`weighted_sums`] for `G` rows.
    #[inline(always)]
    unsafe fn rows_sum<const G: usize>(
        probs: &[f32],
        keys: usize,
        values: *const f32,
        d: usize,
        dst: *mut f32,
    ) {
        // SAFETY: j < keys rows of values; dst rows r < G, 32 columns each.
        unsafe {
            let mut total = [[_mm256_setzero_ps(); 4]; G];
            let mut from = 0;
            while from < keys {
                let to = keys.min(from + VALUE_BLOCK);
                let mut acc = [[_mm256_setzero_ps(); 4]; G];
                for j in from..to {
                    let row = values.add(j * d);
                    let x = [
                        _mm256_loadu_ps(row),
                        _mm256_loadu_ps(row.add(8)),
                        _mm256_loadu_ps(row.add(16)),
                        _mm256_loadu_ps(row.add(24)),
                    ];
                    for (r, a) in acc.iter_mut().enumerate() {
                        let p = _mm256_broadcast_ss(probs.get_unchecked(r * keys + j));
                        for (lane, xv) in a.iter_mut().zip(&x) {
                            *lane = _mm256_fmadd_ps(p, *xv, *lane);
                        }
                    }
                }
                // The first block is the result; later ones are added to it.
                for (t, a) in total.iter_mut().zip(&acc) {
                    for (tv, av) in t.iter_mut().zip(a) {
                        *tv = if from == 0 {
                            *av
                        } else {
                            _mm256_add_ps(*tv, *av)
                        };
                    }
                }
                from = to;
            }
            for (r, t) in total.iter().enumerate() {
                for (c, tv) in t.iter().enumerate() {
                    _mm256_storeu_ps(dst.add(r * d + 8 * c), *tv);
                }
            }
        }
    }
}

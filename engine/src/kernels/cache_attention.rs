//! Causal attention that reads the key/value cache where it lies, instead of through
//! matmuls that pack and copy it on every call and a score matrix allocated per block.
//!
//! The sums run in exactly the order of the matmul path ([`super::attention`]), so every
//! row gives the same bits either way and greedy outputs do not move:
//! - queries go in the same blocks, each block's scores against the keys up to its end;
//! - a score is one fused multiply-add chain over the head dimension, from zero, as in the
//!   GEMM micro-kernel (one depth block: the head dimension is far below its block size);
//! - a weighted sum of values runs over the keys in the GEMM's depth blocks for that
//!   product ([`value_block`]), each block one chain from zero, the blocks added in order;
//! - keys a row may not see get probability zero and are summed all the same.
//!
//! Shapes for which the GEMM takes another route (a single row, tiny products, larger
//! heads) stay on the matmul path: see [`applies`]. Built for x86-64 with AVX2 and FMA,
//! whose GEMM kernels (16 x 6 f32 tiles) these orders are.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape};

use super::softmax::softmax_in_place;

/// Depth block of the GEMM for an output of at most 64 x 64.
const SMALL_VALUE_BLOCK: usize = 512;
/// The GEMM's small-output bound (rows and columns) below which its depth block is fixed.
const SMALL_OUTPUT: usize = 64;
/// Products of at most this many outputs take the GEMM's horizontal kernel instead.
const HORIZONTAL_MAX: usize = 16 * 16;
/// Rows and columns of the GEMM's f32 micro-kernel tile with AVX2 and FMA.
const GEMM_TILE: (usize, usize) = (16, 6);
/// Keys scored per parallel work item.
const KEY_CHUNK: usize = 128;
/// Query rows per parallel work item of the weighted sums (a multiple of 3).
const ROW_CHUNK: usize = 24;

/// Whether a block of `rows` query rows (all heads of one key/value head) of dimension `d`
/// against `keys` keys runs here with the matmul's exact sums.
pub(crate) fn applies(rows: usize, keys: usize, d: usize) -> bool {
    rows >= 2 && rows * keys > HORIZONTAL_MAX && d <= SMALL_OUTPUT && d.is_multiple_of(32)
}

/// The GEMM's depth block for `probs (rows, keys) x values (keys, d)`: it computes the
/// transposed product (d x rows), whose depth block is fixed for small outputs and else
/// derived from the CPU's caches.
fn value_block(rows: usize, keys: usize, d: usize) -> usize {
    if d <= SMALL_OUTPUT && rows <= SMALL_OUTPUT {
        keys.min(SMALL_VALUE_BLOCK)
    } else {
        let (mr, nr) = GEMM_TILE;
        gemm_common::cache::kernel_params(d, rows, keys, mr, nr, std::mem::size_of::<f32>()).kc
    }
}

/// Attention of `t` query rows per head at positions `offset..offset + t` against a cache
/// of `offset + t` keys, in blocks of `block` queries. Inputs (b, n_head, t, d) and
/// (b, n_kv, keys, d); out (b, n_head, t, d).
pub(crate) struct CacheAttention {
    pub(crate) offset: usize,
    pub(crate) scale: f32,
    pub(crate) block: usize,
}

impl CacheAttention {
    /// Whether every query block of this call [`applies`].
    pub(crate) fn applies(&self, group: usize, t: usize, d: usize) -> bool {
        (0..t).step_by(self.block.max(1)).all(|start| {
            let len = self.block.min(t - start);
            applies(group * len, self.offset + start + len, d)
        })
    }
}

thread_local! {
    /// Scores of the current block, reused across calls (grown, never shrunk).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The dimensions of a call, checked: batch, query heads, key/value heads, queries,
/// head width, the query's offset in its storage, and the strides of keys and values.
struct Shapes {
    b: usize,
    n_head: usize,
    n_kv: usize,
    t: usize,
    d: usize,
    q0: usize,
    kst: Vec<usize>,
    vst: Vec<usize>,
}

impl CacheAttention {
    /// Checks that the query, keys and values fit this op: shapes that agree, a
    /// contiguous query, and cache rows of `d` contiguous values (keys and values may be
    /// views of a longer cache: positions d apart, heads strided).
    fn shapes(&self, ql: &Layout, kl: &Layout, vl: &Layout) -> candle_core::Result<Shapes> {
        let (b, n_head, t, d) = ql.shape().dims4()?;
        let (kb, n_kv, keys, kd) = kl.shape().dims4()?;
        if kb != b || kd != d || vl.shape() != kl.shape() || n_kv == 0 || n_head % n_kv != 0 {
            candle_core::bail!(
                "cache-attention: q {:?} does not match k {:?} / v {:?}",
                ql.dims(),
                kl.dims(),
                vl.dims()
            )
        }
        if !self.applies(n_head / n_kv, t, d) || self.offset + t != keys {
            candle_core::bail!("cache-attention: {t} queries of {d} against {keys} keys")
        }
        let Some((q0, _)) = ql.contiguous_offsets() else {
            candle_core::bail!("cache-attention expects a contiguous query")
        };
        let (kst, vst) = (kl.stride().to_vec(), vl.stride().to_vec());
        if kst[3] != 1 || vst[3] != 1 || kst[2] != d || vst[2] != d {
            candle_core::bail!("cache-attention expects cache rows of {d} contiguous values")
        }
        Ok(Shapes {
            b,
            n_head,
            n_kv,
            t,
            d,
            q0,
            kst,
            vst,
        })
    }
}

/// The scores of every head's `rows` queries (`queries`, head after head) against its
/// first `keys` keys (head h's start at `k_at(h)` in `k`), written to the scores at
/// `scores_ptr` (head h's rows from `h * rows * keys`), one work item per chunk of keys.
fn score_chunks(
    queries: &[f32],
    k: &[f32],
    k_at: &(dyn Fn(usize) -> usize + Sync),
    (heads, rows, keys, d): (usize, usize, usize, usize),
    scores_ptr: usize,
) {
    let chunks = keys.div_ceil(KEY_CHUNK);
    super::pool::for_chunks(heads * chunks, |range| {
        for unit in range {
            let (h, chunk) = (unit / chunks, unit % chunks);
            let from = chunk * KEY_CHUNK;
            let to = keys.min(from + KEY_CHUNK);
            let query = &queries[h * rows * d..(h + 1) * rows * d];
            let at = k_at(h);
            // SAFETY: each unit writes columns from..to of its own head's rows.
            unsafe {
                let dst = (scores_ptr as *mut f32).add(h * rows * keys);
                avx2::score_chunk(query, &k[at..at + keys * d], d, from..to, dst, keys);
            }
        }
    });
}

impl CustomOp3 for CacheAttention {
    fn name(&self) -> &'static str {
        "cache-attention"
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
            candle_core::bail!("cache-attention expects f32 tensors")
        };
        let Shapes {
            b,
            n_head,
            n_kv,
            t,
            d,
            q0,
            kst,
            vst,
        } = self.shapes(ql, kl, vl)?;
        let group = n_head / n_kv;
        let heads = b * n_kv;
        let k_at = |h: usize| kl.start_offset() + h / n_kv * kst[0] + h % n_kv * kst[1];
        let v_at = |h: usize| vl.start_offset() + h / n_kv * vst[0] + h % n_kv * vst[1];
        // Query row i of a block of `len` (head g = i / len of the group, position
        // start + i % len) of key/value head h, as an index of q and of the output.
        let row_at = |h: usize, i: usize, start: usize, len: usize| {
            ((h * group + i / len) * t + start + i % len) * d
        };
        let mut out = vec![0f32; b * n_head * t * d];
        let out_ptr = out.as_mut_ptr() as usize;
        let mut start = 0;
        while start < t {
            let len = self.block.min(t - start);
            let (rows, seen_by_block) = (group * len, self.offset + start + len);
            let mut queries = Vec::with_capacity(heads * rows * d);
            for r in 0..heads * rows {
                let at = q0 + row_at(r / rows, r % rows, start, len);
                queries.extend_from_slice(&q[at..at + d]);
            }
            SCORES.with(|cell| {
                let mut scores = cell.borrow_mut();
                let n = heads * rows * seen_by_block;
                if scores.len() < n {
                    scores.resize(n, 0.0);
                }
                let keys = seen_by_block;
                let scores_ptr = scores.as_mut_ptr() as usize;

                // Scores: every key of a chunk against all rows of its head.
                score_chunks(&queries, k, &k_at, (heads, rows, keys, d), scores_ptr);

                // Causal softmax of every row, exactly as on the matmul path.
                let first = self.offset + start;
                super::pool::for_chunks(heads * rows, |range| {
                    for r in range {
                        // SAFETY: rows are disjoint slices of the scores, one task each.
                        let row = unsafe {
                            std::slice::from_raw_parts_mut(
                                (scores_ptr as *mut f32).add(r * keys),
                                keys,
                            )
                        };
                        let (seen, hidden) =
                            row.split_at_mut((first + r % rows % len + 1).min(keys));
                        softmax_in_place(seen, self.scale);
                        hidden.fill(0.0);
                    }
                });

                // Weighted sums of values: 32 columns of a chunk of rows per work item.
                let kc = value_block(rows, keys, d);
                let (col_blocks, row_chunks) = (d / 32, rows.div_ceil(ROW_CHUNK));
                let scores = &scores[..n];
                super::pool::for_chunks(heads * col_blocks * row_chunks, |range| {
                    let mut sums = [0f32; ROW_CHUNK * 32];
                    for unit in range {
                        let h = unit / (col_blocks * row_chunks);
                        let col = unit / row_chunks % col_blocks * 32;
                        let from = unit % row_chunks * ROW_CHUNK;
                        let to = rows.min(from + ROW_CHUNK);
                        let probs = &scores[(h * rows + from) * keys..(h * rows + to) * keys];
                        // SAFETY: values of head h, columns col..col + 32 of every key; the
                        // sums buffer holds ROW_CHUNK rows of 32.
                        unsafe {
                            let values = avx2::Values {
                                at: v[v_at(h) + col..].as_ptr(),
                                stride: d,
                                keys,
                                block: kc,
                            };
                            avx2::weighted_sums(probs, &values, sums.as_mut_ptr());
                        }
                        for i in from..to {
                            let at = row_at(h, i, start, len) + col;
                            // SAFETY: output row i of head h, columns col..col + 32, is
                            // written by this unit only, inside `out`.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    sums.as_ptr().add((i - from) * 32),
                                    (out_ptr as *mut f32).add(at),
                                    32,
                                );
                            }
                        }
                    }
                });
            });
            start += len;
        }
        Ok((CpuStorage::F32(out), Shape::from((b, n_head, t, d))))
    }
}

mod avx2 {
    use std::arch::x86_64::*;

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
                    let (q, out) = (query.as_ptr().add(i * d), dst.add(i * stride + j));
                    match g {
                        4 => dots::<4>(q, d, &tile, out, stride, n),
                        3 => dots::<3>(q, d, &tile, out, stride, n),
                        2 => dots::<2>(q, d, &tile, out, stride, n),
                        _ => dots::<1>(q, d, &tile, out, stride, n),
                    }
                    i += g;
                }
            }
            j += n;
        }
    }

    /// `G` rows of `q` (rows of `d`) against the first `n` of the 16 keys of `tile`, into
    /// `out` (rows `stride` apart): per key and row one multiply-add chain over c = 0..d
    /// from zero.
    ///
    /// # Safety
    /// `q` must point to `G * d` readable values, `out` to `G` rows of `n` writable ones.
    #[inline(always)]
    unsafe fn dots<const G: usize>(
        q: *const f32,
        d: usize,
        tile: &[f32; 64 * TILE],
        out: *mut f32,
        stride: usize,
        n: usize,
    ) {
        // SAFETY: c < d <= 64 keeps tile reads in bounds; q reads stay in its G rows,
        // writes in the caller's G rows of n.
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
            for (r, a) in acc.iter().enumerate() {
                let row = out.add(r * stride);
                if n == TILE {
                    _mm256_storeu_ps(row, a[0]);
                    _mm256_storeu_ps(row.add(8), a[1]);
                } else {
                    let mut lanes = [0f32; TILE];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), a[0]);
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a[1]);
                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), row, n);
                }
            }
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

    /// 32 columns of the values of every key, rows `stride` apart, summed in blocks of
    /// `block` keys.
    #[derive(Clone, Copy)]
    pub(super) struct Values {
        pub(super) at: *const f32,
        pub(super) stride: usize,
        pub(super) keys: usize,
        pub(super) block: usize,
    }

    /// `dst[i][0..32] = sum_j probs[i][j] * values[j][0..32]` for every row i of `probs`
    /// (rows of `values.keys`).
    ///
    /// # Safety
    /// `values.at` must point to `keys` rows of 32 readable values; `dst` to 32 writable
    /// values per row of `probs`.
    pub(super) unsafe fn weighted_sums(probs: &[f32], values: &Values, dst: *mut f32) {
        let keys = values.keys;
        let rows = probs.len() / keys;
        let mut i = 0;
        while i < rows {
            let g = 3.min(rows - i);
            // SAFETY: forwarded; rows i..i + g exist in probs and dst.
            unsafe {
                match g {
                    3 => rows_sum::<3>(&probs[i * keys..], values, dst.add(i * 32)),
                    2 => rows_sum::<2>(&probs[i * keys..], values, dst.add(i * 32)),
                    _ => rows_sum::<1>(&probs[i * keys..], values, dst.add(i * 32)),
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
    unsafe fn rows_sum<const G: usize>(probs: &[f32], values: &Values, dst: *mut f32) {
        let Values {
            at,
            stride,
            keys,
            block,
        } = *values;
        // SAFETY: j < keys rows of values; dst rows r < G, 32 columns each.
        unsafe {
            let mut total = [[_mm256_setzero_ps(); 4]; G];
            let mut from = 0;
            while from < keys {
                let to = keys.min(from + block);
                let mut acc = [[_mm256_setzero_ps(); 4]; G];
                for j in from..to {
                    let row = at.add(j * stride);
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
                    _mm256_storeu_ps(dst.add(r * 32 + 8 * c), *tv);
                }
            }
        }
    }
}

//! A LoRA adapter kept beside the weights rather than merged into them: each call of a
//! layer chooses whether to add it, so the memory writer's calls run with the adapter it
//! was trained for while answers run the base model, from one copy of the weights.

use candle_core::Tensor;

use crate::error::{Error, Result};

/// `y += (x Aᵀ) Bᵀ` for one layer, whose output may stack several projections (q/k/v,
/// gate/up), each with its own A and B: A stacks every part's rows (R, k), B is block
/// diagonal (n, R), zero where a part's output takes another part's rank.
pub(crate) struct LowRank {
    k: usize,
    n: usize,
    r: usize,
    /// (R, k), row-major, on the CPU.
    a: Vec<f32>,
    /// Bᵀ (R, n), row-major, on the CPU.
    bt: Vec<f32>,
    /// Each adapted part's ranks and outputs: only these blocks of Bᵀ are non-zero.
    blocks: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

impl LowRank {
    /// The update of a layer of parts of `rows[i]` outputs each, from each adapted part's
    /// (A (r, k), B (rows, r)); `None` for a part the adapter leaves alone. `None` when no
    /// part is adapted. Computed on the CPU, for a model on the CPU.
    pub(crate) fn new(
        k: usize,
        rows: &[usize],
        parts: Vec<Option<(Tensor, Tensor)>>,
    ) -> Result<Option<Self>> {
        let r: usize = parts
            .iter()
            .flatten()
            .map(|(a, _)| a.dim(0))
            .sum::<candle_core::Result<usize>>()?;
        if r == 0 {
            return Ok(None);
        }
        let n: usize = rows.iter().sum();
        let mut a = Vec::with_capacity(r * k);
        let mut bt = vec![0f32; r * n];
        let mut blocks = Vec::new();
        let (mut row, mut rank) = (0, 0);
        for (part, &rows) in parts.into_iter().zip(rows) {
            if let Some((pa, pb)) = part {
                let (pr, pk) = pa.dims2()?;
                if pk != k || pb.dims2()? != (rows, pr) {
                    return Err(Error::InvalidRequest(format!(
                        "adapter shapes A {:?} and B {:?} do not fit a projection of {rows} \
                         outputs and {k} inputs",
                        pa.dims(),
                        pb.dims()
                    )));
                }
                a.extend(pa.flatten_all()?.to_vec1::<f32>()?);
                let pb = pb.to_vec2::<f32>()?;
                for (i, values) in pb.iter().enumerate() {
                    for (j, &v) in values.iter().enumerate() {
                        bt[(rank + j) * n + row + i] = v;
                    }
                }
                blocks.push((rank..rank + pr, row..row + rows));
                rank += pr;
            }
            row += rows;
        }
        Ok(Some(Self {
            k,
            n,
            r,
            a,
            bt,
            blocks,
        }))
    }

    /// `y + (x Aᵀ) Bᵀ` for `x` (..., k) and `y` (..., n) on the CPU, written into `y`.
    /// Each row is computed alone, the same way whatever the number of rows (its update
    /// summed from zero, then added to it), so adding it keeps a layer's rows exact.
    pub(crate) fn add_to(&self, y: &Tensor, x: &Tensor) -> Result<()> {
        y.inplace_op2(x, self)?;
        Ok(())
    }

    /// Adds the update of each row of `x` to the same row of `y`.
    fn add_rows(&self, y: &mut [f32], x: &[f32]) {
        let rows = x.len() / self.k.max(1);
        let (x_ptr, y_ptr) = (x.as_ptr() as usize, y.as_mut_ptr() as usize);
        super::pool::for_chunks(rows.div_ceil(ROWS), |range| {
            let mut u = vec![0f32; ROWS * self.r];
            for group in range {
                let first = group * ROWS;
                let count = ROWS.min(rows - first);
                // SAFETY: `x` holds `rows` rows of k and `y` rows of n, both outliving
                // the pool call; each row is read and written by one task only.
                let (x, y) = unsafe {
                    (
                        std::slice::from_raw_parts(
                            (x_ptr as *const f32).add(first * self.k),
                            count * self.k,
                        ),
                        std::slice::from_raw_parts_mut(
                            (y_ptr as *mut f32).add(first * self.n),
                            count * self.n,
                        ),
                    )
                };
                for j in 0..self.r {
                    let a = &self.a[j * self.k..(j + 1) * self.k];
                    match count {
                        ROWS => {
                            let sums = dots::<ROWS>(x, a, self.k);
                            for (row, sum) in sums.into_iter().enumerate() {
                                u[row * self.r + j] = sum;
                            }
                        }
                        _ => {
                            for row in 0..count {
                                let [sum] =
                                    dots::<1>(&x[row * self.k..(row + 1) * self.k], a, self.k);
                                u[row * self.r + j] = sum;
                            }
                        }
                    }
                }
                match count {
                    ROWS => self.add_updates::<ROWS>(&u, y),
                    _ => {
                        for row in 0..count {
                            self.add_updates::<1>(
                                &u[row * self.r..],
                                &mut y[row * self.n..(row + 1) * self.n],
                            );
                        }
                    }
                }
            }
        });
    }

    /// Adds to each of the `N` rows of `y` (rows of n) its update `u_j Bᵀ_j`, from its
    /// ranks' values `u` (rows of r): each output's update summed from zero over its
    /// part's ranks in rank order, then added to it (zero to the outputs of a part the
    /// adapter leaves alone), as for a row alone. The rows share each loaded run of
    /// [`OUTPUTS`] values of Bᵀ, their sums kept in registers across the ranks.
    fn add_updates<const N: usize>(&self, u: &[f32], y: &mut [f32]) {
        let (n, r) = (self.n, self.r);
        let untouched = |y: &mut [f32], outputs: std::ops::Range<usize>| {
            for row in 0..N {
                for y in &mut y[row * n + outputs.start..row * n + outputs.end] {
                    *y += 0.0;
                }
            }
        };
        let mut next = 0;
        for (ranks, outputs) in &self.blocks {
            untouched(y, next..outputs.start);
            next = outputs.end;
            let whole = outputs.start + outputs.len() / OUTPUTS * OUTPUTS;
            for o in (outputs.start..whole).step_by(OUTPUTS) {
                let mut acc = [[0f32; OUTPUTS]; N];
                for j in ranks.clone() {
                    let b = &self.bt[j * n + o..j * n + o + OUTPUTS];
                    for (row, acc) in acc.iter_mut().enumerate() {
                        let uj = u[row * r + j];
                        for (acc, b) in acc.iter_mut().zip(b) {
                            *acc += uj * b;
                        }
                    }
                }
                for (row, acc) in acc.iter().enumerate() {
                    for (y, d) in y[row * n + o..row * n + o + OUTPUTS].iter_mut().zip(acc) {
                        *y += d;
                    }
                }
            }
            for o in whole..outputs.end {
                for row in 0..N {
                    let mut d = 0f32;
                    for j in ranks.clone() {
                        d += u[row * r + j] * self.bt[j * n + o];
                    }
                    y[row * n + o] += d;
                }
            }
        }
        untouched(y, next..n);
    }
}

/// Outputs whose updates [`LowRank::add_updates`] sums together, for every row of a group.
const OUTPUTS: usize = 16;

/// Rows of `x` whose updates are computed together: each weight row of A is read once
/// for all of them, and their sums are independent chains, each summed as it is alone
/// ([`dots`]).
const ROWS: usize = 4;

impl candle_core::InplaceOp2 for LowRank {
    fn name(&self) -> &'static str {
        "low-rank-add"
    }

    fn cpu_fwd(
        &self,
        y: &mut candle_core::CpuStorage,
        y_layout: &candle_core::Layout,
        x: &candle_core::CpuStorage,
        x_layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        let (candle_core::CpuStorage::F32(y), candle_core::CpuStorage::F32(x)) = (y, x) else {
            candle_core::bail!("low-rank-add expects f32 tensors")
        };
        let (Some((ys, ye)), Some((xs, xe))) =
            (y_layout.contiguous_offsets(), x_layout.contiguous_offsets())
        else {
            candle_core::bail!("low-rank-add expects contiguous tensors")
        };
        let (y, x) = (&mut y[ys..ye], &x[xs..xe]);
        if x.len() % self.k.max(1) != 0 || y.len() != x.len() / self.k.max(1) * self.n {
            candle_core::bail!(
                "low-rank-add: {} inputs and {} outputs do not make rows of {} and {}",
                x.len(),
                y.len(),
                self.k,
                self.n
            )
        }
        self.add_rows(y, x);
        Ok(())
    }
}

/// Σ aᵢbᵢ of each of the `N` rows of `x` (rows of `k`) with `b`, each row's sum in a
/// fixed order whatever `N`: 16 running sums over the whole blocks of 16, then the tail.
fn dots<const N: usize>(x: &[f32], b: &[f32], k: usize) -> [f32; N] {
    let mut acc = [[0f32; 16]; N];
    let whole = k / 16 * 16;
    for (c, cb) in b[..whole].chunks_exact(16).enumerate() {
        for (row, acc) in acc.iter_mut().enumerate() {
            let ca = &x[row * k + c * 16..row * k + c * 16 + 16];
            for l in 0..16 {
                acc[l] += ca[l] * cb[l];
            }
        }
    }
    std::array::from_fn(|row| {
        let a = &x[row * k..(row + 1) * k];
        let tail: f32 = a[whole..].iter().zip(&b[whole..]).map(|(x, y)| x * y).sum();
        acc[row].iter().sum::<f32>() + tail
    })
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed)
                    .wrapping_mul(2_654_435_761)
                    .rotate_left(13);
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// `y + (x Aᵀ) Bᵀ` as [`LowRank::add_to`] writes it, on a copy of `y`.
    fn added(lr: &LowRank, y: &Tensor, x: &Tensor) -> Tensor {
        let y = y.copy().unwrap();
        lr.add_to(&y, x).unwrap();
        y
    }

    #[test]
    fn the_update_equals_the_merged_product_and_each_row_its_own() {
        let dev = Device::Cpu;
        let (k, rows) = (40, [6usize, 3, 5]);
        // Parts 0 and 2 adapted (ranks 2 and 3), part 1 not.
        let a0 = Tensor::from_vec(values(2 * k, 1), (2, k), &dev).unwrap();
        let b0 = Tensor::from_vec(values(6 * 2, 2), (6, 2), &dev).unwrap();
        let a2 = Tensor::from_vec(values(3 * k, 3), (3, k), &dev).unwrap();
        let b2 = Tensor::from_vec(values(5 * 3, 4), (5, 3), &dev).unwrap();
        let lr = LowRank::new(
            k,
            &rows,
            vec![
                Some((a0.clone(), b0.clone())),
                None,
                Some((a2.clone(), b2.clone())),
            ],
        )
        .unwrap()
        .unwrap();
        let delta = Tensor::cat(
            &[
                b0.matmul(&a0).unwrap(),
                Tensor::zeros((3, k), candle_core::DType::F32, &dev).unwrap(),
                b2.matmul(&a2).unwrap(),
            ],
            0,
        )
        .unwrap();
        let x = Tensor::from_vec(values(15 * k, 5), (15, k), &dev).unwrap();
        let y = Tensor::from_vec(values(15 * 14, 6), (15, 14), &dev).unwrap();
        let want = (&y + x.matmul(&delta.t().unwrap()).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let got = added(&lr, &y, &x).to_vec2::<f32>().unwrap();
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
        // Part 1's outputs get nothing.
        let before = y.to_vec2::<f32>().unwrap();
        for (row, was) in got.iter().zip(&before) {
            assert_eq!(row[6..9], was[6..9]);
        }
        // Any number of rows gives each row the bits it gets alone.
        for count in 1..=15 {
            let some = added(
                &lr,
                &y.narrow(0, 0, count).unwrap(),
                &x.narrow(0, 0, count).unwrap(),
            );
            let some = some.to_vec2::<f32>().unwrap();
            for (r, row) in some.iter().enumerate() {
                let alone = added(
                    &lr,
                    &y.narrow(0, r, 1).unwrap(),
                    &x.narrow(0, r, 1).unwrap(),
                );
                assert_eq!(
                    row,
                    &alone.to_vec2::<f32>().unwrap()[0],
                    "row {r} of {count}"
                );
            }
        }
        assert!(LowRank::new(k, &rows, vec![None, None, None])
            .unwrap()
            .is_none());
    }

    #[test]
    fn each_output_is_summed_from_zero_in_rank_order_then_added() {
        let dev = Device::Cpu;
        // Parts longer than a run of outputs summed together, with a tail, and one left
        // alone between them.
        let (k, parts) = (48, [37usize, 5, 20]);
        let ranks = [3usize, 0, 2];
        let n: usize = parts.iter().sum();
        let mut adapted = Vec::new();
        for (p, (&rows, &rank)) in parts.iter().zip(&ranks).enumerate() {
            adapted.push((rank > 0).then(|| {
                let seed = 10 * p as u32;
                (
                    Tensor::from_vec(values(rank * k, seed + 1), (rank, k), &dev).unwrap(),
                    Tensor::from_vec(values(rows * rank, seed + 2), (rows, rank), &dev).unwrap(),
                )
            }));
        }
        let lr = LowRank::new(k, &parts, adapted.clone()).unwrap().unwrap();
        let count = 7;
        let x = values(count * k, 5);
        let mut y = values(count * n, 6);
        // An output of the part left alone gets zero added, as it would alone.
        y[37] = -0.0;
        let mut want = y.clone();
        for row in 0..count {
            let x = &x[row * k..(row + 1) * k];
            let y = &mut want[row * n..(row + 1) * n];
            let mut start = 0;
            for (part, &rows) in adapted.iter().zip(&parts) {
                for o in start..start + rows {
                    let mut d = 0f32;
                    if let Some((a, b)) = part {
                        let (a, b) = (a.to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap());
                        for (j, a) in a.iter().enumerate() {
                            let [u] = dots::<1>(x, a, k);
                            d += u * b[o - start][j];
                        }
                    }
                    y[o] += d;
                }
                start += rows;
            }
        }
        lr.add_rows(&mut y, &x);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y), bits(&want));
    }
}

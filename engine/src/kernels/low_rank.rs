//! A LoRA adapter kept beside the weights rather than merged into them: each call of a
//! layer chooses whether to add it, so the memory writer's calls run with the adapter it
//! was trained for while answers run the base model, from one copy of the weights.

use candle_core::{Device, Tensor};

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

    /// `(x Aᵀ) Bᵀ` for `x` (..., k) on the CPU: (..., n). Each row is computed alone, the
    /// same way whatever the number of rows, so adding it keeps a layer's rows exact.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut dims = x.dims().to_vec();
        let rows = x.elem_count() / self.k.max(1);
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; rows * self.n];
        let (x_ptr, out_ptr) = (xs.as_ptr() as usize, out.as_mut_ptr() as usize);
        super::pool::for_chunks(rows, |range| {
            let mut u = vec![0f32; self.r];
            for row in range {
                // SAFETY: `xs` holds `rows` rows of k and `out` rows of n, both outliving
                // the pool call; each row is read and written by one task only.
                let (x, y) = unsafe {
                    (
                        std::slice::from_raw_parts((x_ptr as *const f32).add(row * self.k), self.k),
                        std::slice::from_raw_parts_mut(
                            (out_ptr as *mut f32).add(row * self.n),
                            self.n,
                        ),
                    )
                };
                for (j, u) in u.iter_mut().enumerate() {
                    *u = dot(x, &self.a[j * self.k..(j + 1) * self.k]);
                }
                // y += u_j Bᵀ_j over each part's own ranks and outputs, in rank order.
                for (ranks, outputs) in &self.blocks {
                    let y = &mut y[outputs.clone()];
                    for j in ranks.clone() {
                        let b = &self.bt[j * self.n + outputs.start..j * self.n + outputs.end];
                        for (y, b) in y.iter_mut().zip(b) {
                            *y += u[j] * b;
                        }
                    }
                }
            }
        });
        *dims.last_mut().expect("rank >= 1") = self.n;
        Ok(Tensor::from_vec(out, dims, &Device::Cpu)?)
    }
}

/// Σ aᵢbᵢ in a fixed order: 16 running sums over the whole blocks, then the tail.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let whole = a.len() / 16 * 16;
    for (ca, cb) in a[..whole].chunks_exact(16).zip(b[..whole].chunks_exact(16)) {
        for l in 0..16 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let tail: f32 = a[whole..].iter().zip(&b[whole..]).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
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
        let want = x
            .matmul(&delta.t().unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let got = lr.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
        // Part 1's outputs get nothing.
        assert!(got.iter().all(|row| row[6..9].iter().all(|&v| v == 0.0)));
        // Any number of rows gives each row the bits it gets alone.
        for count in 1..=15 {
            let some = lr.forward(&x.narrow(0, 0, count).unwrap()).unwrap();
            let some = some.to_vec2::<f32>().unwrap();
            for (r, row) in some.iter().enumerate() {
                let alone = lr.forward(&x.narrow(0, r, 1).unwrap()).unwrap();
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
}

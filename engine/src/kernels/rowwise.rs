//! Row-wise kernels of a transformer block on CPU, run on the engine's one thread pool:
//! RMS norm, and SwiGLU over the fused gate/up projection.
//!
//! candle-nn's RMS norm runs on rayon's pool, beside the barrier pool every other kernel
//! uses, so each norm wakes a second set of threads that then compete for the cores.
//! candle's `swiglu` splits the projection into two strided views, writes `silu(gate)`
//! to a new tensor and multiplies through a strided binary map: three passes and two
//! allocations where one pass does. Both kernels here compute every value with the same
//! f32 operations in the same order as candle's, so their bits are candle's.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};

use crate::error::Result;

/// Rows per task of the thread pool; this many rows or fewer (decoding) run inline.
const ROWS_PER_TASK: usize = 8;

/// Runs `f(row, dst)` for every row of `out` (rows of `width` values), over the pool
/// when there are more rows than one task takes.
fn for_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = out.len() / width.max(1);
    if rows <= ROWS_PER_TASK {
        for (r, dst) in out.chunks_exact_mut(width).enumerate() {
            f(r, dst);
        }
        return;
    }
    let out_ptr = out.as_mut_ptr() as usize;
    super::pool::for_chunks(rows.div_ceil(ROWS_PER_TASK), |tasks| {
        for task in tasks {
            for r in task * ROWS_PER_TASK..rows.min((task + 1) * ROWS_PER_TASK) {
                // SAFETY: row r (width cells) is written by exactly one task, inside
                // `out`, which outlives the pool call.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r * width), width)
                };
                f(r, dst);
            }
        }
    });
}

/// The contiguous f32 values of a CPU tensor's storage.
fn contiguous<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{op} expects f32")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op} expects a contiguous tensor")
    };
    Ok(&data[start..end])
}

fn on_cpu_f32(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// `x / sqrt(mean(x²) + eps) * alpha` over the last dimension of `x`.
pub(crate) fn rms_norm(x: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    if on_cpu_f32(x) && on_cpu_f32(alpha) {
        Ok(x.contiguous()?.apply_op2_no_bwd(alpha, &RmsNorm { eps })?)
    } else {
        Ok(candle_nn::ops::rms_norm(x, alpha, eps)?)
    }
}

struct RmsNorm {
    eps: f32,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        alphas: &CpuStorage,
        al: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous(xs, xl, "rms-norm")?;
        let alpha = contiguous(alphas, al, "rms-norm")?;
        let n = alpha.len();
        if xl.dims().last() != Some(&n) {
            candle_core::bail!("rms-norm: input {:?} against {n} weights", xl.dims())
        }
        let mut out = vec![0f32; x.len()];
        for_rows(&mut out, n, |r, dst| {
            let src = &x[r * n..(r + 1) * n];
            // candle-nn's steps: a sequential sum of squares, then one division and
            // one product per value.
            let sum2 = src.iter().map(|&v| v * v).sum::<f32>();
            let m = (sum2 / n as f32 + self.eps).sqrt();
            for ((d, &s), &a) in dst.iter_mut().zip(src).zip(alpha) {
                *d = s / m * a;
            }
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

/// `x` (..., 2n), the gate in the first half of the last dimension and the up projection
/// in the second: `silu(gate) * up`, (..., n).
pub(crate) fn swiglu(x: &Tensor) -> Result<Tensor> {
    if on_cpu_f32(x) {
        Ok(x.contiguous()?.apply_op1_no_bwd(&Gated {
            name: "swiglu",
            // candle's silu, then its product.
            unit: |g, u| g / (1.0 + (-g).exp()) * u,
        })?)
    } else {
        Ok(candle_nn::ops::swiglu(x)?)
    }
}

/// `x` (..., 2n), the gate in the first half of the last dimension and the up projection
/// in the second: `gelu(gate) * up`, (..., n), with GELU in its tanh form.
///
/// On the CPU as llama.cpp computes it: the gate rounded to f16 and looked up in a table
/// of GELU's f16 values (0 below -10, the gate itself above 10).
pub(crate) fn geglu(x: &Tensor) -> Result<Tensor> {
    if on_cpu_f32(x) {
        return Ok(x.contiguous()?.apply_op1_no_bwd(&Gated {
            name: "geglu",
            unit: |g, u| {
                if g <= -10.0 {
                    0.0
                } else if g >= 10.0 {
                    g * u
                } else {
                    gelu_table()[half::f16::from_f32(g).to_bits() as usize] * u
                }
            },
        })?);
    }
    let n = x.dim(candle_core::D::Minus1)? / 2;
    let gate = x.narrow(candle_core::D::Minus1, 0, n)?;
    let up = x.narrow(candle_core::D::Minus1, n, n)?;
    Ok((gate.gelu()? * up)?)
}

/// GELU (tanh form) of every f16 value, rounded to f16, as f32: llama.cpp's table.
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        const GELU_COEF_A: f32 = 0.044715;
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh());
                half::f16::from_f32(y).to_f32()
            })
            .collect()
    })
}

/// A gated unit over the fused gate/up projection: `unit(gate, up)` for each pair, one
/// pass, one allocation.
struct Gated {
    name: &'static str,
    unit: fn(f32, f32) -> f32,
}

impl CustomOp1 for Gated {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous(storage, layout, self.name)?;
        let mut dims = layout.dims().to_vec();
        let width = dims.last().copied().unwrap_or(0);
        if width == 0 || width % 2 != 0 {
            candle_core::bail!("{} expects an even last dimension, got {dims:?}", self.name)
        }
        let n = width / 2;
        let mut out = vec![0f32; x.len() / 2];
        for_rows(&mut out, n, |r, dst| {
            let (gate, up) = x[r * width..(r + 1) * width].split_at(n);
            for ((d, &g), &u) in dst.iter_mut().zip(gate).zip(up) {
                *d = (self.unit)(g, u);
            }
        });
        *dims.last_mut().expect("rank >= 1") = n;
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    fn values(seed: u32, n: usize, scale: f32) -> Vec<f32> {
        let mut seed = seed;
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// Row counts the engine uses: one decoded token, a verification pass, prefill.
    const ROWS: [usize; 4] = [1, 5, 9, 37];

    #[test]
    fn rms_norm_equals_candle_nns_bit_for_bit() {
        for rows in ROWS {
            let n = 96;
            let x = Tensor::from_vec(values(3, rows * n, 4.0), (1, rows, n), &Device::Cpu);
            let alpha = Tensor::from_vec(values(5, n, 1.5), n, &Device::Cpu).unwrap();
            let x = x.unwrap();
            let ours = super::rms_norm(&x, &alpha, 1e-5).unwrap();
            let theirs = candle_nn::ops::rms_norm(&x, &alpha, 1e-5).unwrap();
            assert_eq!(ours.dims(), theirs.dims());
            assert_eq!(bits(&ours), bits(&theirs), "{rows} rows");
        }
    }

    /// GeGLU against GELU's tanh form computed in f64: within the f16 rounding of the
    /// gate and of GELU's value, and exact outside [-10, 10].
    #[test]
    fn geglu_is_gelu_of_the_gate_times_up() {
        let n = 64;
        let mut v = values(11, 3 * 2 * n, 6.0);
        v[0] = -12.0;
        v[1] = 11.0;
        v[2] = 0.0;
        let x = Tensor::from_vec(v.clone(), (3, 2 * n), &Device::Cpu).unwrap();
        let got: Vec<f32> = super::geglu(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for r in 0..3 {
            for i in 0..n {
                let (g, u) = (v[r * 2 * n + i] as f64, v[r * 2 * n + n + i] as f64);
                let gelu = 0.5
                    * g
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g))
                            .tanh());
                let want = if g <= -10.0 {
                    0.0
                } else if g >= 10.0 {
                    g * u
                } else {
                    gelu * u
                };
                let d = (got[r * n + i] as f64 - want).abs();
                assert!(
                    d <= 2e-3 * (g.abs() + 1.0) * u.abs() + 1e-6,
                    "gate {g}, up {u}: {} vs {want}",
                    got[r * n + i]
                );
            }
        }
        assert_eq!(got[0], 0.0);
        assert_eq!(got[1], 11.0 * v[n + 1]);
    }

    /// Including gates where e^-g under- or overflows, and zero.
    #[test]
    fn swiglu_equals_candles_bit_for_bit() {
        for rows in ROWS {
            let n = 48;
            let mut v = values(7, rows * 2 * n, 12.0);
            v[0] = -120.0;
            v[1] = 95.0;
            v[2] = 0.0;
            let x = Tensor::from_vec(v, (1, rows, 2 * n), &Device::Cpu).unwrap();
            let ours = super::swiglu(&x).unwrap();
            let theirs = candle_nn::ops::swiglu(&x).unwrap();
            assert_eq!(ours.dims(), theirs.dims());
            assert_eq!(bits(&ours), bits(&theirs), "{rows} rows");
        }
    }
}

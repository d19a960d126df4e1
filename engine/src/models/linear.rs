//! Linear layers holding quantized weights for decode and, on CPU, dense weights for
//! prefill: a GEMM over many rows is far faster than per-row quantized dot products,
//! while decode (one row) is bound by the bytes of weights read.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::q4_1::Q4_1Matrix;
use crate::error::Result;

/// Rows at or above which the dense weights are used.
const DENSE_MIN_ROWS: usize = 16;

/// How weights are kept in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightPlan {
    /// Keep an f32 copy of every projection for prefill (CPU only).
    pub dense_prefill: bool,
}

/// The weights used for few rows (decode).
enum Quantized {
    /// Q4_1 on CPU: the engine's own kernel.
    Q4_1(Q4_1Matrix),
    Candle(QMatMul),
}

pub(crate) struct Linear {
    quantized: Quantized,
    dense: Option<Tensor>,
    bias: Option<Tensor>,
}

impl Linear {
    pub(crate) fn new(
        weight: QTensor,
        bias: Option<Tensor>,
        plan: WeightPlan,
        device: &Device,
    ) -> Result<Self> {
        let dense = if plan.dense_prefill && device.is_cpu() {
            Some(weight.dequantize(device)?)
        } else {
            None
        };
        let quantized = match q4_1_matrix(&weight, device)? {
            Some(m) => Quantized::Q4_1(m),
            None => Quantized::Candle(QMatMul::from_qtensor(decode_weight(weight, device)?)?),
        };
        Ok(Self {
            quantized,
            dense,
            bias,
        })
    }

    /// `x`: (..., k) -> (..., n).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let k = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / k.max(1);
        let y = match &self.dense {
            Some(w) if rows >= DENSE_MIN_ROWS => {
                let y = x.reshape((rows, k))?.matmul(&w.t()?)?;
                let mut out = dims;
                *out.last_mut().expect("rank >= 1") = y.dim(1)?;
                y.reshape(out)?
            }
            _ => match &self.quantized {
                Quantized::Q4_1(m) => x.contiguous()?.apply_op1_no_bwd(m)?,
                Quantized::Candle(m) => m.forward(&x.contiguous()?)?,
            },
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

fn q4_1_matrix(weight: &QTensor, device: &Device) -> Result<Option<Q4_1Matrix>> {
    if !device.is_cpu() || weight.dtype() != GgmlDType::Q4_1 {
        return Ok(None);
    }
    let (n, k) = weight.shape().dims2()?;
    Ok(Q4_1Matrix::new(n, k, weight.data()?.into_owned()))
}

/// Quantized types whose CPU dot products are scalar-only in candle are re-quantized to
/// Q8_0 (SIMD kernels on x86 and Arm). Q8_0 holds a Q4/Q5 block almost exactly:
/// the rounding step is 1/17 of the source's.
fn decode_weight(weight: QTensor, device: &Device) -> Result<QTensor> {
    let slow_on_cpu = matches!(
        weight.dtype(),
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
    );
    let row = weight.shape().dims().last().copied().unwrap_or(0);
    if device.is_cpu() && slow_on_cpu && row % 32 == 0 {
        let dense = weight.dequantize(device)?;
        Ok(QTensor::quantize(&dense, GgmlDType::Q8_0)?)
    } else {
        Ok(weight)
    }
}

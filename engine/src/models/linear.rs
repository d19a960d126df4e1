//! Linear layers holding quantized weights for decode and, on CPU, dense weights for
//! prefill: a GEMM over many rows is far faster than per-row quantized dot products,
//! while decode (one row) is bound by the bytes of weights read.

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};

use super::q4_1::Q4_1Matrix;
use crate::error::Result;

/// Rows at or above which the dense weights are used.
pub(crate) const DENSE_MIN_ROWS: usize = 16;

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

    /// A layer from f32 weights (an adapter merged in): dense for prefill, Q8_0 for
    /// decode (its rounding step is 1/17 of Q4_1's, so the merged update survives).
    pub(crate) fn from_dense(
        weight: Tensor,
        bias: Option<Tensor>,
        plan: WeightPlan,
        device: &Device,
    ) -> Result<Self> {
        let row = weight.dims().last().copied().unwrap_or(0);
        let dtype = if row % 32 == 0 {
            GgmlDType::Q8_0
        } else {
            GgmlDType::F32
        };
        let quantized =
            Quantized::Candle(QMatMul::from_qtensor(QTensor::quantize(&weight, dtype)?)?);
        let dense = (plan.dense_prefill && device.is_cpu()).then_some(weight);
        Ok(Self {
            quantized,
            dense,
            bias,
        })
    }

    /// One layer computing several projections of the same input: the weights are stacked
    /// along the output dimension, so one matmul (and one pass over the input) serves all.
    pub(crate) fn fused(
        parts: Vec<(QTensor, Option<Tensor>)>,
        plan: WeightPlan,
        device: &Device,
    ) -> Result<Self> {
        let has_bias = parts.iter().any(|(_, b)| b.is_some());
        let bias = if has_bias {
            let biases = parts
                .iter()
                .map(|(w, b)| match b {
                    Some(b) => Ok(b.clone()),
                    None => Ok(Tensor::zeros(
                        w.shape().dims()[0],
                        candle_core::DType::F32,
                        device,
                    )?),
                })
                .collect::<Result<Vec<_>>>()?;
            Some(Tensor::cat(&biases, 0)?)
        } else {
            None
        };
        let weights: Vec<QTensor> = parts.into_iter().map(|(w, _)| w).collect();
        Self::new(stack_rows(weights, device)?, bias, plan, device)
    }

    /// `x`: (..., k) -> (..., n).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let k = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / k.max(1);
        let y = match &self.dense {
            Some(w) if rows >= DENSE_MIN_ROWS => {
                let y = super::dense::matmul_t(&x.reshape((rows, k))?, w)?;
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

/// Stacks quantized matrices of one type and row length into one (n1 + n2 + ..., k).
fn stack_rows(mut weights: Vec<QTensor>, device: &Device) -> Result<QTensor> {
    if weights.len() == 1 {
        return Ok(weights.pop().expect("one weight"));
    }
    let dtype = weights[0].dtype();
    let k = weights[0].shape().dims2()?.1;
    let same = weights
        .iter()
        .all(|w| w.dtype() == dtype && w.shape().dims2().map(|d| d.1).ok() == Some(k));
    if same && device.is_cpu() {
        let mut n = 0;
        let mut data = Vec::new();
        for w in &weights {
            n += w.shape().dims2()?.0;
            data.extend_from_slice(&w.data()?);
        }
        let storage = QStorage::from_data(std::borrow::Cow::Owned(data), device, dtype)?;
        return Ok(QTensor::new(storage, (n, k))?);
    }
    // Mixed types (or a GPU): through f32, then back to the first part's type.
    let dense = weights
        .iter()
        .map(|w| Ok(w.dequantize(device)?))
        .collect::<Result<Vec<_>>>()?;
    Ok(QTensor::quantize(&Tensor::cat(&dense, 0)?, dtype)?)
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

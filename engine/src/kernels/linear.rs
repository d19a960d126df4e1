//! Linear layers holding quantized weights for decode and, on CPU, dense weights for
//! prefill: a GEMM over many rows is far faster than per-row quantized dot products,
//! while decode (one row) is bound by the bytes of weights read.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};

use super::blocks::{BlockMatrix, Format};
use super::low_rank::LowRank;
use crate::error::Result;

/// Rows at or above which the dense weights are used.
pub(crate) const DENSE_MIN_ROWS: usize = 16;

/// How weights are kept in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightPlan {
    /// Prefill multiplies many rows at once with a GEMM (CPU only); otherwise it runs
    /// decode's quantized kernels.
    pub dense_prefill: bool,
    /// Which GEMM.
    pub prefill: PrefillWeights,
}

/// Prefill's GEMM and the weights it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillWeights {
    /// Activations quantized to 8-bit blocks and multiplied in integers with the file's
    /// own weights, unpacked a block of rows at a time (`int_gemm`), for Q4_0, Q4_1,
    /// Q5_0, Q8_0, Q4_K, Q5_K and Q6_K on CPUs with AVX-512 VNNI, and for all of them
    /// but Q8_0 on CPUs with AVX2; [`Self::Tiles`] elsewhere.
    #[default]
    Integer,
    /// Each block of weight rows dequantized to f32 by the task that multiplies it, so
    /// that the file's own bytes are all that stays.
    Tiles,
    /// An f32 copy of every projection kept from load. The same bits as the tiles; on a
    /// 2-vCPU Zen 4 the tiles prefill 0–5% slower and take under half the memory
    /// (docs/benchmarks/prefill-tiles).
    Copy,
}

/// Prefill's weights.
enum Prefill {
    /// A copy made at load.
    Copy(Tensor),
    /// The file's own weights, read a block of rows at a time inside the GEMM.
    Tiles(Tiles),
}

/// A quantized weight (n, k) whose rows prefill reads block by block: unpacked for the
/// integer product (`integer`, the weight's format), or dequantized to f32.
struct Tiles {
    weight: Arc<QTensor>,
    n: usize,
    k: usize,
    integer: Option<Format>,
}

impl Tiles {
    /// Tiles of `weight`, for the integer product where `integer` and the weight has a
    /// format it takes on this CPU.
    fn new(weight: Arc<QTensor>, integer: bool) -> Result<Self> {
        let (n, k) = weight.shape().dims2()?;
        let integer = match integer {
            true => integer_format(&weight)?,
            false => None,
        };
        Ok(Self {
            weight,
            n,
            k,
            integer,
        })
    }

    /// Rows `rows` of the weight in f32, row-major, dequantized block by block straight
    /// from the weight's bytes.
    fn rows(&self, rows: std::ops::Range<usize>) -> candle_core::Result<Vec<f32>> {
        use candle_core::quantized::k_quants::*;
        let bytes = self.weight.data()?;
        let row_bytes = bytes.len() / self.n;
        let part = &bytes[rows.start * row_bytes..rows.end * row_bytes];
        let mut out = vec![0f32; rows.len() * self.k];
        /// `part` as blocks of `T`: whole rows of a weight held as a vector of `T`, so
        /// they start on a block and are aligned as `T` is (checked).
        fn blocks<T>(part: &[u8]) -> &[T] {
            let size = std::mem::size_of::<T>();
            assert!(
                part.len().is_multiple_of(size)
                    && (part.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()),
                "weight rows are not whole aligned blocks"
            );
            // SAFETY: length and alignment checked above; the block types are plain
            // `repr(C)` data, valid for any bytes.
            unsafe { std::slice::from_raw_parts(part.as_ptr().cast::<T>(), part.len() / size) }
        }
        let own = match self.weight.dtype() {
            GgmlDType::Q4_1 => Some(Format::Q4_1),
            GgmlDType::Q5_0 => Some(Format::Q5_0),
            _ => None,
        };
        if own.is_some_and(|format| super::blocks::dequantize(format, part, &mut out)) {
            return Ok(out);
        }
        match self.weight.dtype() {
            GgmlDType::F32 => f32::to_float(blocks(part), &mut out),
            GgmlDType::F16 => half::f16::to_float(blocks(part), &mut out),
            GgmlDType::BF16 => half::bf16::to_float(blocks(part), &mut out),
            GgmlDType::Q4_0 => BlockQ4_0::to_float(blocks(part), &mut out),
            GgmlDType::Q4_1 => BlockQ4_1::to_float(blocks(part), &mut out),
            GgmlDType::Q5_0 => BlockQ5_0::to_float(blocks(part), &mut out),
            GgmlDType::Q5_1 => BlockQ5_1::to_float(blocks(part), &mut out),
            GgmlDType::Q8_0 => BlockQ8_0::to_float(blocks(part), &mut out),
            GgmlDType::Q8_1 => BlockQ8_1::to_float(blocks(part), &mut out),
            GgmlDType::Q2K => BlockQ2K::to_float(blocks(part), &mut out),
            GgmlDType::Q3K => BlockQ3K::to_float(blocks(part), &mut out),
            GgmlDType::Q4K => BlockQ4K::to_float(blocks(part), &mut out),
            GgmlDType::Q5K => BlockQ5K::to_float(blocks(part), &mut out),
            GgmlDType::Q6K => BlockQ6K::to_float(blocks(part), &mut out),
            GgmlDType::Q8K => BlockQ8K::to_float(blocks(part), &mut out),
        }
        Ok(out)
    }
}

impl candle_core::CustomOp1 for Tiles {
    fn name(&self) -> &'static str {
        "matmul-t-tiles"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let candle_core::CpuStorage::F32(x) = storage else {
            candle_core::bail!("matmul-t-tiles expects f32 input")
        };
        let Some((x0, _)) = layout.contiguous_offsets() else {
            candle_core::bail!("matmul-t-tiles expects a contiguous input")
        };
        let (m, k) = layout.shape().dims2()?;
        if k != self.k {
            candle_core::bail!(
                "matmul-t-tiles: ({m}, {k}) times ({}, {}) transposed",
                self.n,
                self.k
            )
        }
        let (x, n) = (&x[x0..], self.n);
        let out = match self.integer {
            Some(format) => super::int_gemm::matmul_t(format, &self.weight.data()?, n, k, x, m),
            None => super::dense::gemm_t_tiles(x, m, n, k, |rows| self.rows(rows))?,
        };
        Ok((candle_core::CpuStorage::F32(out), (m, n).into()))
    }
}

/// The tensor types (named as [`GgmlDType`]'s `Debug` form, as `memctl model info` lists a
/// file's types) that prefill multiplies in 8-bit integers on this CPU: all the block
/// formats with AVX-512 VNNI, all but Q8_0 with AVX2, none elsewhere.
pub fn integer_prefill_types() -> Vec<String> {
    use GgmlDType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K,
    ]
    .into_iter()
    .filter(|&t| Format::of(t).is_some_and(super::int_gemm::available))
    .map(|t| format!("{t:?}"))
    .collect()
}

/// The block format of a weight the integer product takes on this CPU, if any: whole
/// blocks per row, and a CPU whose kernel takes the format.
fn integer_format(weight: &QTensor) -> Result<Option<Format>> {
    let Some(format) = Format::of(weight.dtype()) else {
        return Ok(None);
    };
    let (_, k) = weight.shape().dims2()?;
    Ok(
        (super::int_gemm::available(format) && k.is_multiple_of(format.block_len()))
            .then_some(format),
    )
}

/// The weights used for few rows (decode).
enum Quantized {
    /// Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K on CPU: the engine's own kernels,
    /// exact across row counts and reading the weights once for up to four rows.
    Blocks(BlockMatrix),
    /// Other types, and every type on a GPU: candle's kernels, made row-exact.
    Candle(RowExact),
}

impl Quantized {
    fn new(weight: Arc<QTensor>, device: &Device) -> Result<Self> {
        Ok(match block_matrix(&weight, device)? {
            Some(m) => Self::Blocks(m),
            None => Self::Candle(RowExact::new(decode_weight(weight, device)?)?),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Blocks(m) => x.contiguous()?.apply_op1_no_bwd(m)?,
            Self::Candle(m) => m.forward(x)?,
        })
    }
}

/// A model's output head: the quantized product alone (prefill asks it for the last rows
/// only). A tied head shares the embedding's tensor.
pub(crate) struct Head(Quantized);

impl Head {
    pub(crate) fn new(weight: Arc<QTensor>, device: &Device) -> Result<Self> {
        Ok(Self(Quantized::new(weight, device)?))
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

pub(crate) struct Linear {
    /// The weights in runs of one type, each run's matrices stacked along the output
    /// dimension: one product per run, outputs side by side. (A file may store q and k in
    /// one type and v in a finer one; stacking them as one type would re-quantize v.)
    parts: Vec<Part>,
    bias: Option<Tensor>,
    /// Each adapter's update by slot (the adapter, the reader), added when a call asks
    /// for it (on the CPU).
    low_rank: [Option<LowRank>; 2],
    /// On a GPU, each adapter's weights W + B A in f32 by slot, multiplied in place of the
    /// others when a call asks for that adapter ([`Linear::dense_pair`]).
    merged: [Option<QMatMul>; 2],
}

/// Matrices of one type computed as one product.
struct Part {
    quantized: Quantized,
    prefill: Option<Prefill>,
}

impl Part {
    fn new(weight: QTensor, plan: WeightPlan, device: &Device) -> Result<Self> {
        let weight = Arc::new(weight);
        let dense = plan.dense_prefill && device.is_cpu();
        // Tiles come from the file's own weights, as the copy does: decode's Q8_0 form of
        // Q5_1 would take less memory but moves prefill's numbers off llama.cpp's (taken
        // from a Q8_0 form of Q5_0, a greedy Qwen2.5-Coder reply parted from it at the
        // seventh token).
        let prefill = match plan.prefill {
            _ if !dense => None,
            PrefillWeights::Copy => Some(Prefill::Copy(weight.dequantize(device)?)),
            PrefillWeights::Integer => Some(Prefill::Tiles(Tiles::new(weight.clone(), true)?)),
            PrefillWeights::Tiles => Some(Prefill::Tiles(Tiles::new(weight.clone(), false)?)),
        };
        let quantized = Quantized::new(weight, device)?;
        Ok(Self { quantized, prefill })
    }

    /// `x`: (..., k) -> (..., n).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let k = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / k.max(1);
        Ok(match &self.prefill {
            Some(prefill) if rows >= DENSE_MIN_ROWS => {
                let x = x.reshape((rows, k))?;
                let y = match prefill {
                    Prefill::Copy(w) => super::dense::matmul_t(&x, w)?,
                    Prefill::Tiles(t) => x.contiguous()?.apply_op1_no_bwd(t)?,
                };
                let mut out = dims;
                *out.last_mut().expect("rank >= 1") = y.dim(1)?;
                y.reshape(out)?
            }
            _ => self.quantized.forward(x)?,
        })
    }

    /// Whether a prefill product gives each row the same bits whatever rows share it:
    /// the integer kernels do ([`super::int_gemm`]); f32 tiles round a partial tile
    /// otherwise.
    fn prefill_rows_independent(&self) -> bool {
        matches!(&self.prefill, Some(Prefill::Tiles(t)) if t.integer.is_some())
    }
}

impl Linear {
    /// Whether prefill gives each row of this layer the same bits whatever rows share
    /// the product (the adapters' low-rank updates are computed a row at a time).
    pub(crate) fn prefill_rows_independent(&self) -> bool {
        self.merged.iter().all(Option::is_none)
            && self.parts.iter().all(Part::prefill_rows_independent)
    }

    /// The layer with its adapters' updates (by slot) beside its weights.
    pub(crate) fn with_low_rank(mut self, low_rank: [Option<LowRank>; 2]) -> Self {
        self.low_rank = low_rank;
        self
    }

    /// A layer of a model with adapters on a GPU: the base weights `w` and the adapted
    /// ones `merged` (W + B A, by slot), f32 made on the CPU, multiplied by the device's dense
    /// product. On an H200 the shipped adapter's model gave the CPU's replies token for
    /// token this way, and replied with empty turns whenever a block's quantized weights
    /// were used after the load had freed memory on the device (a merge or a low-rank
    /// product made there): the quantized kernels read more than the weights' own bytes,
    /// and freed memory is not zeroed.
    pub(crate) fn dense_pair(
        w: Tensor,
        merged: [Option<Tensor>; 2],
        bias: Option<Tensor>,
        device: &Device,
    ) -> Result<Self> {
        let [adapter, reader] = merged;
        let on_device = |m: Option<Tensor>| -> Result<Option<QMatMul>> {
            Ok(match m {
                Some(m) => Some(QMatMul::Tensor(m.to_device(device)?)),
                None => None,
            })
        };
        Ok(Self {
            parts: vec![Part {
                quantized: Quantized::Candle(RowExact::whole(QMatMul::Tensor(
                    w.to_device(device)?,
                ))),
                prefill: None,
            }],
            bias,
            low_rank: [None, None],
            merged: [on_device(adapter)?, on_device(reader)?],
        })
    }

    /// One layer computing several projections of the same input: the weights of each run
    /// of one type are stacked along the output dimension, so one matmul (and one pass
    /// over the input) serves the run, and the file's own types are kept.
    pub(crate) fn fused(
        parts: Vec<(QTensor, Option<Tensor>)>,
        plan: WeightPlan,
        device: &Device,
    ) -> Result<Self> {
        let bias = fused_bias(&parts, device)?;
        let mut runs: Vec<Vec<QTensor>> = Vec::new();
        for (w, _) in parts {
            match runs.last_mut() {
                Some(run)
                    if run[0].dtype() == w.dtype()
                        && run[0].shape().dims().get(1) == w.shape().dims().get(1) =>
                {
                    run.push(w)
                }
                _ => runs.push(vec![w]),
            }
        }
        let parts = runs
            .into_iter()
            .map(|run| Part::new(stack_rows(run, device)?, plan, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            parts,
            bias,
            low_rank: [None, None],
            merged: [None, None],
        })
    }

    /// `x`: (..., k) -> (..., n), with the update of the adapter in slot `adapted` when
    /// the layer has one.
    pub(crate) fn forward(&self, x: &Tensor, adapted: Option<usize>) -> Result<Tensor> {
        if let Some(merged) = adapted.and_then(|slot| self.merged[slot].as_ref()) {
            let y = merged.forward(x)?;
            return Ok(match &self.bias {
                Some(b) => y.broadcast_add(b)?,
                None => y,
            });
        }
        let y = match self.parts.as_slice() {
            [one] => one.forward(x)?,
            parts => {
                let ys = parts
                    .iter()
                    .map(|p| p.forward(x))
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&ys, candle_core::D::Minus1)?
            }
        };
        let y = match adapted.and_then(|slot| self.low_rank[slot].as_ref()) {
            Some(low_rank) => {
                let y = y.contiguous()?;
                low_rank.add_to(&y, &x.contiguous()?)?;
                y
            }
            None => y,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// The biases of stacked projections, zeros for a part without one; `None` when no part
/// has one.
pub(crate) fn fused_bias(
    parts: &[(QTensor, Option<Tensor>)],
    device: &Device,
) -> Result<Option<Tensor>> {
    if parts.iter().all(|(_, b)| b.is_none()) {
        return Ok(None);
    }
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
    Ok(Some(Tensor::cat(&biases, 0)?))
}

/// A quantized matrix product through candle in which no row depends on the others.
/// candle's CPU kernels for some types take another path for several rows than for one
/// (on x86, Q6_K is repacked into tiles for two rows or more), and f32 and f16 weights go
/// through a GEMM chosen by shape; another path may round differently. How a type and
/// shape behaves is measured once per process ([`Rows::of`]), and a product of a few rows
/// (one-token decoding, draft verification, a batch of sequences) is computed so that
/// each row gets exactly what one-token decoding gives it. Products of
/// [`DENSE_MIN_ROWS`] rows or more (prefill) run whole.
pub(crate) struct RowExact {
    matmul: QMatMul,
    rows: Rows,
}

/// How a product of fewer than [`DENSE_MIN_ROWS`] rows is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Whole: every row count gives each row the same bits.
    Whole,
    /// A row at a time. (Where several rows agree with each other but not with one row
    /// alone, as Q6_K's tiles on x86, computing a single row as two copies of itself
    /// would let few-row products run whole; measured on Qwen2.5-Coder-0.5B, it cost
    /// one-token decoding 12% and gained batches nothing.)
    Each,
}

impl RowExact {
    pub(crate) fn new(weight: Arc<QTensor>) -> Result<Self> {
        let (n, k) = weight.shape().dims2()?;
        let rows = if weight.device().is_cpu() {
            Rows::of(weight.dtype(), n, k)?
        } else {
            Rows::Whole
        };
        Ok(Self {
            matmul: QMatMul::from_arc(weight)?,
            rows,
        })
    }

    /// A product whose rows never depend on each other's count (a GPU's dense weights:
    /// few-row products there are decoded a sequence at a time anyway).
    fn whole(matmul: QMatMul) -> Self {
        Self {
            matmul,
            rows: Rows::Whole,
        }
    }

    /// `x`: (..., k) -> (..., n).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        let dims = x.dims().to_vec();
        let k = *dims.last().unwrap_or(&0);
        let rows = x.elem_count() / k.max(1);
        let y = match self.rows {
            Rows::Each if (2..DENSE_MIN_ROWS).contains(&rows) => {
                let flat = x.reshape((rows, k))?;
                let ys = (0..rows)
                    .map(|r| self.matmul.forward(&flat.narrow(0, r, 1)?))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&ys, 0)?
            }
            _ => return Ok(self.matmul.forward(&x)?),
        };
        let mut out = dims;
        *out.last_mut().expect("rank >= 1") = y.dim(1)?;
        Ok(y.reshape(out)?)
    }
}

impl Rows {
    /// How candle's CPU product on `dtype` weights of shape (`n`, `k`) treats the rows of
    /// products of 1 to [`DENSE_MIN_ROWS`] - 1 rows. Measured on a matrix of the same
    /// type, row length and column count modulo 64 (the kernels choose their path by
    /// type, by the column count's divisibility and by the row count) with fixed
    /// pseudo-random values, once per process for each such class.
    fn of(dtype: GgmlDType, n: usize, k: usize) -> Result<Self> {
        /// Type, probe column count, row length.
        type Class = (GgmlDType, usize, usize);
        static SEEN: LazyLock<Mutex<HashMap<Class, Rows>>> = LazyLock::new(Default::default);
        let key = (dtype, 64 + n % 64, k);
        if let Some(&rows) = SEEN.lock().expect("probe cache").get(&key) {
            return Ok(rows);
        }
        let (n_probe, most) = (key.1, DENSE_MIN_ROWS - 1);
        let device = Device::Cpu;
        let w = Tensor::from_vec(probe_values(n_probe * k, 1), (n_probe, k), &device)?;
        let matmul = QMatMul::from_qtensor(QTensor::quantize(&w, dtype)?)?;
        let x = Tensor::from_vec(probe_values(most * k, 2), (most, k), &device)?;
        let product = |from: usize, count: usize| -> Result<Vec<u32>> {
            bits(matmul.forward(&x.narrow(0, from, count)?)?)
        };
        let all = product(0, most)?;
        let row = |r: usize| &all[r * n_probe..(r + 1) * n_probe];
        // Every count from 2 up gives the bits of the whole product's rows, and so does
        // each row alone.
        let mut whole = true;
        for count in 2..most {
            whole = whole && product(0, count)? == all[..count * n_probe];
        }
        for r in 0..most {
            whole = whole && product(r, 1)? == row(r);
        }
        let rows = if whole { Rows::Whole } else { Rows::Each };
        if rows != Rows::Whole {
            tracing::debug!("{dtype:?} ({n}, {k}): products of a few rows run as {rows:?}");
        }
        SEEN.lock().expect("probe cache").insert(key, rows);
        Ok(rows)
    }
}

/// Fixed pseudo-random values in [-1, 1).
pub(crate) fn probe_values(count: usize, seed: u64) -> Vec<f32> {
    (0..count as u64)
        .map(|i| {
            let h = (i ^ (seed << 40))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
            ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The bits of a tensor's values, for comparisons that admit no rounding.
fn bits(t: Tensor) -> Result<Vec<u32>> {
    Ok(t.flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(f32::to_bits)
        .collect())
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
    // On a GPU: through f32, then back to the type.
    let dense = weights
        .iter()
        .map(|w| Ok(w.dequantize(device)?))
        .collect::<Result<Vec<_>>>()?;
    Ok(QTensor::quantize(&Tensor::cat(&dense, 0)?, dtype)?)
}

/// The engine's own kernels for a CPU weight of a type they read, in rows of whole blocks.
fn block_matrix(weight: &Arc<QTensor>, device: &Device) -> Result<Option<BlockMatrix>> {
    let Some(format) = Format::of(weight.dtype()) else {
        return Ok(None);
    };
    if !device.is_cpu() {
        return Ok(None);
    }
    Ok(BlockMatrix::new(format, weight.clone())?)
}

/// Quantized types whose CPU dot products are scalar-only in candle, and that the
/// engine's own kernels do not take (Q5_1; Q4_1 and Q5_0 rows not made of whole blocks),
/// are re-quantized to Q8_0 (SIMD kernels on x86 and Arm). Q8_0 holds a Q4/Q5 block
/// almost exactly: the rounding step is 1/17 of the source's.
fn decode_weight(weight: Arc<QTensor>, device: &Device) -> Result<Arc<QTensor>> {
    let slow_on_cpu = matches!(
        weight.dtype(),
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
    );
    let row = weight.shape().dims().last().copied().unwrap_or(0);
    if device.is_cpu() && slow_on_cpu && row % 32 == 0 {
        let dense = weight.dequantize(device)?;
        Ok(Arc::new(QTensor::quantize(&dense, GgmlDType::Q8_0)?))
    } else {
        Ok(weight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every weight type a GGUF file may hold, at shapes whose column count does and does
    /// not divide the kernels' tiles: each row of a product of 2 to 15 rows is bit for bit
    /// that row's product alone, as drafting and batching need.
    #[test]
    fn each_row_of_a_product_equals_its_product_alone() {
        use GgmlDType::*;
        let device = Device::Cpu;
        let rows = DENSE_MIN_ROWS - 1;
        for dtype in [
            F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K,
        ] {
            for (n, k) in [(128, 512), (70, 256)] {
                let w = Tensor::from_vec(probe_values(n * k, 7), (n, k), &device).unwrap();
                let q = QTensor::quantize(&w, dtype).unwrap();
                let m = RowExact::new(Arc::new(q)).unwrap();
                let x = Tensor::from_vec(probe_values(rows * k, 8), (rows, k), &device).unwrap();
                let alone: Vec<Vec<u32>> = (0..rows)
                    .map(|r| bits(m.forward(&x.narrow(0, r, 1).unwrap()).unwrap()).unwrap())
                    .collect();
                for count in 2..=rows {
                    let x = x.narrow(0, 0, count).unwrap();
                    let all = bits(m.forward(&x).unwrap()).unwrap();
                    for (r, one) in alone.iter().take(count).enumerate() {
                        assert!(
                            all[r * n..(r + 1) * n] == one[..],
                            "{dtype:?} ({n}, {k}): row {r} of {count} differs from the row alone"
                        );
                    }
                }
            }
        }
    }

    /// Projections stored in different types (q and k in Q5_0, v in Q8_0) keep their own
    /// types when fused: each output column is the one its matrix gives alone, for one
    /// decoded row and for a prefill block, and runs of one type are stacked (q with k).
    #[test]
    fn fused_projections_keep_each_files_type() {
        use GgmlDType::*;
        let device = Device::Cpu;
        let k = 256;
        let make = |n: usize, seed: u64, dtype| {
            let w = Tensor::from_vec(probe_values(n * k, seed), (n, k), &device).unwrap();
            QTensor::quantize(&w, dtype).unwrap()
        };
        let parts = [(64, 5, Q5_0), (32, 6, Q5_0), (32, 7, Q8_0)];
        for (rows, prefill) in [
            (1, PrefillWeights::Integer),
            (40, PrefillWeights::Integer),
            (40, PrefillWeights::Tiles),
        ] {
            let x = Tensor::from_vec(probe_values(rows * k, 8), (rows, k), &device).unwrap();
            let plan = WeightPlan {
                dense_prefill: true,
                prefill,
            };
            let fused = Linear::fused(
                parts
                    .iter()
                    .map(|&(n, seed, t)| (make(n, seed, t), None))
                    .collect(),
                plan,
                &device,
            )
            .unwrap();
            assert_eq!(fused.parts.len(), 2, "q and k stacked, v apart");
            let got = fused.forward(&x, None).unwrap();
            let mut at = 0;
            for &(n, seed, t) in &parts {
                let alone = Linear::fused(vec![(make(n, seed, t), None)], plan, &device).unwrap();
                let want = bits(alone.forward(&x, None).unwrap()).unwrap();
                let part = bits(got.narrow(1, at, n).unwrap().contiguous().unwrap()).unwrap();
                assert_eq!(
                    part, want,
                    "{t:?} part at column {at}, {rows} rows, {prefill:?}"
                );
                at += n;
            }
        }
    }

    /// Prefill from blocks of rows dequantized inside the GEMM gives the bits of the GEMM
    /// on the whole f32 matrix, the copy's, for every type and at shapes whose feature
    /// count leaves a partial last block.
    #[test]
    fn tiles_give_the_bits_of_the_whole_matrix() {
        use GgmlDType::*;
        let device = Device::Cpu;
        let rows = 40;
        for dtype in [
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, F16, F32,
        ] {
            for (n, k) in [(256, 512), (230, 256)] {
                let w = Tensor::from_vec(probe_values(n * k, 3), (n, k), &device).unwrap();
                let x = Tensor::from_vec(probe_values(rows * k, 4), (rows, k), &device).unwrap();
                let layer = |prefill| {
                    let q = QTensor::quantize(&w, dtype).unwrap();
                    let plan = WeightPlan {
                        dense_prefill: true,
                        prefill,
                    };
                    Linear::fused(vec![(q, None)], plan, &device).unwrap()
                };
                let tiled = layer(PrefillWeights::Tiles);
                let Some(Prefill::Tiles(tiles)) = &tiled.parts[0].prefill else {
                    panic!("{dtype:?}: no tiles")
                };
                let whole = tiles.weight.dequantize(&device).unwrap();
                let expected = bits(super::super::dense::matmul_t(&x, &whole).unwrap()).unwrap();
                let got = bits(tiled.forward(&x, None).unwrap()).unwrap();
                assert_eq!(got, expected, "{dtype:?} ({n}, {k})");
                let copied = bits(layer(PrefillWeights::Copy).forward(&x, None).unwrap()).unwrap();
                assert_eq!(got, copied, "{dtype:?} ({n}, {k}): tiles against the copy");
            }
        }
    }
}

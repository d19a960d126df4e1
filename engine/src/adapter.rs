//! LoRA adapters made by `memctl train`: per projection `blk.N.<name>.lora_a` (r, in) and
//! `.lora_b` (out, r) with the scale folded into B, in a safetensors file beside a JSON
//! manifest (`adapter.json`) that records the base model's sha256. Kept beside the
//! weights at load, as its factors: a call that runs with it adds x Aᵀ Bᵀ to each adapted
//! projection (W' = W + B A), one that does not runs the base model's weights alone.
//!
//! A model's default adapter lies beside it as `<model stem>.adapter.safetensors` (with
//! `<model stem>.adapter.json`); it is applied when nothing else is chosen and the model
//! file is the exact base it was trained on. [`export_merged`] writes the merged model as
//! a GGUF file that other servers load.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::gguf::{sha256_file, GgufFile};

/// Which adapter a model is loaded with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AdapterChoice {
    /// The model file's weights as they are.
    #[default]
    None,
    /// This adapter; an error if it was trained on another base model.
    File(PathBuf),
    /// The model's default adapter ([`default_adapter_path`]) when there is one for this
    /// exact model file; the base model otherwise.
    Default,
}

/// Where a model's default adapter lies: `<model stem>.adapter.safetensors` beside it.
pub fn default_adapter_path(model: &Path) -> PathBuf {
    model.with_extension("adapter.safetensors")
}

/// Where a model's default reader lies: `<model stem>.reader.safetensors` beside it (with
/// `<model stem>.reader.json`).
pub fn default_reader_path(model: &Path) -> PathBuf {
    model.with_extension("reader.safetensors")
}

/// Which of the weights loaded beside a model's file a call runs with. A model keeps up
/// to two adapters beside one copy of its weights, each a LoRA update that a call adds
/// or leaves out: the adapter (the memory writer's calls) and the reader (answers read
/// from passages). A call asking for one the model was loaded without runs the base
/// model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Weights {
    /// The model file's weights alone.
    Base,
    /// With the adapter ([`crate::LoadOptions::adapter`]).
    #[default]
    Adapter,
    /// With the reader ([`crate::LoadOptions::reader`]).
    Reader,
}

impl Weights {
    /// The slot of the update this call adds: 0 the adapter, 1 the reader; `None`: none.
    pub(crate) fn slot(self) -> Option<usize> {
        match self {
            Weights::Base => None,
            Weights::Adapter => Some(0),
            Weights::Reader => Some(1),
        }
    }
}

/// The adapter `choice` resolves to for `model` (whose sha256 is computed only when an
/// adapter is found), `default` the file its default lies in. A default adapter for
/// another base model is skipped with a warning.
pub fn resolve(model: &Path, choice: &AdapterChoice, default: &Path) -> Result<Option<Adapter>> {
    match choice {
        AdapterChoice::None => Ok(None),
        AdapterChoice::File(file) => {
            let adapter = Adapter::load(file)?;
            adapter.check_base(model, &sha256_file(model)?)?;
            Ok(Some(adapter))
        }
        AdapterChoice::Default => {
            let file = default.to_path_buf();
            if !file.is_file() {
                return Ok(None);
            }
            let adapter = Adapter::load(&file)?;
            let sha = sha256_file(model)?;
            if adapter.manifest.base_sha256 != sha {
                tracing::warn!(
                    "default adapter {} was trained on a base model with sha256 {}, not this \
                     model file ({sha}): loading the base model",
                    file.display(),
                    adapter.manifest.base_sha256
                );
                return Ok(None);
            }
            Ok(Some(adapter))
        }
    }
}

/// What the manifest must say (other keys are kept for people).
#[derive(Debug, Clone, Deserialize)]
pub struct AdapterManifest {
    pub base_sha256: String,
    #[serde(default)]
    pub base_model: Option<String>,
    #[serde(default)]
    pub rank: Option<usize>,
    /// How the adapter was trained (`memctl train`'s settings).
    #[serde(default)]
    pub config: Option<TrainedWith>,
}

/// The part of an adapter's training settings that inference follows.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TrainedWith {
    #[serde(default)]
    pub data: Option<TrainedData>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct TrainedData {
    /// The memory writer whose steps it learned (`rewrite`, `lines`).
    #[serde(default)]
    pub writer: Option<String>,
    /// The share of its examples that were answers from retrieved passages.
    #[serde(default)]
    pub evidence_share: Option<f64>,
}

impl AdapterManifest {
    /// The memory writer the adapter was trained to write with, when it says.
    pub fn writer(&self) -> Option<&str> {
        self.config.as_ref()?.data.as_ref()?.writer.as_deref()
    }

    /// The share of the adapter's training examples that were answers from retrieved
    /// passages, when it says.
    pub fn evidence_share(&self) -> Option<f64> {
        self.config.as_ref()?.data.as_ref()?.evidence_share
    }
}

/// A loaded adapter.
pub struct Adapter {
    pub path: PathBuf,
    pub manifest: AdapterManifest,
    tensors: HashMap<String, Tensor>,
}

impl Adapter {
    /// Reads `path` (the .safetensors file) and the `adapter.json` beside it.
    pub fn load(path: &Path) -> Result<Self> {
        let manifest_path = path.with_extension("json");
        let bad = |message: String| Error::Adapter {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read(&manifest_path).map_err(|e| {
            bad(format!(
                "cannot read its manifest {}: {e}",
                manifest_path.display()
            ))
        })?;
        let manifest: AdapterManifest = serde_json::from_slice(&text)
            .map_err(|e| bad(format!("manifest {}: {e}", manifest_path.display())))?;
        let tensors =
            candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            path: path.to_path_buf(),
            manifest,
            tensors,
        })
    }

    /// Errors unless the base model's sha256 is the one the adapter was trained on.
    pub fn check_base(&self, base: &Path, base_sha256: &str) -> Result<()> {
        if self.manifest.base_sha256 != base_sha256 {
            return Err(Error::Adapter {
                path: self.path.clone(),
                message: format!(
                    "it was trained on a base model with sha256 {} but {} has sha256 {}; \
                     use the matching base model, or leave it out (--adapter none, --reader \
                     none)",
                    self.manifest.base_sha256,
                    base.display(),
                    base_sha256
                ),
            });
        }
        Ok(())
    }

    /// Projections adapted.
    pub fn len(&self) -> usize {
        self.tensors.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The merged weight W + B A of tensor `name` (`blk.N.<projection>.weight`), if
    /// the adapter changes it.
    pub fn merged(&self, name: &str, weight: &QTensor, device: &Device) -> Result<Option<Tensor>> {
        let Some((layer, projection)) = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.strip_suffix(".weight"))
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(layer, projection)| Some((layer.parse::<usize>().ok()?, projection)))
        else {
            return Ok(None);
        };
        match self.delta(layer, projection, device)? {
            Some(delta) => Ok(Some((weight.dequantize(device)? + delta)?)),
            None => Ok(None),
        }
    }

    /// A (rank, in) and B (out, rank) of `blk.{layer}.{name}` in f32 on the CPU, if
    /// adapted: the update is B A.
    pub fn low_rank(&self, layer: usize, name: &str) -> Result<Option<(Tensor, Tensor)>> {
        let a = self.tensors.get(&format!("blk.{layer}.{name}.lora_a"));
        let b = self.tensors.get(&format!("blk.{layer}.{name}.lora_b"));
        match (a, b) {
            (Some(a), Some(b)) => Ok(Some((
                a.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
                b.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
            ))),
            (None, None) => Ok(None),
            _ => Err(Error::Adapter {
                path: self.path.clone(),
                message: format!("blk.{layer}.{name} has only one of lora_a and lora_b"),
            }),
        }
    }

    /// The weight update B A (out, in) of `blk.{layer}.{name}`, if adapted.
    pub fn delta(&self, layer: usize, name: &str, device: &Device) -> Result<Option<Tensor>> {
        match self.low_rank(layer, name)? {
            Some((a, b)) => Ok(Some(b.matmul(&a)?.to_device(device)?)),
            None => Ok(None),
        }
    }
}

/// What [`export_merged`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExportReport {
    pub path: PathBuf,
    pub tensors: usize,
    /// Tensors the adapter changed (stored as `dtype`).
    pub merged: usize,
    pub dtype: String,
    pub bytes: u64,
}

/// Writes `base` with `adapter` merged into it as a GGUF file at `out`: the adapted
/// projections as `dtype` (Q8_0 keeps the update that a 4-bit type would round away),
/// every other tensor and all metadata as they are, plus `memagent.adapter.*` keys. The
/// file is written beside `out` and renamed into place.
pub fn export_merged(
    base: &Path,
    adapter: &Adapter,
    out: &Path,
    dtype: GgmlDType,
) -> Result<ExportReport> {
    let dev = Device::Cpu;
    adapter.check_base(base, &sha256_file(base)?)?;
    let mut gguf = GgufFile::open(base)?;
    let alignment = match gguf.get("general.alignment") {
        Some(v) => v.to_u32().ok(),
        None => Some(32),
    };
    if alignment != Some(32) {
        return Err(gguf.gguf_error(format!(
            "general.alignment is {alignment:?}; only 32-byte aligned files can be exported"
        )));
    }
    let names = gguf.tensor_names_in_file_order();
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    let mut merged = 0;
    for name in names {
        let q = gguf.tensor(&name, &dev)?;
        let q = match adapter.merged(&name, &q, &dev)? {
            Some(w) => {
                merged += 1;
                let row = w.dims().last().copied().unwrap_or(0);
                let block = dtype.block_size();
                let t = if row % block == 0 {
                    dtype
                } else {
                    GgmlDType::F32
                };
                QTensor::quantize(&w, t)?
            }
            None => q,
        };
        tensors.push((name, q));
    }
    if merged != adapter.len() {
        return Err(Error::Adapter {
            path: adapter.path.clone(),
            message: format!(
                "{} projections are adapted but {merged} of them were found in {}",
                adapter.len(),
                base.display()
            ),
        });
    }
    let adapter_sha = sha256_file(&adapter.path)?;
    let mut metadata: Vec<(String, Value)> = gguf
        .metadata()
        .iter()
        .filter(|(k, _)| !k.starts_with("memagent.adapter."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    metadata.push(("memagent.adapter.sha256".into(), Value::String(adapter_sha)));
    metadata.push((
        "memagent.adapter.base_sha256".into(),
        Value::String(adapter.manifest.base_sha256.clone()),
    ));
    let write_err = |source: std::io::Error| Error::Io {
        path: out.to_path_buf(),
        source,
    };
    let tmp = out.with_extension("gguf.tmp");
    {
        let file = File::create(&tmp).map_err(write_err)?;
        let mut w = BufWriter::new(file);
        let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        candle_core::quantized::gguf_file::write(&mut w, &meta, &ts)?;
        let file = w.into_inner().map_err(|e| write_err(e.into_error()))?;
        file.sync_all().map_err(write_err)?;
    }
    std::fs::rename(&tmp, out).map_err(write_err)?;
    let bytes = std::fs::metadata(out).map_err(write_err)?.len();
    Ok(ExportReport {
        path: out.to_path_buf(),
        tensors: tensors.len(),
        merged,
        dtype: format!("{dtype:?}"),
        bytes,
    })
}

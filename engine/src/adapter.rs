//! LoRA adapters made by `memctl train`: per projection `blk.N.<name>.lora_a` (r, in) and
//! `.lora_b` (out, r) with the scale folded into B, in a safetensors file beside a JSON
//! manifest (`adapter.json`) that records the base model's sha256. Merged into the
//! weights once at load: W' = W + B A.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::error::{Error, Result};

/// What the manifest must say (other keys are kept for people).
#[derive(Debug, Clone, Deserialize)]
pub struct AdapterManifest {
    pub base_sha256: String,
    #[serde(default)]
    pub base_model: Option<String>,
    #[serde(default)]
    pub rank: Option<usize>,
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
                     use the matching base model or --adapter none",
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

    /// The weight update B A (out, in) of `blk.{layer}.{name}`, if adapted.
    pub fn delta(&self, layer: usize, name: &str, device: &Device) -> Result<Option<Tensor>> {
        let a = self.tensors.get(&format!("blk.{layer}.{name}.lora_a"));
        let b = self.tensors.get(&format!("blk.{layer}.{name}.lora_b"));
        match (a, b) {
            (Some(a), Some(b)) => {
                let a = a.to_dtype(DType::F32)?;
                let b = b.to_dtype(DType::F32)?;
                Ok(Some(b.matmul(&a)?.to_device(device)?))
            }
            (None, None) => Ok(None),
            _ => Err(Error::Adapter {
                path: self.path.clone(),
                message: format!("blk.{layer}.{name} has only one of lora_a and lora_b"),
            }),
        }
    }
}

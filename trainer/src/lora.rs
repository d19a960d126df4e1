//! LoRA adapters: for a projection W (out, in), trainable A (r, in) and B (out, r) with
//! W' = W + (alpha / r) · B A. B starts at zero, so training starts from the base model.
//!
//! Shipped adapters hold, per projection, `blk.{i}.{name}.lora_a` and `.lora_b` with
//! the scale folded into B, so the merged weight is W + B A whatever rank was used.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A projection of a decoder block that can carry an adapter (GGUF tensor names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Target {
    #[serde(rename = "attn_q")]
    Q,
    #[serde(rename = "attn_k")]
    K,
    #[serde(rename = "attn_v")]
    V,
    #[serde(rename = "attn_output")]
    O,
    #[serde(rename = "ffn_gate")]
    Gate,
    #[serde(rename = "ffn_up")]
    Up,
    #[serde(rename = "ffn_down")]
    Down,
}

pub const ALL_TARGETS: [Target; 7] = [
    Target::Q,
    Target::K,
    Target::V,
    Target::O,
    Target::Gate,
    Target::Up,
    Target::Down,
];

impl Target {
    /// The GGUF tensor name stem (`blk.N.<name>.weight`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Q => "attn_q",
            Self::K => "attn_k",
            Self::V => "attn_v",
            Self::O => "attn_output",
            Self::Gate => "ffn_gate",
            Self::Up => "ffn_up",
            Self::Down => "ffn_down",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Target {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let short = match s {
            "q" => Some(Self::Q),
            "k" => Some(Self::K),
            "v" => Some(Self::V),
            "o" => Some(Self::O),
            "gate" => Some(Self::Gate),
            "up" => Some(Self::Up),
            "down" => Some(Self::Down),
            _ => None,
        };
        short
            .or_else(|| ALL_TARGETS.into_iter().find(|t| t.name() == s))
            .ok_or_else(|| {
                Error::Config(format!(
                    "unknown LoRA target `{s}`; targets: q, k, v, o, gate, up, down"
                ))
            })
    }
}

/// Rank, scale and targets of the adapters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<Target>,
    /// Adapt only the top this many blocks (all when unset): the backward pass then
    /// stops at the lowest adapted block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_layers: Option<usize>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 16.0,
            targets: ALL_TARGETS.to_vec(),
            top_layers: None,
        }
    }
}

impl LoraConfig {
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// The first adapted block of a model with `n_layer` blocks.
    pub fn first_layer(&self, n_layer: usize) -> usize {
        n_layer - self.top_layers.unwrap_or(n_layer).min(n_layer)
    }
}

/// One adapted projection.
pub struct Lora {
    pub a: Var,
    pub b: Var,
    pub scale: f64,
}

impl Lora {
    /// A ~ U(-1/√in, 1/√in) from `rng`, B = 0.
    pub fn new(rank: usize, inp: usize, out: usize, scale: f64, rng: &mut StdRng) -> Result<Self> {
        let bound = 1.0 / (inp as f32).sqrt();
        let a: Vec<f32> = (0..rank * inp)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        let a = Var::from_tensor(&Tensor::from_vec(a, (rank, inp), &Device::Cpu)?)?;
        let b = Var::zeros((out, rank), DType::F32, &Device::Cpu)?;
        Ok(Self { a, b, scale })
    }

    /// `x (t, in) -> scale · x Aᵀ Bᵀ (t, out)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok((x
            .matmul(&self.a.as_tensor().t()?)?
            .matmul(&self.b.as_tensor().t()?)?
            * self.scale)?)
    }

    /// The weight update `scale · B A` (out, in).
    pub fn delta(&self) -> Result<Tensor> {
        Ok((self.b.as_tensor().matmul(self.a.as_tensor())? * self.scale)?)
    }
}

/// Every adapter of a model, by (layer, target), in a fixed order.
pub struct Adapters {
    pub config: LoraConfig,
    pub layers: BTreeMap<(usize, Target), Lora>,
}

impl Adapters {
    /// Fresh adapters for `n_layer` blocks; `shape(target)` gives (in, out).
    pub fn new(
        config: LoraConfig,
        n_layer: usize,
        shape: impl Fn(Target) -> (usize, usize),
        seed: u64,
    ) -> Result<Self> {
        if config.rank == 0 {
            return Err(Error::Config("the LoRA rank must be at least 1".into()));
        }
        if config.top_layers == Some(0) {
            return Err(Error::Config(
                "--top-layers must be at least 1 (or unset: every block)".into(),
            ));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut layers = BTreeMap::new();
        for i in config.first_layer(n_layer)..n_layer {
            for &t in &config.targets {
                let (inp, out) = shape(t);
                layers.insert(
                    (i, t),
                    Lora::new(config.rank, inp, out, config.scale(), &mut rng)?,
                );
            }
        }
        Ok(Self { config, layers })
    }

    pub fn get(&self, layer: usize, target: Target) -> Option<&Lora> {
        self.layers.get(&(layer, target))
    }

    /// The trainable variables with stable names (A then B of each projection).
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.layers
            .iter()
            .flat_map(|((i, t), l)| {
                [
                    (format!("blk.{i}.{t}.lora_a"), l.a.clone()),
                    (format!("blk.{i}.{t}.lora_b"), l.b.clone()),
                ]
            })
            .collect()
    }

    pub fn parameter_count(&self) -> usize {
        self.vars().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The shipping form: B pre-scaled, both in `dtype`.
    pub fn export(&self, dtype: DType) -> Result<BTreeMap<String, Tensor>> {
        let mut out = BTreeMap::new();
        for ((i, t), l) in &self.layers {
            out.insert(
                format!("blk.{i}.{t}.lora_a"),
                l.a.as_tensor().to_dtype(dtype)?,
            );
            out.insert(
                format!("blk.{i}.{t}.lora_b"),
                (l.b.as_tensor() * l.scale)?.to_dtype(dtype)?,
            );
        }
        Ok(out)
    }
}

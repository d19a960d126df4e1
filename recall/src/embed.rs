//! The sentence embedder: all-MiniLM-L6-v2 (BERT, 6 layers, 384 dimensions) run by
//! candle-transformers' BERT, mean-pooled over the tokens and L2-normalised, as
//! sentence-transformers does.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Tokenizer, TruncationParams};

use crate::error::{Error, Result};

/// Tokens per text: the model was trained on at most 256.
pub const MAX_TOKENS: usize = 256;
/// Texts embedded per forward pass (of the same length: padding would change the
/// others' vectors in their last bits, and a text's vector must not depend on what it
/// was embedded with).
const BATCH: usize = 16;

/// Files of an embedder: `model.safetensors`, `tokenizer.json` and `config.json` in
/// one folder.
pub const FILES: [&str; 3] = ["model.safetensors", "tokenizer.json", "config.json"];

pub struct Embedder {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dimensions: usize,
    hidden: usize,
    layers: usize,
    intermediate: usize,
    name: String,
}

/// Work done by one call, for throughput figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmbedStats {
    pub texts: usize,
    pub tokens: usize,
    /// Multiply-adds times two of the encoder's projections and attention.
    pub flops: f64,
    pub seconds: f64,
}

impl Embedder {
    /// Loads the embedder from a folder holding [`FILES`].
    pub fn load(dir: &Path) -> Result<Self> {
        let path = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(Error::Embedder(format!(
                    "{} is missing; run scripts/fetch-model to install the embedder",
                    p.display()
                )))
            }
        };
        let bad = |what: &Path, e: &dyn std::fmt::Display| {
            Error::Embedder(format!("cannot load {}: {e}", what.display()))
        };
        let config_path = path("config.json")?;
        let config: Config = serde_json::from_slice(
            &std::fs::read(&config_path).map_err(|e| bad(&config_path, &e))?,
        )
        .map_err(|e| bad(&config_path, &e))?;
        let tokenizer_path = path("tokenizer.json")?;
        let mut tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| bad(&tokenizer_path, &e))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| bad(&tokenizer_path, &e))?;
        tokenizer.with_padding(None);
        let weights = path("model.safetensors")?;
        let device = Device::Cpu;
        // SAFETY: the file is mapped read-only and not modified while the model lives.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(std::slice::from_ref(&weights), DType::F32, &device)
        }
        .map_err(|e| bad(&weights, &e))?;
        let model = BertModel::load(vb, &config).map_err(|e| bad(&weights, &e))?;
        let name = dir
            .file_name()
            .map_or("embedder".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            model,
            tokenizer,
            device,
            dimensions: config.hidden_size,
            hidden: config.hidden_size,
            layers: config.num_hidden_layers,
            intermediate: config.intermediate_size,
            name,
        })
    }

    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Unit-length embeddings of `texts`, one per text.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        Ok(self.embed_with_stats(texts)?.0)
    }

    /// Embeddings and the work they took.
    pub fn embed_with_stats(&self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, EmbedStats)> {
        let started = Instant::now();
        let mut stats = EmbedStats::default();
        let mut out = Vec::with_capacity(texts.len());
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::Embedder(format!("cannot tokenize: {e}")))?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());
        let mut vectors = vec![Vec::new(); texts.len()];
        let groups = order
            .chunk_by(|&a, &b| encodings[a].get_ids().len() == encodings[b].get_ids().len())
            .flat_map(|same| same.chunks(BATCH));
        for group in groups {
            let len = group
                .iter()
                .map(|&i| encodings[i].get_ids().len())
                .max()
                .unwrap_or(1)
                .max(1);
            let mut ids = Vec::with_capacity(group.len() * len);
            let mut mask = Vec::with_capacity(group.len() * len);
            for &i in group {
                let e = encodings[i].get_ids();
                ids.extend(e.iter().copied());
                ids.extend(std::iter::repeat_n(0, len - e.len()));
                mask.extend(std::iter::repeat_n(1u32, e.len()));
                mask.extend(std::iter::repeat_n(0u32, len - e.len()));
                stats.tokens += e.len();
                stats.flops += self.flops(e.len());
            }
            let rows = group.len();
            let t = |v: Vec<u32>| Tensor::from_vec(v, (rows, len), &self.device);
            let ids = t(ids)?;
            let mask = t(mask)?;
            let types = ids.zeros_like()?;
            let hidden = self.model.forward(&ids, &types, Some(&mask))?;
            // Mean over the real tokens, then unit length.
            let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&m)?.sum(1)?;
            let counts = m.sum(1)?;
            let mean = summed.broadcast_div(&counts)?;
            let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f32::MAX)?;
            let unit = mean.broadcast_div(&norm)?;
            for (row, &i) in unit.to_vec2::<f32>()?.into_iter().zip(group) {
                vectors[i] = row;
            }
        }
        out.extend(vectors);
        stats.texts = texts.len();
        stats.seconds = started.elapsed().as_secs_f64();
        Ok((out, stats))
    }

    /// FLOPs of encoding one text of `n` tokens: the projections (q, k, v, out, and the
    /// two MLP matrices) and the attention products.
    fn flops(&self, n: usize) -> f64 {
        let (h, i, n) = (self.hidden as f64, self.intermediate as f64, n as f64);
        let per_layer = 2.0 * n * (4.0 * h * h + 2.0 * h * i) + 2.0 * 2.0 * n * n * h;
        per_layer * self.layers as f64
    }
}

/// Cosine similarity of two unit vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

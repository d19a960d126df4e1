//! The sentence embedder: all-MiniLM-L6-v2 (BERT, 6 layers, 384 dimensions), texts
//! packed so that each vector is the one the text gets alone ([`crate::bert`]), mean-pooled over its tokens and L2-normalised, as
//! sentence-transformers does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use tokenizers::{Tokenizer, TruncationParams};

use crate::bert::{Bert, Config};
use crate::error::{Error, Result};

/// Tokens per text: the model was trained on at most 256.
pub const MAX_TOKENS: usize = 256;

/// Files of an embedder: `model.safetensors`, `tokenizer.json` and `config.json` in
/// one folder.
pub const FILES: [&str; 3] = ["model.safetensors", "tokenizer.json", "config.json"];

/// Dimensions a token state is kept in: all-MiniLM-L6-v2's 384 projected onto the 96
/// directions along which its token states vary most ([`TOKEN_PROJECTION`]): 52 bytes a
/// state at 4 bits instead of 196, and late interaction ranks as with all 384 (every
/// evidence turn within 10 for 643 of LoCoMo's 804 answerable development questions,
/// 644 with all 384; 642 with 128 directions, 643 with 192 random ones).
pub const TOKEN_DIMENSIONS: usize = 96;

/// The projection of all-MiniLM-L6-v2's token states: [`TOKEN_DIMENSIONS`] rows of 384
/// little-endian f32, the leading eigenvectors of its telling tokens' states' second
/// moment over 50 essays of prose (`cargo run --release -p memagent-recall --example
/// token_projection`), none of them chat.
const TOKEN_PROJECTION: &[u8] = include_bytes!("token-projection.bin");

/// The size of the model file the projection was fit on, which any other model with 384
/// dimensions does not share: its token states are kept whole.
const PROJECTED_MODEL_BYTES: u64 = 90_868_376;

pub struct Embedder {
    model: Option<Model>,
    /// Token states projected to [`TOKEN_DIMENSIONS`], for the model the projection was
    /// fit on.
    projection: Option<Vec<f32>>,
    /// Whether texts are given their telling tokens' states (late interaction).
    token_states: bool,
    dimensions: usize,
    hidden: usize,
    layers: usize,
    intermediate: usize,
    name: String,
}

/// The sentence-embedding model itself.
struct Model {
    bert: Bert,
    tokenizer: Tokenizer,
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
        let bert = Bert::load(vb, &config).map_err(|e| bad(&weights, &e))?;
        let fitted = std::fs::metadata(&weights)
            .map_err(|e| bad(&weights, &e))?
            .len()
            == PROJECTED_MODEL_BYTES
            && TOKEN_PROJECTION.len() == TOKEN_DIMENSIONS * config.hidden_size * 4;
        let projection = fitted.then(|| {
            TOKEN_PROJECTION
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect()
        });
        let name = dir
            .file_name()
            .map_or("embedder".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            model: Some(Model { bert, tokenizer }),
            projection,
            token_states: true,
            dimensions: config.hidden_size,
            hidden: config.hidden_size,
            layers: config.num_hidden_layers,
            intermediate: config.intermediate_size,
            name,
        })
    }

    /// Pseudo-random unit vectors of `dimensions`, one per text and the same for the same
    /// text, in place of a model's: for timing vector search over streams too large to
    /// embed in a benchmark's time. Their similarities mean nothing.
    pub fn hashed(dimensions: usize) -> Self {
        Self {
            model: None,
            projection: None,
            token_states: true,
            dimensions,
            hidden: dimensions,
            layers: 0,
            intermediate: 0,
            name: "hashed".to_string(),
        }
    }

    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Dimensions of the token states [`Embedder::embed_tokens_with_stats`] gives:
    /// [`TOKEN_DIMENSIONS`] where they are projected, else the model's.
    pub fn token_dimensions(&self) -> usize {
        match &self.projection {
            Some(_) => TOKEN_DIMENSIONS,
            None => self.dimensions,
        }
    }

    /// The embedder without token states: [`Embedder::embed_tokens_with_stats`] gives
    /// none, so an index keeps none (about a third of its size on prose) and its
    /// searches are not ranked again by late interaction.
    pub fn without_token_states(mut self) -> Self {
        self.token_states = false;
        self
    }

    /// Whether texts are given their telling tokens' states.
    pub fn keeps_token_states(&self) -> bool {
        self.token_states
    }

    /// The embedder with its token states kept whole, as the model gives them (what
    /// their projection is fit on).
    pub fn without_token_projection(mut self) -> Self {
        self.projection = None;
        self
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
        let (embedded, stats) = self.encode(texts, false)?;
        Ok((embedded.into_iter().map(|e| e.vector).collect(), stats))
    }

    /// Each text's unit-length embedding and the unit-length states of its telling
    /// tokens ([`is_telling`]): what the search's late interaction compares a
    /// question's with a passage's by, one pass giving both. The hashed
    /// embedder has no token states.
    pub fn embed_tokens_with_stats(&self, texts: &[&str]) -> Result<(Vec<Embedded>, EmbedStats)> {
        self.encode(texts, true)
    }

    /// Embeddings, with the telling tokens' states when `tokens`, and the work they took.
    fn encode(&self, texts: &[&str], tokens: bool) -> Result<(Vec<Embedded>, EmbedStats)> {
        let tokens = tokens && self.token_states;
        let started = Instant::now();
        let mut stats = EmbedStats::default();
        let Some(model) = &self.model else {
            let embedded = texts
                .iter()
                .map(|t| Embedded {
                    vector: self.hashed_vector(t),
                    tokens: Vec::new(),
                })
                .collect();
            stats.texts = texts.len();
            stats.seconds = started.elapsed().as_secs_f64();
            return Ok((embedded, stats));
        };
        let encodings = model
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::Embedder(format!("cannot tokenize: {e}")))?;
        let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        for text in &ids {
            stats.tokens += text.len();
            stats.flops += self.flops(text.len());
        }
        let keep = |text: usize, token: usize| {
            tokens
                && encodings[text]
                    .get_tokens()
                    .get(token)
                    .is_some_and(|t| is_telling(t))
        };
        let embedded = model
            .bert
            .embed_with_states(&ids, &keep)?
            .into_iter()
            .zip(&encodings)
            .map(|((vector, states), encoding)| {
                let pieces = encoding.get_tokens().iter().filter(|t| is_telling(t));
                Embedded {
                    vector,
                    tokens: merge_repeats(pieces.zip(states))
                        .into_iter()
                        .map(|s| match &self.projection {
                            Some(p) => project(p, &s),
                            None => s,
                        })
                        .collect(),
                }
            })
            .collect();
        stats.texts = texts.len();
        stats.seconds = started.elapsed().as_secs_f64();
        Ok((embedded, stats))
    }

    /// A unit vector drawn from a generator seeded by the text's FNV-1a hash.
    fn hashed_vector(&self, text: &str) -> Vec<f32> {
        let mut state = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut v: Vec<f32> = (0..self.dimensions)
            .map(|_| {
                // splitmix64
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        v.iter_mut().for_each(|x| *x /= norm);
        v
    }

    /// FLOPs of encoding one text of `n` tokens: the projections (q, k, v, out, and the
    /// two MLP matrices) and the attention products.
    fn flops(&self, n: usize) -> f64 {
        let (h, i, n) = (self.hidden as f64, self.intermediate as f64, n as f64);
        let per_layer = 2.0 * n * (4.0 * h * h + 2.0 * h * i) + 2.0 * 2.0 * n * n * h;
        per_layer * self.layers as f64
    }
}

/// A text embedded: its vector, and the states of its telling tokens.
#[derive(Debug, Clone, Default)]
pub struct Embedded {
    pub vector: Vec<f32>,
    pub tokens: Vec<Vec<f32>>,
}

/// Whether a word piece of the embedder's vocabulary tells texts apart: letters only, at
/// least three of them (a `##` continuation counted without its marks), not a stop word
/// nor another [`COMMON`] word (`[CLS]`, digits, punctuation, "the", "did" and "kind"
/// are not).
pub fn is_telling(piece: &str) -> bool {
    let word = piece.strip_prefix("##").unwrap_or(piece);
    word.chars().count() >= 3
        && word.chars().all(char::is_alphabetic)
        && !memagent_engine::words::is_stop_word(word)
        && !COMMON.contains(&word)
}

/// Common words the stop words let through, most of them a question's frame ("what
/// kind of", "how many", "has … ever"): a question's token matching them says nothing
/// of the passage (every 4th question of LoCoMo's development conversations: every
/// evidence turn within 10 for 81.7% of them with these telling, 83.2% without).
const COMMON: &[&str] = &[
    "kind", "type", "some", "many", "much", "ever", "like", "get", "got", "make", "made", "take",
    "took", "also", "one", "two", "being", "into", "after", "before", "him", "been",
];

/// The states of a text's telling pieces with each piece's repeats merged: their mean
/// direction, in the order each piece first comes. A piece said twice in a passage
/// means much the same both times; merged, a chat passage keeps about 56 states
/// instead of 75, and the search ranks as before (every evidence turn within 10 for
/// 80.1% of LoCoMo's development questions, against 80.2% keeping each).
fn merge_repeats<'a>(pieces: impl Iterator<Item = (&'a String, Vec<f32>)>) -> Vec<Vec<f32>> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut merged: Vec<Vec<f32>> = Vec::new();
    for (piece, state) in pieces {
        match first.get(piece.as_str()) {
            Some(&i) => merged[i].iter_mut().zip(&state).for_each(|(m, s)| *m += s),
            None => {
                first.insert(piece, merged.len());
                merged.push(state);
            }
        }
    }
    for m in &mut merged {
        let norm = m.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        m.iter_mut().for_each(|x| *x /= norm);
    }
    merged
}

/// `state` (a unit vector) projected onto the rows of `projection` (each as wide as
/// it), L2-normalised.
fn project(projection: &[f32], state: &[f32]) -> Vec<f32> {
    let mut out: Vec<f32> = projection
        .chunks_exact(state.len())
        .map(|row| dot(row, state))
        .collect();
    let norm = out.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    out.iter_mut().for_each(|x| *x /= norm);
    out
}

/// Cosine similarity of two unit vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

//! Single needle in a haystack (RULER's niah_single): one sentence "The special magic
//! number for <city> is <7 digits>." hidden at a chosen depth of filler text.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::haystack::Haystack;
use crate::error::{Error, Result};
use memagent_agent::TextTokenizer;

use super::ruler::CITIES;

/// One generated task: the document, the question, and what the answer must hold.
#[derive(Debug, Clone, Serialize)]
pub struct NeedleSample {
    pub seed: u64,
    #[serde(skip)]
    pub document: String,
    pub question: String,
    pub key: String,
    pub value: String,
    /// The needle sentence as it appears in the document.
    pub needle: String,
    /// Byte offset of the needle in the document.
    pub needle_byte: usize,
    /// Token offset of the needle (tokens of the filler before it).
    pub needle_token: usize,
    /// Where the needle was asked to go, as a fraction of the document.
    pub depth: f64,
    /// Tokens of the whole document.
    pub tokens: usize,
}

impl NeedleSample {
    /// RULER's rule for needles: the answer holds every expected value.
    pub fn is_hit(&self, answer: &str) -> bool {
        answer.contains(&self.value)
    }
}

/// A document of about `tokens` tokens with one needle at `depth` (0.0 = start, 1.0 =
/// end; it goes after the first sentence end at or past that point). The seed picks the
/// city, the number and where in the haystack the filler starts.
pub fn single_needle(
    haystack: &Haystack,
    tokenizer: &dyn TextTokenizer,
    tokens: usize,
    depth: f64,
    seed: u64,
) -> Result<NeedleSample> {
    if !(0.0..=1.0).contains(&depth) {
        return Err(Error::InvalidRequest(format!(
            "needle depth {depth} is outside 0..1"
        )));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let key = CITIES[rng.random_range(0..CITIES.len())].to_string();
    let value = rng.random_range(1_000_000u32..10_000_000).to_string();
    let start = rng.random_range(0..haystack.word_count());
    let needle = format!("The special magic number for {key} is {value}.");
    let (document, placed) = super::ruler::compose(
        haystack,
        tokenizer,
        tokens,
        start,
        &[(depth, needle.clone())],
    )?;
    let (needle_byte, before) = (placed[0].byte, placed[0].token);
    let tokens = tokenizer.encode(&document)?.len();
    Ok(NeedleSample {
        seed,
        document,
        question: format!("What is the special magic number for {key}?"),
        key,
        value,
        needle,
        needle_byte,
        needle_token: before,
        depth,
        tokens,
    })
}

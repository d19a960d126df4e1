//! Filler text: a folder of essays (the classic needle-in-a-haystack corpus), or RULER's
//! generated "noise" sentences when none is given.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use memagent_agent::TextTokenizer;

/// RULER's noise haystack: these sentences, repeated.
const NOISE: &str = "The grass is green. The sky is blue. The sun is yellow. Here we go. \
                     There and back again.";

/// A stream of words to cut filler from; repeated when a text needs more than it holds.
#[derive(Debug, Clone)]
pub struct Haystack {
    words: Vec<String>,
    source: String,
}

impl Haystack {
    /// The `.txt` files of `dir`, sorted by name and joined (licence and readme files
    /// are skipped).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().to_uppercase())
                    .unwrap_or_default();
                name.ends_with(".TXT")
                    && !name.starts_with("LICENSE")
                    && !name.starts_with("README")
            })
            .collect();
        files.sort();
        let mut words = Vec::new();
        for file in &files {
            let bytes = std::fs::read(file).map_err(|source| Error::Io {
                path: file.clone(),
                source,
            })?;
            words.extend(
                String::from_utf8_lossy(&bytes)
                    .split_whitespace()
                    .map(str::to_string),
            );
        }
        if words.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "haystack folder {} has no text (.txt) files",
                dir.display()
            )));
        }
        Ok(Self {
            words,
            source: format!("{} ({} files)", dir.display(), files.len()),
        })
    }

    /// The words of `text`; `source` names it in reports.
    pub fn from_text(text: &str, source: impl Into<String>) -> Result<Self> {
        let words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        if words.is_empty() {
            return Err(Error::InvalidRequest(
                "the haystack text is empty".to_string(),
            ));
        }
        Ok(Self {
            words,
            source: source.into(),
        })
    }

    /// RULER's generated noise filler.
    pub fn noise() -> Self {
        Self {
            words: NOISE.split_whitespace().map(str::to_string).collect(),
            source: "generated noise (RULER)".to_string(),
        }
    }

    /// Where the words come from, for reports.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn word_count(&self) -> usize {
        self.words.len()
    }

    /// At least `bytes` bytes of the haystack's words joined by spaces, repeating them as
    /// needed.
    pub fn text(&self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes + 64);
        for word in self.words.iter().cycle() {
            if out.len() >= bytes {
                break;
            }
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(word);
        }
        out
    }

    /// Words from `start` (wrapping around the haystack) whose space-joined text is close
    /// to `tokens` tokens, each word with its token count (as it appears after a space).
    ///
    /// Byte-level BPE tokenizers split text into pre-tokens at spaces before merging, so
    /// the tokens of a space-joined text are the sum of its words' tokens.
    pub fn take(
        &self,
        tokenizer: &dyn TextTokenizer,
        start: usize,
        tokens: usize,
    ) -> Result<Vec<(&str, usize)>> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut out = Vec::new();
        let mut total = 0;
        let mut i = start % self.words.len();
        while total < tokens {
            let word = self.words[i].as_str();
            let n = match counts.get(word) {
                Some(&n) => n,
                None => {
                    let n = tokenizer.encode(&format!(" {word}"))?.len();
                    counts.insert(word, n);
                    n
                }
            };
            // Stop short rather than overshoot by more than half a word.
            if total + n > tokens && (total + n - tokens) * 2 > n {
                break;
            }
            out.push((word, n));
            total += n;
            i = (i + 1) % self.words.len();
        }
        Ok(out)
    }
}

//! Reuse of shared prompt prefixes. Every step of the memory loop starts with the same
//! tokens (the chat template's head, the instructions and the question); their keys and
//! values are computed once and copied into later prompts that start the same way.
//!
//! The cache learns where prompts stop agreeing: a prompt that shares no long prefix with
//! an entry is stored (its first [`MAX_ENTRY_TOKENS`] tokens); when a later prompt agrees
//! with an entry for only part of it, the entry is cut to the agreeing part, the template's
//! constant head. Entries are few and short, so the cache stays within
//! [`MAX_ENTRIES`] × [`MAX_ENTRY_TOKENS`] positions.
//!
//! Whole prompts whose replies are scored (a passage ranked by a question's likelihood)
//! are kept apart, each whole, within a budget of bytes (`ScoredPrompts`).

use crate::adapter::Weights;
use crate::error::Result;
use crate::models::{KvCache, Transformer};

/// Entries kept (least recently used dropped first).
pub const MAX_ENTRIES: usize = 8;
/// Prompt positions stored per entry.
pub const MAX_ENTRY_TOKENS: usize = 1024;
/// Shortest shared prefix worth reusing.
pub const MIN_SHARED_TOKENS: usize = 32;

struct Entry {
    ids: Vec<u32>,
    cache: KvCache,
}

/// Keys and values of recent prompt prefixes, for one model.
#[derive(Default)]
pub(crate) struct PrefixCache {
    /// Least recently used first.
    entries: Vec<Entry>,
}

/// Size of a [`PrefixCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub entries: usize,
    /// Positions held in all entries together.
    pub tokens: usize,
}

fn shared(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// The entry sharing the longest prefix with `prompt` (at least
    /// [`MIN_SHARED_TOKENS`]) among those computed with the same `weights` (an adapter,
    /// the reader, or neither), and how many tokens it shares.
    fn best(&self, prompt: &[u32], weights: Weights) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.cache.weights() == weights)
            .map(|(i, e)| (i, shared(&e.ids, prompt)))
            .filter(|&(_, n)| n >= MIN_SHARED_TOKENS)
            .max_by_key(|&(i, n)| (n, i))
    }

    /// A cache for a sequence of `capacity` tokens holding as much of `prompt`'s prefix
    /// as an entry has (never all of it: the last prompt token is left to compute, since
    /// its logits are needed; and never so much that the rest would take other kernels
    /// than a whole prefill, see [`Transformer::resume_point`]), and how many tokens
    /// that is. Only entries computed with the same `weights`.
    pub(crate) fn start(
        &mut self,
        prompt: &[u32],
        capacity: usize,
        weights: Weights,
    ) -> Result<Option<(KvCache, usize)>> {
        let Some((i, n)) = self.best(prompt, weights) else {
            return Ok(None);
        };
        let reuse = Transformer::resume_point(prompt.len(), n.min(prompt.len().saturating_sub(1)));
        if reuse < MIN_SHARED_TOKENS {
            return Ok(None);
        }
        let entry = self.entries.remove(i);
        let cache = entry.cache.fork(reuse, capacity)?;
        self.entries.push(entry);
        Ok(Some((cache, reuse)))
    }

    /// Records the prompt whose keys and values `cache` now holds (at least its first
    /// `prompt.len()` positions, or what fits in an entry).
    pub(crate) fn remember(&mut self, prompt: &[u32], cache: &KvCache) -> Result<()> {
        if let Some((i, n)) = self.best(prompt, cache.weights()) {
            let mut entry = self.entries.remove(i);
            if n < entry.ids.len() {
                // The entry's tail was one prompt's own text: keep the shared head.
                entry.ids.truncate(n);
                entry.cache = entry.cache.fork(n, n)?;
            }
            self.entries.push(entry);
            return Ok(());
        }
        let keep = prompt.len().min(MAX_ENTRY_TOKENS).min(cache.len());
        if keep < MIN_SHARED_TOKENS {
            return Ok(());
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.remove(0);
        }
        self.entries.push(Entry {
            ids: prompt[..keep].to_vec(),
            cache: cache.fork(keep, keep)?,
        });
        Ok(())
    }

    pub(crate) fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.entries.len(),
            tokens: self.entries.iter().map(|e| e.ids.len()).sum(),
        }
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }
}

/// Bytes of keys and values [`ScoredPrompts`] keeps by default: about 160 prompts of 280
/// tokens on a model of SmolLM2-135M's shape (30 layers, 3 key-value heads of 64).
pub const SCORED_PROMPT_BYTES: usize = 1 << 30;

struct Scored {
    ids: Vec<u32>,
    cache: KvCache,
    /// The logits after the prompt's last token.
    last: Vec<f32>,
}

impl Scored {
    fn bytes(&self) -> usize {
        self.cache.bytes() + self.last.len() * std::mem::size_of::<f32>() + self.ids.len() * 4
    }
}

/// Whole prompts whose replies were scored ([`crate::LocalModel::reply_log_probability`]),
/// with their keys and values (in f16, exact) and the logits after them: a search ranking
/// the same passages again for another question reads only the question's tokens.
/// Least recently used dropped first, within a budget of bytes.
pub(crate) struct ScoredPrompts {
    /// Least recently used first.
    entries: Vec<Scored>,
    bytes: usize,
    budget: usize,
}

impl Default for ScoredPrompts {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            bytes: 0,
            budget: SCORED_PROMPT_BYTES,
        }
    }
}

/// Size of a [`ScoredPrompts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScoredPromptStats {
    pub prompts: usize,
    pub bytes: usize,
    /// Bytes kept at most.
    pub budget: usize,
}

/// A prompt kept ahead of the replies scored to it
/// ([`crate::LocalModel::keep_scored_prompt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptPrompt {
    /// Whether the model read it now (else it was kept already).
    pub read: bool,
    /// Bytes it takes kept; 0 when it is not kept (larger than the budget).
    pub bytes: usize,
}

impl ScoredPrompts {
    /// A cache for `prompt` then `capacity - prompt.len()` more tokens holding every
    /// position of `prompt`, and the logits after it, where `prompt` was kept with the
    /// same `weights`.
    pub(crate) fn start(
        &mut self,
        prompt: &[u32],
        capacity: usize,
        weights: Weights,
    ) -> Result<Option<(KvCache, Vec<f32>)>> {
        let Some(i) = self
            .entries
            .iter()
            .position(|e| e.cache.weights() == weights && e.ids == prompt)
        else {
            return Ok(None);
        };
        let entry = self.entries.remove(i);
        let found = (
            entry.cache.fork(prompt.len(), capacity)?,
            entry.last.clone(),
        );
        self.entries.push(entry);
        Ok(Some(found))
    }

    /// The bytes `prompt` takes where it was kept with the same `weights`, marked as the
    /// most recently used.
    pub(crate) fn touch(&mut self, prompt: &[u32], weights: Weights) -> Option<usize> {
        let i = self
            .entries
            .iter()
            .position(|e| e.cache.weights() == weights && e.ids == prompt)?;
        let entry = self.entries.remove(i);
        let bytes = entry.bytes();
        self.entries.push(entry);
        Some(bytes)
    }

    /// Keeps `prompt`, the keys and values `cache` holds of it (its first `prompt.len()`
    /// positions) and the logits after it, dropping the least recently used prompts past
    /// the budget; the bytes it takes. A prompt larger than the budget is not kept (0).
    pub(crate) fn remember(
        &mut self,
        prompt: &[u32],
        cache: &KvCache,
        last: &[f32],
    ) -> Result<usize> {
        if cache.len() < prompt.len() {
            return Ok(0);
        }
        let entry = Scored {
            ids: prompt.to_vec(),
            cache: cache.packed(prompt.len())?,
            last: last.to_vec(),
        };
        let size = entry.bytes();
        if size > self.budget {
            return Ok(0);
        }
        while self.bytes + size > self.budget && !self.entries.is_empty() {
            self.bytes -= self.entries.remove(0).bytes();
        }
        self.bytes += size;
        self.entries.push(entry);
        Ok(size)
    }

    /// Sets the budget, dropping the least recently used prompts past it.
    pub(crate) fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
        while self.bytes > self.budget && !self.entries.is_empty() {
            self.bytes -= self.entries.remove(0).bytes();
        }
    }

    pub(crate) fn stats(&self) -> ScoredPromptStats {
        ScoredPromptStats {
            prompts: self.entries.len(),
            bytes: self.bytes,
            budget: self.budget,
        }
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

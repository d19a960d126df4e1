//! Where each line of a memory came from: the version that wrote it, the chunk that
//! version read, and the passage of that chunk that says it best. Derived on demand from
//! the version chain and the passage index; nothing is stored for it.

use std::collections::{HashMap, HashSet};

use memagent_agent::hygiene::line_key;
use memagent_recall::passages::focus;
use memagent_recall::Recall;
use serde::Serialize;

use memagent_store::{MemoryVersion, Store, StreamRecord, GENERAL};

use crate::search::{search, Evidence};
use crate::Result;

/// Passages searched for a line before keeping the best that lies in its chunk.
const CANDIDATES: usize = 64;

/// The source of one memory line.
#[derive(Debug, Clone, Serialize)]
pub struct LineSource {
    pub line: String,
    /// The oldest version that holds the line in an unbroken run of versions up to the
    /// one asked about: the version that wrote it.
    pub version: u64,
    /// The chunk that version read (none when a person wrote it: an edit, a rollback).
    pub chunk: Option<u64>,
    /// The chunk's bytes in the stream's log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
    /// The passage of the chunk the line is most like (by words and by meaning); for a
    /// line a person wrote, the stream's passage it is most like. None when the index
    /// finds nothing.
    pub passage: Option<Evidence>,
    /// The sentence of the passage, within the chunk, that shares the most words with
    /// the line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quote: Option<String>,
    /// The line of the source file the quote starts on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quote_line: Option<u64>,
}

/// The part of `passage` inside bytes `[start, end)` of the log, cut at characters, and
/// where it starts in the passage's text.
fn inside(passage: &Evidence, start: u64, end: u64) -> (usize, &str) {
    let text = passage.hit.text.as_str();
    let to = (end.saturating_sub(passage.hit.start) as usize).min(text.len());
    let mut a = (start.saturating_sub(passage.hit.start) as usize).min(to);
    while !text.is_char_boundary(a) {
        a += 1;
    }
    let mut b = to;
    while !text.is_char_boundary(b) {
        b -= 1;
    }
    (a.min(b), &text[a.min(b)..b])
}

fn keys(text: &str) -> HashSet<String> {
    text.lines()
        .map(|l| line_key(l).to_lowercase())
        .filter(|k| !k.is_empty())
        .collect()
}

/// The source of every line of `version` of the stream's general memory.
pub fn line_sources(
    store: &Store,
    recall: &Recall,
    stream: &StreamRecord,
    version: &MemoryVersion,
) -> Result<Vec<LineSource>> {
    let versions: HashMap<u64, MemoryVersion> = store
        .versions(stream, GENERAL)?
        .into_iter()
        .map(|v| (v.version, v))
        .collect();
    let mut held: HashMap<u64, HashSet<String>> = HashMap::new();
    let mut out = Vec::new();
    for line in version.text.lines() {
        let key = line_key(line).to_lowercase();
        if key.is_empty() {
            continue;
        }
        let mut writer = version;
        while let Some(parent) = writer.parent.and_then(|p| versions.get(&p)) {
            let lines = held
                .entry(parent.version)
                .or_insert_with(|| keys(&parent.text));
            if !lines.contains(&key) {
                break;
            }
            writer = parent;
        }
        let chunk = match writer.chunk {
            Some(c) => store.chunk(stream, c)?,
            None => None,
        };
        let found = search(
            store,
            recall,
            Some(&[stream.name.as_str()]),
            line_key(line),
            if chunk.is_some() { CANDIDATES } else { 1 },
        )?;
        let passage = match &chunk {
            Some(c) => found
                .into_iter()
                .find(|e| e.hit.start < c.end && e.hit.end > c.start),
            None => found.into_iter().next(),
        };
        let (quote, quote_line) = match &passage {
            Some(p) => {
                let (offset, within) = match &chunk {
                    Some(c) => inside(p, c.start, c.end),
                    None => (0, p.hit.text.as_str()),
                };
                let quote = focus(within, line_key(line), 1);
                // A quote of several sentences is joined by " … ": its first locates it.
                let head = quote.split(" … ").next().unwrap_or(&quote);
                let line = p.hit.line.and_then(|first| {
                    let at = offset + within.find(head)?;
                    Some(first + p.hit.text[..at].matches('\n').count() as u64)
                });
                (Some(quote), line)
            }
            None => (None, None),
        };
        out.push(LineSource {
            line: line_key(line).to_string(),
            version: writer.version,
            chunk: writer.chunk,
            start: chunk.as_ref().map(|c| c.start),
            end: chunk.as_ref().map(|c| c.end),
            passage,
            quote,
            quote_line,
        });
    }
    Ok(out)
}

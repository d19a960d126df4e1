//! Feeding the passage index from the store, and asking it: the index reads each
//! stream's log through the store and learns where each byte came from (the segments'
//! provenance); search results gain the memory version that first read them.

use std::cell::RefCell;

use memagent_agent::{Backend, TextTokenizer};
use memagent_recall::passages::{
    focus, focus_turns, is_turn, lowercase_names, mentions, names, shares_words, turn_time,
};
use memagent_recall::{Hit, LogSource, Origin, Recall, SearchRequest, SyncReport};
use serde::{Deserialize, Serialize};

use memagent_store::{SegmentRecord, Store, StreamRecord};

use crate::{Error, Result};

/// A passage found for a question, with the memory version that first read it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Evidence {
    #[serde(flatten)]
    pub hit: Hit,
    /// The general memory version whose step read this passage's first byte; `None`
    /// while the memory has not read it yet.
    pub version: Option<u64>,
    /// In an answer: what the model answered from this passage alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub said: Option<String>,
    /// In an answer: whether the answer is drawn from this passage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cited: bool,
    /// Ranked again by [`rerank`]: the model's mean log-probability of the question's
    /// tokens after this passage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub likelihood: Option<f64>,
    /// In an answer citing a chat passage: the turn the answer comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<CitedTurn>,
    /// Where each chat turn that starts in the passage starts: its byte in the stream's
    /// log and its line in the source file, as the store's segments record them.
    #[serde(skip)]
    pub turn_lines: Vec<(u64, u64)>,
}

/// The chat turn an answer cites within a passage ([`Evidence::turn`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CitedTurn {
    /// Byte range of the stream's log.
    pub start: u64,
    pub end: u64,
    /// The turn's line in the source file (a chat log's line), when known.
    pub line: Option<u64>,
    /// The turn's time, when it has one.
    pub time: Option<String>,
}

impl Evidence {
    /// A passage found, not yet asked.
    pub fn found(hit: Hit, version: Option<u64>) -> Self {
        Self {
            hit,
            version,
            said: None,
            cited: false,
            likelihood: None,
            turn: None,
            turn_lines: Vec::new(),
        }
    }

    /// The turn of this passage holding the bytes `at..end` of its text (a line of it),
    /// with the turn's line in the source file and its time; the passage's own first
    /// line and time when the line comes before the passage's first turn (a passage cut
    /// inside a turn).
    pub fn turn_at(&self, at: usize, end: usize) -> CitedTurn {
        let h = &self.hit;
        let offset = h.start + at as u64;
        let Some(i) = self.turn_lines.iter().rposition(|&(o, _)| o <= offset) else {
            return CitedTurn {
                start: h.start,
                end: h.start + end as u64,
                line: h.line,
                time: h.time.clone(),
            };
        };
        let (start, line) = self.turn_lines[i];
        let next = self.turn_lines.get(i + 1).map_or(h.end, |&(o, _)| o);
        let from = (start - h.start) as usize;
        CitedTurn {
            start,
            end: next.max(h.start + end as u64),
            line: Some(line),
            time: turn_time(&h.text[from..]).map(str::to_string),
        }
    }
}

/// Where each chat turn starting in `hit` starts, as the store's segments record it:
/// its byte in the stream's log and its line in the source file (see
/// [`Evidence::turn_lines`]). Empty for text that is not a chat log's.
fn turn_lines(store: &Store, stream: &StreamRecord, hit: &Hit) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut segment: Option<(u64, SegmentRecord)> = None;
    let line_of = |segment: &Option<(u64, SegmentRecord)>, offset: u64| {
        segment.as_ref().and_then(|(start, s)| {
            s.turns
                .iter()
                .find(|&&(o, _)| start + o == offset)
                .map(|&(_, line)| line)
        })
    };
    let mut at = 0u64;
    for text in hit.text.split_inclusive('\n') {
        let offset = hit.start + at;
        at += text.len() as u64;
        if !is_turn(text) {
            continue;
        }
        let line = match line_of(&segment, offset) {
            Some(line) => Some(line),
            None => {
                segment = store.segment_at(stream, offset)?;
                line_of(&segment, offset)
            }
        };
        if let Some(line) = line {
            out.push((offset, line));
        }
    }
    Ok(out)
}

/// Indexes what `stream`'s log holds past what the index has read; `on_progress` sees
/// the log offset reached after each commit.
pub fn sync_stream(
    store: &Store,
    recall: &Recall,
    stream: &StreamRecord,
    on_progress: &mut dyn FnMut(u64),
) -> Result<SyncReport> {
    // Origins are asked in increasing offsets: lines are counted on from the last one.
    let counted: RefCell<Option<(u64, SegmentRecord, u64, u64)>> = RefCell::new(None);
    let origin = |offset: u64| -> Origin {
        let found = match store.segment_at(stream, offset) {
            Ok(Some(found)) => found,
            _ => return Origin::default(),
        };
        let (start, segment) = found;
        if segment.source.is_empty() {
            return Origin::default();
        }
        let source = Some(segment.source.clone());
        if !segment.turns.is_empty() {
            let at = offset - start;
            let line = segment
                .turns
                .iter()
                .take_while(|(o, _)| *o <= at)
                .last()
                .map_or(segment.first_line, |(_, l)| *l);
            return Origin {
                source,
                line: Some(line),
            };
        }
        let mut cache = counted.borrow_mut();
        let (from, line) = match &*cache {
            Some((s, _, at, line)) if *s == start && *at <= offset => (*at, *line),
            _ => (start, segment.first_line),
        };
        let newlines = store
            .read_log(stream, from, offset)
            .map(|b| b.iter().filter(|&&c| c == b'\n').count() as u64)
            .unwrap_or(0);
        *cache = Some((start, segment, offset, line + newlines));
        Origin {
            source,
            line: Some(line + newlines),
        }
    };
    let read = |from: u64, to: u64| store.read_log(stream, from, to).map_err(|e| e.to_string());
    let log = LogSource {
        id: stream.id,
        name: &stream.name,
        len: stream.log_len,
        read: &read,
        origin: &origin,
    };
    recall.sync(&log, on_progress).map_err(Error::from)
}

/// Brings the index up to date with every stream, and drops the passages of streams
/// the database no longer has (removed, or an index beside another database).
pub fn sync_all(store: &Store, recall: &Recall) -> Result<Vec<(String, SyncReport)>> {
    let streams = store.streams()?;
    let stored: std::collections::HashSet<u64> = streams.iter().map(|s| s.id).collect();
    for id in recall.stream_ids() {
        if !stored.contains(&id) {
            recall.reset(Some(id)).map_err(Error::from)?;
        }
    }
    sync_grown(store, recall, streams)
}

/// Indexes those of `streams` whose log grew past what the index holds.
fn sync_grown(
    store: &Store,
    recall: &Recall,
    streams: Vec<StreamRecord>,
) -> Result<Vec<(String, SyncReport)>> {
    let mut out = Vec::new();
    for stream in streams {
        if recall.stream_state(stream.id).len < stream.log_len {
            let report = sync_stream(store, recall, &stream, &mut |_| {})?;
            out.push((stream.name, report));
        }
    }
    Ok(out)
}

/// Catches the index up with what the database changed after change number `mark`: the
/// streams written since are read and the streams removed since dropped, an indexed
/// query or two whatever the number of streams ([`Store::changes`]), and `mark` moves
/// on. With no mark, or a database that keeps no change numbers, every stream is read
/// ([`sync_all`]) and the mark set to the latest change from before that read.
pub fn sync_changes(
    store: &Store,
    recall: &Recall,
    mark: &mut Option<u64>,
) -> Result<Vec<(String, SyncReport)>> {
    let Some(after) = *mark else {
        let latest = store.change_mark()?;
        let done = sync_all(store, recall)?;
        *mark = latest;
        return Ok(done);
    };
    let Some(changes) = store.changes(after)? else {
        return sync_all(store, recall);
    };
    let indexed = recall.stream_ids();
    for id in changes.removed.iter().filter(|id| indexed.contains(id)) {
        recall.reset(Some(*id)).map_err(Error::from)?;
    }
    let out = sync_grown(store, recall, changes.streams)?;
    *mark = Some(changes.through);
    Ok(out)
}

/// Bytes of a stream's log the index has not read yet.
pub fn index_lag(recall: &Recall, stream: &StreamRecord) -> u64 {
    stream
        .log_len
        .saturating_sub(recall.stream_state(stream.id).len)
}

/// The best `k` passages for `text` in the named streams (all streams when `None`).
pub fn search(
    store: &Store,
    recall: &Recall,
    streams: Option<&[&str]>,
    text: &str,
    k: usize,
) -> Result<Vec<Evidence>> {
    let records = match streams {
        Some(names) => names
            .iter()
            .map(|n| store.require(n))
            .collect::<memagent_store::Result<Vec<_>>>()?,
        None => store.streams()?,
    };
    let ids: Vec<u64> = records.iter().map(|s| s.id).collect();
    let hits = recall
        .search(&SearchRequest {
            text,
            streams: streams.map(|_| ids.as_slice()),
            k,
        })
        .map_err(Error::from)?;
    hits.into_iter()
        .map(|hit| {
            let record = records.iter().find(|s| s.id == hit.stream_id);
            let version = match record {
                Some(s) => store.version_reading(s, hit.start)?,
                None => None,
            };
            let lines = match record {
                Some(s) => turn_lines(store, s, &hit)?,
                None => Vec::new(),
            };
            Ok(Evidence {
                turn_lines: lines,
                ..Evidence::found(hit, version)
            })
        })
        .collect()
}

/// The most passages [`rerank`] is asked to rank again.
pub const RERANK_MAX: usize = 200;

/// What is wrong with a request's `rerank` field asking to rank `n` passages again: more
/// than [`RERANK_MAX`].
pub fn rerank_field_error(n: usize) -> Option<String> {
    (n > RERANK_MAX).then(|| format!("`rerank` must be at most {RERANK_MAX}"))
}

/// What follows a passage in the prompt whose reply [`rerank`] scores the question as.
pub const RERANK_PROMPT: &str = "Write a question that the chat above answers.";

/// `found` with its best `n` ranked again by how likely the model finds the question
/// as its reply to each passage followed by [`RERANK_PROMPT`] (query likelihood, with
/// the base model's weights): each passage's mean log-probability of the question's
/// tokens, scaled 0–1 over the `n`, is added to its fused score, and the `n` are
/// sorted by the sum; the others follow in their order. The model reads each passage
/// as stored, chat turns with their times and roles. Measured on LoCoMo's development
/// conversations (docs/benchmarks/conversations/): ranking the fused 20 again puts
/// every evidence turn of a question within the first 10 passages for more questions
/// (79% → 83% of every 4th), at one prefill of a passage each; added at half or twice
/// the weight, or alone, it ranks worse, and turns shown as `name: words` (fewer
/// tokens) rank worse too (81.7%).
pub fn rerank(
    backend: &dyn Backend,
    question: &str,
    mut found: Vec<Evidence>,
    n: usize,
) -> Result<Vec<Evidence>> {
    let n = n.min(found.len());
    let rest = found.split_off(n);
    let mut scored = Vec::with_capacity(n);
    for mut e in found {
        let message = rerank_message(&e.hit.text);
        e.likelihood = Some(backend.reply_log_probability(&message, question)?);
        scored.push(e);
    }
    let likelihood = |e: &Evidence| e.likelihood.unwrap_or(f64::NEG_INFINITY);
    let high = scored
        .iter()
        .map(likelihood)
        .fold(f64::NEG_INFINITY, f64::max);
    let low = scored.iter().map(likelihood).fold(f64::INFINITY, f64::min);
    let span = (high - low).max(f64::EPSILON);
    let sum = |e: &Evidence| e.hit.score + (likelihood(e) - low) / span;
    // A stable sort: equal sums keep the search's order.
    scored.sort_by(|a, b| sum(b).total_cmp(&sum(a)));
    scored.extend(rest);
    Ok(scored)
}

/// The message whose reply [`rerank`] scores a question as: `passage` (as stored) and
/// [`RERANK_PROMPT`].
fn rerank_message(passage: &str) -> String {
    format!("{passage}\n\n{RERANK_PROMPT}")
}

/// Passages read ahead for [`rerank`] while nothing waits on the model, one at a time
/// ([`ReadAhead::step`]), so that a question ranking them later reads only its own
/// tokens (0.3 s a passage less with the default model on 2 cores): a stream's newest
/// passages that fit together in what the backend keeps
/// ([`Backend::scored_prompt_stats`]), read newest first and, once read, marked as used
/// oldest first, so that what the backend drops first when later passages come is the
/// oldest. A backend that keeps nothing (a remote server) reads nothing ahead.
#[derive(Debug, Default)]
pub struct ReadAhead {
    /// Messages still to read, the newest passage's first.
    queue: std::collections::VecDeque<String>,
    /// Messages of this round kept, the newest passage's first.
    kept: Vec<String>,
    /// Bytes they take kept, and the most one took.
    bytes: usize,
    largest: usize,
    /// Passages the model read ahead since start.
    read: usize,
}

impl ReadAhead {
    /// Starts a round over `passages` (a stream's, oldest first), in place of what is
    /// left of the round before.
    pub fn plan<'a>(&mut self, passages: impl DoubleEndedIterator<Item = &'a str>) {
        self.queue = passages.rev().map(rerank_message).collect();
        self.kept.clear();
        self.bytes = 0;
        self.largest = 0;
    }

    /// Passages left to read or find kept in this round.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Whether the round is over (nothing to read, nothing to mark).
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.kept.is_empty()
    }

    /// Passages the model read ahead so far (those found kept already not counted).
    pub fn read(&self) -> usize {
        self.read
    }

    /// Reads (or finds kept) the round's next passage; when the round ends (no passage
    /// left, or the next might not fit beside those kept in it), marks those kept as
    /// used, oldest first. Whether the model read a passage.
    pub fn step(&mut self, backend: &dyn Backend) -> Result<bool> {
        let budget = backend.scored_prompt_stats().map_or(0, |s| s.budget);
        let next = self
            .queue
            .pop_front()
            .filter(|_| self.bytes + self.largest <= budget);
        let Some(message) = next else {
            self.queue.clear();
            for message in self.kept.drain(..).rev() {
                backend.keep_scored_prompt(&message)?;
            }
            return Ok(false);
        };
        let Some(kept) = backend.keep_scored_prompt(&message)? else {
            self.queue.clear();
            self.kept.clear();
            return Ok(false);
        };
        if kept.bytes > 0 {
            self.kept.push(message);
            self.bytes += kept.bytes;
            self.largest = self.largest.max(kept.bytes);
        }
        self.read += usize::from(kept.read);
        Ok(kept.read)
    }
}

/// Tokens of passages an answer reads by default, its prompts together: each prompt
/// holds one passage (and the question), so none grows with the stream or the budget.
/// Chosen on LoCoMo's development conversations (docs/benchmarks/conversations/): with
/// chat passages read by their turns ([`shown_text`]) 768 tokens read about four passages
/// a question; with passages read whole, 512 tokens read two and answered "not known" to
/// 12% of the answerable questions, 768 to 6%, and 1,024 scored lower than 768.
pub const EVIDENCE_TOKENS: usize = 768;

/// A passage that shares no word with the question enters an answer's prompt only when
/// its embedding is at least this similar to the question's (cosine).
pub const MEANING_ONLY_SIMILARITY: f32 = 0.35;

/// Whether `question` asks for a guess ("Would Ana enjoy a hike?", "What might Ben
/// study?", "What is Ravi likely to cook?"): a modal verb or a word of likelihood. It
/// asks for an inference, so the rules that answer "not mentioned" without the model
/// leave it to the model: what one person said can bear on a guess about the other (the
/// speaker rule), and a guess may name what the chat never said ("Would Ana enjoy a
/// novel by Tolstoy?", [`unmentioned`]).
pub(crate) fn asks_for_a_guess(question: &str) -> bool {
    question
        .split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .any(|w| ["would", "might", "could", "likely", "probably"].contains(&w.as_str()))
}

/// A name the question asks about (a capitalised word inside it) that none of the
/// passages found for it and not the memory mention in any form: what the stream never
/// said, so the answer is "not known" without asking the model. The search ranks any
/// passage holding a rare name near the top, so a name absent from the passages found is
/// absent from the stream. A form is the word in any case, with another ending (the
/// first six letters agree), or with one letter slipped ("Jean" for "John" is two
/// letters, not one; "Johns" for "John" is one). Months and weekdays ("Aug" too) are not names:
/// chat turns carry their dates as times, not words. A question asking for a guess
/// ([`asks_for_a_guess`]) names none the stream must hold. Measured on LoCoMo's
/// development conversations (docs/benchmarks/conversations/), every question (1,052):
/// 4 guesses had been answered "not mentioned" this way (an author, a song, a place the
/// chat never named), all open-domain, none adversarial; asked of the model, 2 scored
/// better, none worse; false "not known" 7.7% → 7.2%.
pub fn unmentioned(question: &str, found: &[Evidence], memory: &str) -> Option<String> {
    if asks_for_a_guess(question) {
        return None;
    }
    let mut stored: Vec<String> = words_of(memory);
    for e in found {
        stored.extend(words_of(e.hit.shown()));
    }
    stored.sort_unstable();
    stored.dedup();
    names(question)
        .into_iter()
        .filter(|name| !memagent_recall::dates::is_calendar_word(name))
        .find(|name| {
            // A name written with a hyphen or an apostrophe ("Jean-Luc", "O'Brien") is
            // stored as its parts: it is mentioned when one of them is.
            let name = name.to_lowercase();
            !words_of(&name)
                .iter()
                .filter(|part| part.chars().count() > 1)
                .any(|part| stored.iter().any(|w| same_word(part, w)))
        })
}

/// The lower-cased words of `text`.
fn words_of(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Whether two lower-cased words are forms of one: equal, the same first six letters
/// (another ending), or one letter apart in words of four letters or more.
pub(crate) fn same_word(a: &str, b: &str) -> bool {
    let prefix = |w: &str| w.chars().take(6).collect::<String>();
    a == b
        || (a.chars().count() >= 6 && prefix(a) == prefix(b))
        || (a.chars().count() >= 4 && strsim::damerau_levenshtein(a, b) <= 1)
}

/// Sentences of a plain-text passage an answer prompt keeps (those sharing the most
/// words with the question; the whole passage when none does).
pub const FOCUS_SENTENCES: usize = 2;

/// Turns of a chat passage an answer prompt keeps, each with the turn before it.
/// Measured on LoCoMo's development conversations (docs/benchmarks/conversations/):
/// three read better than two (F1 0.330 → 0.351) with the generated chats' checks
/// unchanged.
pub const FOCUS_TURNS: usize = 3;

/// What an answer's prompt shows of a passage's `text` for `question`: of a chat passage
/// (one holding the start of a turn), the [`FOCUS_TURNS`] turns bearing on the question,
/// each with the turn before it
/// ([`focus_turns`](memagent_recall::passages::focus_turns)), since a turn's words answer
/// the turn before it ("Yes! A stool and two shelves" says what the question before it
/// asked); of other text, the [`FOCUS_SENTENCES`] sentences bearing on the question
/// ([`focus`](memagent_recall::passages::focus)), which stand on their own. Measured on
/// LoCoMo's development conversations and the generated checks
/// (docs/benchmarks/conversations/): sentences alone read single-hop questions worst;
/// whole chat passages read them best but lost the generated chats' facts among their
/// neighbours; plain text read whole loses RULER's multi-value needles.
pub fn shown_text(text: &str, question: &str) -> String {
    match text.lines().any(is_turn) {
        true => focus_turns(text, question, FOCUS_TURNS),
        false => focus(text, question, FOCUS_SENTENCES),
    }
}

/// The passages an answer reads: the best of `evidence`, each as [`shown_text`] shows
/// it, as many as fit in `budget` tokens of `tokenizer` (one that does not fit is
/// skipped for a shorter one after it), in log order (oldest first, so the latest word
/// on a fact comes last).
pub fn evidence_passages(
    tokenizer: &dyn TextTokenizer,
    question: &str,
    evidence: Vec<Evidence>,
    budget: usize,
) -> Result<Vec<(String, Evidence)>> {
    let mut chosen: Vec<(String, Evidence, usize)> = Vec::new();
    let mut used = 0;
    // When some passages name what the question names, the others are about something
    // else (another river's number, another person's city) that merely shares words.
    let wanted = lowercase_names(question);
    let naming = |e: &Evidence| mentions(&e.hit.text, &wanted);
    let any_named = evidence.iter().any(naming);
    for e in evidence {
        if any_named && !naming(&e) {
            continue;
        }
        // Found by meaning alone, sharing no word with the question, and not close in
        // meaning either: it only filled a place among the k.
        if !shares_words(&e.hit.text, question)
            && e.hit.similarity.is_none_or(|s| s < MEANING_ONLY_SIMILARITY)
        {
            continue;
        }
        let text = shown_text(e.hit.shown(), question);
        // Overlapping windows find the same sentences twice: a passage whose words are
        // all in one already given adds nothing, and one that holds a given one whole
        // takes its place.
        if chosen
            .iter()
            .any(|(given, _, _)| given.contains(text.as_str()))
        {
            continue;
        }
        let tokens = |text: &str| -> Result<usize> {
            Ok(tokenizer.encode(text).map_err(Error::from)?.len())
        };
        let cost = tokens(&text)?;
        let within = chosen
            .iter()
            .position(|(given, _, _)| text.contains(given.as_str()));
        let freed = within.map_or(0, |i| chosen[i].2);
        if used + cost - freed <= budget {
            if let Some(i) = within {
                chosen.remove(i);
            }
            used = used + cost - freed;
            chosen.push((text, e, cost));
        }
    }
    chosen.sort_by_key(|(_, e, _)| (e.hit.stream_id, e.hit.start));
    Ok(chosen.into_iter().map(|(text, e, _)| (text, e)).collect())
}

/// The log byte ranges of the sentences of `found` that an answer's prompt shows for
/// `question` ([`shown_text`]; the whole passage when it is shown whole), found in the
/// stored text.
pub fn shown_ranges(found: &Evidence, question: &str) -> Vec<(u64, u64)> {
    let text = &found.hit.text;
    let whole = (found.hit.start, found.hit.end);
    let kept = shown_text(text, question);
    if kept == text.trim() {
        return vec![whole];
    }
    let mut ranges = Vec::new();
    let mut from = 0;
    for sentence in kept.split(" … ") {
        if let Some(at) = text[from..].find(sentence) {
            let start = found.hit.start + (from + at) as u64;
            ranges.push((start, start + sentence.len() as u64));
            from += at + sentence.len();
        }
    }
    ranges
}

/// Lines of the memory an answer prompt keeps: those sharing the most words with the
/// question ([`relevant_notes`]).
pub const NOTE_LINES: usize = 3;

/// An answer without the passage labels a small model copies along with a passage's
/// words ("Passage 1: The code is 4411." answers "The code is 4411."); the passages
/// it comes from are cited beside the answer.
pub fn unlabelled(answer: &str) -> String {
    answer
        .lines()
        .map(|line| {
            let rest = line.trim_start().strip_prefix("Passage ").and_then(|r| {
                let digits = r.chars().take_while(char::is_ascii_digit).count();
                (digits > 0)
                    .then(|| r[digits..].strip_prefix(':'))
                    .flatten()
            });
            rest.map_or(line, str::trim_start)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round reads a stream's newest passages that fit in what the model keeps, newest
    /// first, and leaves them used oldest first: a passage scored next, when there is no
    /// room left, drops the older of them and keeps the newest (real default model).
    #[test]
    fn passages_read_ahead_are_the_newest_that_fit_and_the_oldest_goes_first() {
        use memagent_engine::{LoadOptions, LocalModel, Message, Weights};
        let path = std::env::var_os("MEMAGENT_MODEL").map_or_else(
            || {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
            },
            Into::into,
        );
        let m = LocalModel::load(&path, &LoadOptions::default()).unwrap();
        let passages = [
            "Ana: The pottery class moved to Thursdays, and the kiln is finally fixed, so we \
             glaze the bowls next week before the market in the old square.",
            "Ben: The fencing club meets on Tuesdays now.",
            "Ana: I keep bees on the roof of my flat in Porto.",
            "Ben: My aunt sent a crate of oranges.",
        ];
        let keep = |p: &str| {
            m.keep_scored_prompt(&[Message::user(rerank_message(p))], Weights::Base)
                .unwrap()
        };
        let sizes: Vec<usize> = passages
            .iter()
            .map(|p| {
                m.clear_scored_prompts();
                keep(p).bytes
            })
            .collect();
        m.clear_scored_prompts();
        assert!(sizes[0] > sizes[2].max(sizes[3]), "{sizes:?}");
        // Room for the two newest, not for a third of their size beside them.
        m.set_scored_prompt_budget(sizes[2] + sizes[3] + sizes[2].max(sizes[3]) - 1);

        let mut ahead = ReadAhead::default();
        ahead.plan(passages.iter().copied());
        while !ahead.is_idle() {
            ahead.step(&m).unwrap();
        }
        assert_eq!(ahead.read(), 2);
        assert_eq!(m.scored_prompt_stats().prompts, 2);
        // The oldest passage scored: no room beside both, so the older of them goes.
        m.reply_log_probability(
            &[Message::user(rerank_message(passages[0]))],
            "Where are the bowls glazed?",
            Weights::Base,
        )
        .unwrap();
        assert!(!keep(passages[3]).read, "the newest passage is still kept");
        assert!(keep(passages[2]).read, "the older of the two went first");
    }

    /// One token per word.
    struct Words;

    impl TextTokenizer for Words {
        fn encode(&self, text: &str) -> memagent_agent::Result<Vec<u32>> {
            Ok(text.split_whitespace().map(|_| 0).collect())
        }
        fn decode(&self, _: &[u32]) -> memagent_agent::Result<String> {
            Ok(String::new())
        }
    }

    fn found(start: u64, text: &str, similarity: Option<f32>) -> Evidence {
        Evidence::found(
            Hit {
                stream: "s".into(),
                stream_id: 1,
                start,
                end: start + text.len() as u64,
                text: text.into(),
                dated: None,
                source: None,
                line: None,
                time: None,
                score: 0.0,
                bm25_rank: None,
                vector_rank: None,
                similarity,
                token_similarity: None,
            },
            None,
        )
    }

    #[test]
    fn the_passages_hold_each_sentence_once_oldest_first_within_their_budget() {
        let q = "What is the code for the Loire?";
        let evidence = vec![
            // Best first, as the search ranks them.
            found(
                900,
                "Fog. The code for the Loire is 5363752. Fog at noon.",
                None,
            ),
            found(
                100,
                "Filler. The code for the Loire is 6607626. Rain.",
                None,
            ),
            // Overlapping windows: the same sentence again, and cut short.
            found(905, "code for the Loire is 5363752.", None),
            // Shares no word and is far in meaning: left out.
            found(50, "Dense fog over the valley.", Some(0.1)),
            found(400, "The code for the Loire is 1017048.", None),
        ];
        let texts = |chosen: &[(String, Evidence)]| -> Vec<String> {
            chosen.iter().map(|(t, _)| t.clone()).collect()
        };
        let chosen = evidence_passages(&Words, q, evidence.clone(), 1000).unwrap();
        assert_eq!(
            texts(&chosen),
            [
                "The code for the Loire is 6607626.",
                "The code for the Loire is 1017048.",
                "The code for the Loire is 5363752."
            ]
        );
        let starts: Vec<u64> = chosen.iter().map(|(_, e)| e.hit.start).collect();
        assert_eq!(starts, [100, 400, 900]);
        // A budget of two passages' words keeps the two best.
        let chosen = texts(&evidence_passages(&Words, q, evidence, 14).unwrap());
        assert_eq!(chosen.len(), 2, "{chosen:?}");
        assert!(
            chosen[0].contains("6607626") && chosen[1].contains("5363752"),
            "{chosen:?}"
        );
        // Another river's code shares the words but not the name.
        let other = vec![
            found(10, "The code for the Volga is 4690155.", None),
            found(400, "The code for the Loire is 1017048.", None),
        ];
        let chosen = texts(&evidence_passages(&Words, q, other.clone(), 100).unwrap());
        assert_eq!(chosen, ["The code for the Loire is 1017048."]);
        let chosen = texts(&evidence_passages(&Words, "What is the code?", other, 100).unwrap());
        assert_eq!(chosen.len(), 2, "{chosen:?}");
        assert!(evidence_passages(&Words, q, Vec::new(), 20)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_name_is_unmentioned_only_when_no_form_of_it_is_stored() {
        let found = [found(
            0,
            "[2023-05-08 13:56] user (John): I visited Paris with my colleagues.",
            None,
        )];
        let absent = |q: &str| unmentioned(q, &found, "(none yet)");
        // A one-letter slip, another ending, another case: the same name.
        assert_eq!(absent("Which city did Johns visit?"), None);
        assert_eq!(absent("Which city did Jhon visit?"), None);
        assert_eq!(absent("Who were John's Colleague friends?"), None);
        // A date is not a name the turns must say.
        assert_eq!(absent("Where was John in July 2023?"), None);
        assert_eq!(absent("What did John get on Aug 15th?"), None);
        // Another name altogether.
        assert_eq!(
            absent("Which city have both Mary and John visited?"),
            Some("Mary".into())
        );
        assert_eq!(absent("Where does Ingrid live?"), Some("Ingrid".into()));
        // Initials and abbreviations are not names the turns must say; a hyphenated
        // word is said by its parts.
        assert_eq!(
            absent("Did John read J.B. Okoro in the U.S.?"),
            Some("Okoro".into())
        );
        assert_eq!(absent("Which Paris-based colleagues did John visit?"), None);
        assert_eq!(
            absent("Which Jean-Luc did John visit?"),
            Some("Jean-Luc".into())
        );
        // The memory counts as stored.
        assert_eq!(
            unmentioned("Where does Ingrid live?", &found, "Ingrid lives in Oslo."),
            None
        );
        // A guess may name what the chat never said: the model is asked.
        assert_eq!(absent("Would John likely enjoy a novel by Tolstoy?"), None);
        assert_eq!(absent("What might Ingrid think of Paris?"), None);
        assert_eq!(
            absent("What does Ingrid think of Paris?"),
            Some("Ingrid".into())
        );
    }

    #[test]
    fn the_ranges_shown_are_the_sentences_kept() {
        let text = "Fog. The code for the Loire is 5363752. Rain at noon. The Loire floods.";
        let e = found(100, text, None);
        let shown = shown_ranges(&e, "What is the code for the Loire?");
        let quoted: Vec<&str> = shown
            .iter()
            .map(|&(a, b)| &text[(a - 100) as usize..(b - 100) as usize])
            .collect();
        assert_eq!(
            quoted,
            ["The code for the Loire is 5363752.", "The Loire floods."]
        );
        let short = found(7, "One. Two.", None);
        assert_eq!(shown_ranges(&short, "What?"), [(7, 7 + 9)]);
    }

    /// A chat turn answers the turn before it: the question asked there holds the words
    /// the answer leaves out, so a chat passage is read by its bearing turns with their
    /// neighbours, and plain text by its sentences.
    #[test]
    fn a_chat_passage_is_shown_by_its_turns_and_plain_text_by_its_sentences() {
        let chat = "[2023-05-08 13:40] user (Cid): The bakery on Elm closed.\n\
                    [2023-05-08 13:45] user (Dee): Sad. The traffic was awful too.\n\
                    [2023-05-08 13:50] user (Cid): Lunch at noon, then.\n\
                    [2023-05-08 13:56] user (Ana): Did you ever finish the woodworking class?\n\
                    [2023-05-08 13:57] user (Ben): Yes! Made a stool and two shelves. Sanded them smooth.";
        let q = "What did Ben make in the woodworking class?";
        let shown = shown_text(chat, q);
        assert!(
            shown.contains("a stool and two shelves. Sanded them smooth."),
            "{shown}"
        );
        assert!(
            shown.starts_with("[2023-05-08 13:56] user (Ana): Did you ever finish"),
            "{shown}"
        );
        assert!(
            !shown.contains("Lunch") && !shown.contains("traffic"),
            "{shown}"
        );
        let e = found(40, chat, None);
        let ranges = shown_ranges(&e, q);
        assert_eq!(ranges.len(), 1, "one run of turns: {ranges:?}");
        assert_eq!(
            &chat[(ranges[0].0 - 40) as usize..(ranges[0].1 - 40) as usize],
            shown
        );
        let chosen = evidence_passages(&Words, q, vec![e], 1000).unwrap();
        assert_eq!(chosen[0].0, shown);
        let plain = "Fog. The woodworking class ended in May. Rain at noon. Ben made shelves.";
        let shown = shown_text(plain, q);
        assert!(shown.contains("Ben made shelves."), "{shown}");
        assert!(!shown.contains("Fog") && !shown.contains("Rain"), "{shown}");
    }

    #[test]
    fn answers_lose_copied_passage_labels() {
        assert_eq!(
            unlabelled("Passage 1: The code is 4411."),
            "The code is 4411."
        );
        assert_eq!(unlabelled("Passage 12: A.\nPassage 3: B."), "A.\nB.");
        assert_eq!(unlabelled("Passage one: A."), "Passage one: A.");
        assert_eq!(unlabelled("It is 4411."), "It is 4411.");
    }
}

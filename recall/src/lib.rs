//! Recall: every passage a stream ever stored, searchable by words and by meaning.
//!
//! Text is cut into passages (a chat turn; a paragraph window of a document; see
//! [`passages`]) with their provenance, indexed by words with BM25 (tantivy) and by
//! meaning with sentence embeddings (all-MiniLM-L6-v2 through candle), and searched with
//! the two rankings fused by reciprocal rank. The index is derived data and must never
//! become a source of truth: it knows nothing of the database, reads a stream only
//! through the [`LogSource`] it is given, and records how far it has read each stream
//! in the same tantivy commit as the passages (the commit's payload), so after a crash
//! it catches up from there, and [`Recall::reset`] plus a sync rebuilds it from scratch.
//!
//! ```no_run
//! use memagent_recall::{LogSource, Origin, Recall, SearchRequest};
//!
//! let recall = Recall::open("/tmp/memagent-data/index".as_ref(), None)?;
//! let log = b"user: my sister Ingrid's birthday is on the 14th of March\n".to_vec();
//! let source = LogSource {
//!     id: 1,
//!     name: "chat",
//!     len: log.len() as u64,
//!     read: &|from, to| Ok(log[from as usize..to as usize].to_vec()),
//!     origin: &|_| Origin::default(),
//! };
//! recall.sync(&source, &mut |_| {})?;
//! let hits = recall.search(&SearchRequest { text: "Ingrid birthday", streams: None, k: 3 })?;
//! # Ok::<(), memagent_recall::Error>(())
//! ```

mod bert;
mod embed;
mod error;
pub mod passages;

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::index::SegmentId;
use tantivy::query::{BooleanQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, FAST, INDEXED, STORED,
};
use tantivy::{
    DocAddress, DocId, Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term,
};

pub use embed::{dot, EmbedStats, Embedder, FILES as EMBEDDER_FILES, MAX_TOKENS};
pub use error::{Error, Result};

/// Candidates each ranking contributes to the fusion.
const CANDIDATES: usize = 50;
/// Reciprocal-rank fusion's constant (Cormack et al.): score = Σ 1 / (K + rank).
const RRF_K: f64 = 60.0;
/// Bytes of the log read and committed at a time.
const WINDOW: u64 = 256 * 1024;
/// Segments under this many passages are merged together once there are more than
/// [`MAX_SMALL_SEGMENTS`] of them.
const SMALL_SEGMENT: u32 = 20_000;
const MAX_SMALL_SEGMENTS: usize = 8;
/// Format of the commit payload.
const STATE_FORMAT: u32 = 1;

/// Where a byte of a stream's log came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The file (or the name an append gave).
    pub source: Option<String>,
    /// 1-based line in that source.
    pub line: Option<u64>,
}

/// A stream as the index reads it: its log, through `read`, and where each byte came
/// from, through `origin`.
pub struct LogSource<'a> {
    pub id: u64,
    pub name: &'a str,
    /// Bytes in the log.
    pub len: u64,
    /// Bytes `[from, to)` of the log.
    pub read: &'a dyn Fn(u64, u64) -> std::result::Result<Vec<u8>, String>,
    pub origin: &'a dyn Fn(u64) -> Origin,
}

/// How far the index has read one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// Log offset where the open (last, still growing) passage starts; every passage
    /// before it is final.
    pub tail: u64,
    /// Bytes of the log indexed.
    pub len: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    format: u32,
    streams: BTreeMap<u64, StreamState>,
}

/// What one sync did.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncReport {
    pub bytes: u64,
    pub passages: usize,
    pub embed: EmbedStats,
    pub seconds: f64,
}

/// A search.
pub struct SearchRequest<'a> {
    pub text: &'a str,
    /// Stream ids to search; `None`: every stream.
    pub streams: Option<&'a [u64]>,
    pub k: usize,
}

/// One passage found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    pub stream: String,
    pub stream_id: u64,
    /// Byte range of the stream's log.
    pub start: u64,
    pub end: u64,
    pub text: String,
    pub source: Option<String>,
    pub line: Option<u64>,
    /// The chat turn's time, when it has one.
    pub time: Option<String>,
    /// Fused score: Σ 1/(60 + rank) over the rankings that found it.
    pub score: f64,
    /// 1-based rank by words (BM25) and by meaning, where each found it.
    pub bm25_rank: Option<usize>,
    pub vector_rank: Option<usize>,
    /// Cosine similarity to the query, when ranked by meaning.
    pub similarity: Option<f32>,
}

/// A candidate of the fusion.
struct Fused {
    address: DocAddress,
    score: f64,
    bm25_rank: Option<usize>,
    vector_rank: Option<usize>,
    similarity: Option<f32>,
}

impl Fused {
    fn new(address: DocAddress) -> Self {
        Self {
            address,
            score: 0.0,
            bm25_rank: None,
            vector_rank: None,
            similarity: None,
        }
    }
}

struct Fields {
    stream_id: Field,
    stream: Field,
    start: Field,
    end: Field,
    text: Field,
    source: Field,
    line: Field,
    time: Field,
    vector: Field,
}

/// A segment's passage vectors: int8 with one scale each, beside each passage's
/// document, stream and start.
struct SegmentVectors {
    docs: Vec<(DocId, u64, u64, f32)>,
    values: Vec<i8>,
    dims: usize,
}

/// The passage index of a data directory.
pub struct Recall {
    path: PathBuf,
    index: Index,
    writer: Mutex<IndexWriter>,
    reader: IndexReader,
    f: Fields,
    embedder: Option<Arc<Embedder>>,
    state: Mutex<State>,
    vectors: Mutex<HashMap<SegmentId, Arc<SegmentVectors>>>,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let text_options = TextOptions::default()
        .set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer("en_stem")
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        )
        .set_stored();
    let f = Fields {
        stream_id: b.add_u64_field("stream_id", INDEXED | STORED | FAST),
        stream: b.add_text_field("stream", STORED),
        start: b.add_u64_field("start", INDEXED | STORED | FAST),
        end: b.add_u64_field("end", STORED),
        text: b.add_text_field("text", text_options),
        source: b.add_text_field("source", STORED),
        line: b.add_u64_field("line", STORED),
        time: b.add_text_field("time", STORED),
        vector: b.add_bytes_field("vector", STORED),
    };
    (b.build(), f)
}

impl Recall {
    /// Opens (or creates) the index in `dir`; with an embedder, passages are also
    /// indexed and searched by meaning.
    ///
    /// An index of another layout (written by another version of memagent) or with an
    /// unreadable state is derived data: it is removed and made again, empty, for the
    /// caller's catch-up to fill from the logs.
    pub fn open(dir: &Path, embedder: Option<Arc<Embedder>>) -> Result<Self> {
        match Self::open_as_is(dir, embedder.clone()) {
            Err(e @ Error::State { .. })
            | Err(
                e @ Error::Index {
                    source: tantivy::TantivyError::SchemaError(_),
                    ..
                },
            ) => {
                tracing::warn!("{e}; making the search index again from the stored logs");
                std::fs::remove_dir_all(dir).map_err(|source| Error::Index {
                    path: dir.to_path_buf(),
                    source: source.into(),
                })?;
                Self::open_as_is(dir, embedder)
            }
            other => other,
        }
    }

    fn open_as_is(dir: &Path, embedder: Option<Arc<Embedder>>) -> Result<Self> {
        let err = |source| Error::Index {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| err(e.into()))?;
        let (schema, f) = schema();
        let directory = MmapDirectory::open(dir).map_err(|e| err(e.into()))?;
        let index = Index::open_or_create(directory, schema).map_err(err)?;
        let writer = match index.writer_with_num_threads::<TantivyDocument>(1, 32_000_000) {
            Ok(w) => {
                // Merges are ours (see `compact`), so none runs behind a commit.
                w.set_merge_policy(Box::new(tantivy::indexer::NoMergePolicy));
                w
            }
            Err(tantivy::TantivyError::LockFailure(..)) => {
                return Err(Error::InUse {
                    path: dir.to_path_buf(),
                })
            }
            Err(e) => return Err(err(e)),
        };
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(err)?;
        let metas = index.load_metas().map_err(err)?;
        let state = match metas.payload.as_deref() {
            None => State {
                format: STATE_FORMAT,
                ..State::default()
            },
            Some(p) => serde_json::from_str::<State>(p)
                .ok()
                .filter(|s| s.format == STATE_FORMAT)
                .ok_or_else(|| Error::State {
                    path: dir.to_path_buf(),
                    reason: format!("commit payload {p:?}"),
                })?,
        };
        Ok(Self {
            path: dir.to_path_buf(),
            index,
            writer: Mutex::new(writer),
            reader,
            f,
            embedder,
            state: Mutex::new(state),
            vectors: Mutex::new(HashMap::new()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn embedder(&self) -> Option<&Embedder> {
        self.embedder.as_deref()
    }

    fn err(&self, source: tantivy::TantivyError) -> Error {
        Error::Index {
            path: self.path.clone(),
            source,
        }
    }

    /// How far the index has read a stream.
    pub fn stream_state(&self, id: u64) -> StreamState {
        let state = self.state.lock().expect("recall state");
        state.streams.get(&id).copied().unwrap_or_default()
    }

    /// Streams the index holds passages of.
    pub fn stream_ids(&self) -> Vec<u64> {
        let state = self.state.lock().expect("recall state");
        state.streams.keys().copied().collect()
    }

    /// Indexes whatever the stream's log holds past what was indexed, a window at a
    /// time, each window one commit with the new reading position; `on_progress` sees
    /// the log offset reached after each commit.
    pub fn sync(
        &self,
        log: &LogSource<'_>,
        on_progress: &mut dyn FnMut(u64),
    ) -> Result<SyncReport> {
        let started = std::time::Instant::now();
        let mut report = SyncReport::default();
        let mut current = self.stream_state(log.id);
        if current.len > log.len {
            // The log is shorter than what was indexed: it is not the log we indexed
            // (a stream removed and created again under the same id cannot happen, but
            // an index copied beside another database can). Start over.
            tracing::warn!(
                "search index: stream `{}` has {} bytes but {} were indexed; reindexing it",
                log.name,
                log.len,
                current.len
            );
            self.reset(Some(log.id))?;
            current = StreamState::default();
        }
        let mut window = WINDOW;
        while current.len < log.len {
            let from = current.tail;
            let to = from.saturating_add(window).min(log.len);
            let bytes = (log.read)(from, to).map_err(|reason| Error::Read {
                stream: log.name.to_string(),
                offset: from,
                reason,
            })?;
            let at_end = to == log.len;
            let text = readable(&bytes, at_end, log.name, from);
            let cut = passages::cut(&text);
            if !at_end && cut.tail == 0 && !text.trim().is_empty() {
                // No passage closed inside the window: read a larger one.
                window *= 2;
                continue;
            }
            // The open tail's passages are indexed (provisionally) at the log's end only.
            let mut spans: Vec<&passages::Span> = cut.closed.iter().collect();
            if at_end {
                spans.extend(cut.open.iter());
            }
            let texts: Vec<&str> = spans.iter().map(|s| &text[s.start..s.end]).collect();
            let vectors = match &self.embedder {
                Some(e) if !texts.is_empty() => {
                    let (v, stats) = e.embed_with_stats(&texts)?;
                    report.embed.texts += stats.texts;
                    report.embed.tokens += stats.tokens;
                    report.embed.flops += stats.flops;
                    report.embed.seconds += stats.seconds;
                    v.into_iter().map(Some).collect()
                }
                _ => vec![None; texts.len()],
            };
            let writer = self.writer.lock().expect("recall writer");
            // The open tail indexed last time starts at `from`: it is cut again here.
            writer
                .delete_query(self.tail_query(log.id, from))
                .map_err(|e| self.err(e))?;
            let mut added = 0usize;
            for ((span, piece), vector) in spans.iter().zip(&texts).zip(vectors) {
                let start = from + span.start as u64;
                let origin = (log.origin)(start);
                let mut doc = TantivyDocument::default();
                doc.add_u64(self.f.stream_id, log.id);
                doc.add_text(self.f.stream, log.name);
                doc.add_u64(self.f.start, start);
                doc.add_u64(self.f.end, from + span.end as u64);
                doc.add_text(self.f.text, piece);
                if let Some(s) = &origin.source {
                    doc.add_text(self.f.source, s);
                }
                if let Some(l) = origin.line {
                    doc.add_u64(self.f.line, l);
                }
                if let Some(t) = passages::turn_time(piece) {
                    doc.add_text(self.f.time, t);
                }
                if let Some(v) = vector {
                    doc.add_bytes(self.f.vector, &quantize(&v));
                }
                writer.add_document(doc).map_err(|e| self.err(e))?;
                added += 1;
            }
            let tail = from + cut.tail as u64;
            let next = StreamState {
                tail,
                // Past the window's last closed passage the text is read again next time.
                len: if at_end { log.len } else { tail },
            };
            drop(writer);
            self.commit(|state| {
                state.streams.insert(log.id, next);
            })?;
            report.bytes += next.len - current.len.min(next.len);
            report.passages += added;
            current = next;
            window = WINDOW;
            on_progress(current.len);
            if at_end {
                break;
            }
        }
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Removes the passages of one stream (`Some(id)`) or of all, so that the next sync
    /// reads from the log's start.
    pub fn reset(&self, stream: Option<u64>) -> Result<()> {
        {
            let writer = self.writer.lock().expect("recall writer");
            match stream {
                Some(id) => {
                    writer.delete_term(Term::from_field_u64(self.f.stream_id, id));
                }
                None => {
                    writer.delete_all_documents().map_err(|e| self.err(e))?;
                }
            }
        }
        self.commit(|state| match stream {
            Some(id) => {
                state.streams.remove(&id);
            }
            None => state.streams.clear(),
        })
    }

    /// Commits the writer's pending changes with the state `change` makes, then lets
    /// searches see them.
    fn commit(&self, change: impl FnOnce(&mut State)) -> Result<()> {
        let mut state = self.state.lock().expect("recall state");
        let mut next = state.clone();
        change(&mut next);
        let payload = serde_json::to_string(&next).expect("state serialises");
        let mut writer = self.writer.lock().expect("recall writer");
        let mut prepared = writer.prepare_commit().map_err(|e| self.err(e))?;
        prepared.set_payload(&payload);
        prepared.commit().map_err(|e| self.err(e))?;
        *state = next;
        self.compact(&mut writer)?;
        drop(writer);
        self.reader.reload().map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Merges away deleted passages (an open tail cut again, a removed stream) and keeps
    /// the number of segments small. BM25's statistics count deleted documents until
    /// their segment is merged, so without this an index grown piece by piece would
    /// rank differently from a rebuild of the same text. The merged segments replace
    /// the old ones in one atomic step that keeps the commit's payload.
    fn compact(&self, writer: &mut IndexWriter) -> Result<()> {
        let metas = self
            .index
            .searchable_segment_metas()
            .map_err(|e| self.err(e))?;
        let small: Vec<_> = metas
            .iter()
            .filter(|m| m.max_doc() < SMALL_SEGMENT)
            .collect();
        let mut ids: Vec<SegmentId> = metas
            .iter()
            .filter(|m| m.num_deleted_docs() > 0)
            .map(|m| m.id())
            .collect();
        if small.len() > MAX_SMALL_SEGMENTS {
            for m in small {
                if !ids.contains(&m.id()) {
                    ids.push(m.id());
                }
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        writer.merge(&ids).wait().map_err(|e| self.err(e))?;
        // Files of the merged segments are no longer needed.
        let _ = writer.garbage_collect_files().wait();
        Ok(())
    }

    /// Passages stored for a stream (or all), counting only live ones.
    pub fn count(&self, stream: Option<u64>) -> Result<u64> {
        let searcher = self.reader.searcher();
        match stream {
            None => Ok(searcher.num_docs()),
            Some(id) => {
                let q = TermQuery::new(
                    Term::from_field_u64(self.f.stream_id, id),
                    IndexRecordOption::Basic,
                );
                Ok(searcher
                    .search(&q, &tantivy::collector::Count)
                    .map_err(|e| self.err(e))? as u64)
            }
        }
    }

    /// Bytes the index takes on disk.
    pub fn size_on_disk(&self) -> u64 {
        std::fs::read_dir(&self.path)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }

    /// The best `k` passages for `request.text`: BM25 and (with an embedder) vector
    /// rankings of up to 50 candidates each, fused by reciprocal rank.
    pub fn search(&self, request: &SearchRequest<'_>) -> Result<Vec<Hit>> {
        let searcher = self.reader.searcher();
        let stream_filter = |id: u64| request.streams.is_none_or(|s| s.contains(&id));
        // Candidates by position (stream, start): equal scores rank the earlier passage
        // first, so results do not depend on how segments happen to be laid out.
        let mut fused: HashMap<(u64, u64), Fused> = HashMap::new();
        // By words.
        if let Some(query) = self.word_query(request) {
            let top = searcher
                .search(&*query, &TopDocs::with_limit(CANDIDATES).order_by_score())
                .map_err(|e| self.err(e))?;
            let mut scored = Vec::with_capacity(top.len());
            for (score, address) in top {
                scored.push((score, self.position(&searcher, address)?, address));
            }
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for (rank, (_, position, address)) in scored.into_iter().enumerate() {
                let e = fused.entry(position).or_insert_with(|| Fused::new(address));
                e.score += 1.0 / (RRF_K + rank as f64 + 1.0);
                e.bm25_rank = Some(rank + 1);
            }
        }
        // By meaning.
        if let Some(embedder) = &self.embedder {
            let query = embedder.embed(&[request.text])?.remove(0);
            let mut scored: Vec<(f32, (u64, u64), DocAddress)> = Vec::new();
            let mut cache = self.vectors.lock().expect("recall vectors");
            let live: Vec<SegmentId> = searcher
                .segment_readers()
                .iter()
                .map(|s| s.segment_id())
                .collect();
            cache.retain(|id, _| live.contains(id));
            for (ord, segment) in searcher.segment_readers().iter().enumerate() {
                let vectors = match cache.get(&segment.segment_id()) {
                    Some(v) => v.clone(),
                    None => {
                        let v = Arc::new(self.load_vectors(segment)?);
                        cache.insert(segment.segment_id(), v.clone());
                        v
                    }
                };
                let alive = segment.alive_bitset();
                for (i, &(doc, stream, start, scale)) in vectors.docs.iter().enumerate() {
                    if !stream_filter(stream) || alive.is_some_and(|a| a.is_deleted(doc)) {
                        continue;
                    }
                    let q = &vectors.values[i * vectors.dims..(i + 1) * vectors.dims];
                    let s = dot_i8(q, &query);
                    scored.push((s * scale, (stream, start), DocAddress::new(ord as u32, doc)));
                }
            }
            // Only the best candidates are ranked: select them, then sort those.
            let order = |a: &(f32, (u64, u64), DocAddress), b: &(f32, (u64, u64), DocAddress)| {
                b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
            };
            if scored.len() > CANDIDATES {
                scored.select_nth_unstable_by(CANDIDATES - 1, order);
                scored.truncate(CANDIDATES);
            }
            scored.sort_by(order);
            for (rank, (similarity, position, address)) in
                scored.into_iter().take(CANDIDATES).enumerate()
            {
                let e = fused.entry(position).or_insert_with(|| Fused::new(address));
                e.score += 1.0 / (RRF_K + rank as f64 + 1.0);
                e.vector_rank = Some(rank + 1);
                e.similarity = Some(similarity);
            }
        }
        let mut ranked: Vec<_> = fused.into_iter().collect();
        // Equal fused scores go to the better word rank, then to the earlier passage.
        ranked.sort_by(|a, b| {
            b.1.score
                .total_cmp(&a.1.score)
                .then(
                    a.1.bm25_rank
                        .unwrap_or(usize::MAX)
                        .cmp(&b.1.bm25_rank.unwrap_or(usize::MAX)),
                )
                .then(a.0.cmp(&b.0))
        });
        let mut hits = Vec::new();
        for (_, found) in ranked.into_iter().take(request.k) {
            let Fused {
                address,
                score,
                bm25_rank,
                vector_rank,
                similarity,
            } = found;
            let doc: TantivyDocument = searcher.doc(address).map_err(|e| self.err(e))?;
            let text_of = |f: Field| doc.get_first(f).and_then(|v| v.as_str()).map(String::from);
            let u64_of = |f: Field| doc.get_first(f).and_then(|v| v.as_u64());
            hits.push(Hit {
                stream: text_of(self.f.stream).unwrap_or_default(),
                stream_id: u64_of(self.f.stream_id).unwrap_or_default(),
                start: u64_of(self.f.start).unwrap_or_default(),
                end: u64_of(self.f.end).unwrap_or_default(),
                text: text_of(self.f.text).unwrap_or_default(),
                source: text_of(self.f.source),
                line: u64_of(self.f.line),
                time: text_of(self.f.time),
                score,
                bm25_rank,
                vector_rank,
                similarity,
            });
        }
        Ok(hits)
    }

    /// Where a document's passage lies: its stream and start.
    fn position(&self, searcher: &tantivy::Searcher, address: DocAddress) -> Result<(u64, u64)> {
        let fast = searcher.segment_reader(address.segment_ord).fast_fields();
        let column = |name: &str| -> Result<u64> {
            let col = fast.u64(name).map_err(|e| self.err(e))?;
            Ok(col.first(address.doc_id).unwrap_or_default())
        };
        Ok((column("stream_id")?, column("start")?))
    }

    /// The passages of `stream` that start at `from` or later.
    fn tail_query(&self, stream: u64, from: u64) -> Box<dyn Query> {
        let stream: Box<dyn Query> = Box::new(TermQuery::new(
            Term::from_field_u64(self.f.stream_id, stream),
            IndexRecordOption::Basic,
        ));
        let after: Box<dyn Query> = Box::new(RangeQuery::new(
            Bound::Included(Term::from_field_u64(self.f.start, from)),
            Bound::Unbounded,
        ));
        Box::new(BooleanQuery::new(vec![
            (Occur::Must, stream),
            (Occur::Must, after),
        ]))
    }

    /// Every word of the query as a term (any may match, BM25 ranks), restricted to the
    /// requested streams; `None` when the text has no word.
    fn word_query(&self, request: &SearchRequest<'_>) -> Option<Box<dyn Query>> {
        let mut analyzer = self.index.tokenizers().get("en_stem")?;
        let mut terms = Vec::new();
        let mut stream = analyzer.token_stream(request.text);
        while let Some(token) = stream.next() {
            let term = Term::from_field_text(self.f.text, &token.text);
            if !terms.contains(&term) {
                terms.push(term);
            }
        }
        if terms.is_empty() {
            return None;
        }
        let words: Vec<(Occur, Box<dyn Query>)> = terms
            .into_iter()
            .map(|t| {
                let q: Box<dyn Query> = Box::new(TermQuery::new(t, IndexRecordOption::WithFreqs));
                (Occur::Should, q)
            })
            .collect();
        let mut clauses: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, Box::new(BooleanQuery::new(words)))];
        if let Some(ids) = request.streams {
            let any: Vec<(Occur, Box<dyn Query>)> = ids
                .iter()
                .map(|&id| {
                    let q: Box<dyn Query> = Box::new(TermQuery::new(
                        Term::from_field_u64(self.f.stream_id, id),
                        IndexRecordOption::Basic,
                    ));
                    (Occur::Should, q)
                })
                .collect();
            clauses.push((Occur::Must, Box::new(BooleanQuery::new(any))));
        }
        Some(Box::new(BooleanQuery::new(clauses)))
    }

    /// The vectors of one segment's passages, read from its stored documents once.
    fn load_vectors(&self, segment: &tantivy::SegmentReader) -> Result<SegmentVectors> {
        let store = segment
            .get_store_reader(64)
            .map_err(|e| self.err(e.into()))?;
        let mut out = SegmentVectors {
            docs: Vec::new(),
            values: Vec::new(),
            dims: self.embedder.as_ref().map_or(0, |e| e.dimensions()),
        };
        for doc in 0..segment.max_doc() {
            let d: TantivyDocument = store.get(doc).map_err(|e| self.err(e))?;
            let Some(bytes) = d.get_first(self.f.vector).and_then(|v| v.as_bytes()) else {
                continue;
            };
            let Some(stream) = d.get_first(self.f.stream_id).and_then(|v| v.as_u64()) else {
                continue;
            };
            if bytes.len() != 4 + out.dims {
                continue;
            }
            let start = d
                .get_first(self.f.start)
                .and_then(|v| v.as_u64())
                .unwrap_or_default();
            let scale = f32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
            out.docs.push((doc, stream, start, scale));
            out.values.extend(bytes[4..].iter().map(|&b| b as i8));
        }
        Ok(out)
    }
}

/// `q · v` for a stored int8 vector and the query's f32 one, summed in 16 lanes so the
/// compiler vectorises it (a single running sum must add in order, one at a time).
fn dot_i8(q: &[i8], v: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (qc, vc) = (q.chunks_exact(LANES), v.chunks_exact(LANES));
    let tail: f32 = qc
        .remainder()
        .iter()
        .zip(vc.remainder())
        .map(|(&a, &b)| a as f32 * b)
        .sum();
    for (qs, vs) in qc.zip(vc) {
        for l in 0..LANES {
            acc[l] += qs[l] as f32 * vs[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// A unit vector as int8 with its scale (little-endian f32 first).
fn quantize(v: &[f32]) -> Vec<u8> {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    let scale = max / 127.0;
    let mut out = Vec::with_capacity(4 + v.len());
    out.extend_from_slice(&scale.to_le_bytes());
    out.extend(
        v.iter()
            .map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8 as u8),
    );
    out
}

/// The log's bytes as text with the same byte offsets: a character cut at the window's
/// end (not the log's) is left for the next window, and invalid bytes become spaces
/// (logged with the stream and offset).
fn readable(bytes: &[u8], at_end: bool, stream: &str, from: u64) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    let mut at = 0usize;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.extend_from_slice(s.as_bytes());
                break;
            }
            Err(e) => {
                let good = e.valid_up_to();
                out.extend_from_slice(&rest[..good]);
                match e.error_len() {
                    None if !at_end => break,
                    len => {
                        let bad = len.unwrap_or(rest.len() - good);
                        tracing::warn!(
                            "search index: stream `{stream}` has {bad} invalid UTF-8 byte(s) \
                             at log offset {}; indexed as spaces",
                            from + (at + good) as u64
                        );
                        out.extend(std::iter::repeat_n(b' ', bad));
                        rest = &rest[good + bad..];
                        at += good + bad;
                    }
                }
            }
        }
    }
    String::from_utf8(out).expect("valid UTF-8 by construction")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lane_dot_product_equals_the_plain_one() {
        let mut seed = 7u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        };
        for n in [0, 1, 15, 16, 17, 384, 390] {
            let q: Vec<i8> = (0..n).map(|_| (next() * 127.0) as i8).collect();
            let v: Vec<f32> = (0..n).map(|_| next()).collect();
            let plain: f32 = q.iter().zip(&v).map(|(&a, &b)| a as f32 * b).sum();
            let lanes = super::dot_i8(&q, &v);
            assert!(
                (plain - lanes).abs() <= 1e-3 * (1.0 + plain.abs()),
                "{n}: {plain} {lanes}"
            );
        }
    }
}

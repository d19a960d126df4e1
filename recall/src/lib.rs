//! Recall: every passage a stream ever stored, searchable by words and by meaning.
//!
//! Text is cut into passages (a few chat turns; a paragraph window of a document; see
//! [`passages`]) with their provenance, indexed by words with BM25 (tantivy) and by
//! meaning with sentence embeddings (all-MiniLM-L6-v2 through candle), and searched with
//! the two rankings fused by their scaled scores, the best candidates then ranked again
//! by late interaction (each of the question's telling tokens against the passage's
//! token states, kept at 4 bits from the same embedding pass). The index is derived
//! data and must never become a source of truth: it knows nothing of the database,
//! reads a stream only through the [`LogSource`] it is given, and records how far it has
//! read each stream in the same tantivy commit as the passages (the commit's payload),
//! so after a crash it catches up from there, and [`Recall::reset`] plus a sync
//! rebuilds it from scratch.
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
pub mod dates;
mod embed;
mod error;
mod layout;
pub mod passages;
mod search;
mod sync;

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

pub use embed::{
    dot, is_telling, EmbedStats, Embedded, Embedder, FILES as EMBEDDER_FILES, MAX_TOKENS,
    TOKEN_DIMENSIONS,
};
pub use error::{Error, Result};
use layout::{dot_i8, late_similarity, quantize, quantize_tokens, schema, Fields, SegmentVectors};
pub use search::{Hit, SearchRequest};
pub use sync::{LogSource, Origin, SyncReport};

/// Candidates each ranking contributes to the fusion.
const CANDIDATES: usize = 50;
/// The words' share of a passage's fused score, the meaning's the rest. Each ranking's
/// scores are first scaled to 0–1 over its candidates (BM25 over the best score, the
/// similarity between the least and the most similar), so a passage found by one
/// ranking alone keeps what that ranking saw: a rare word matched (the only passage
/// saying "aquarium") is not outranked by passages merely ranked fair by both, as
/// reciprocal-rank fusion does. Chosen on LoCoMo's development conversations: an
/// evidence passage within 5 for 74% of the questions against 69% by reciprocal rank,
/// 69% by words alone (docs/benchmarks/conversations/).
pub const WORDS_WEIGHT: f64 = 0.6;
/// The fused candidates ranked again by late interaction: the question's telling tokens
/// against each passage's ([`Hit::token_similarity`]).
pub const LATE_CANDIDATES: usize = 20;
/// The weight of the late interaction's similarity, scaled 0–1 over the
/// [`LATE_CANDIDATES`], added to their fused score. Chosen on every 4th question of
/// LoCoMo's development conversations: every evidence turn of a question within the
/// first 10 passages for more questions (docs/benchmarks/conversations/).
pub const LATE_WEIGHT: f64 = 1.5;
/// Bytes of the log read and committed at a time.
const WINDOW: u64 = 256 * 1024;
/// How far back before a window a passage cut inside a chat turn looks for the line that
/// started the turn (whose time dates it).
const TURN_LOOKBACK: u64 = 16 * 1024;
/// Segments under this many passages are merged together once there are more than
/// [`MAX_SMALL_SEGMENTS`] of them.
const SMALL_SEGMENT: u32 = 20_000;
const MAX_SMALL_SEGMENTS: usize = 8;
/// Format of the commit payload and of the passages it counts (how text is cut into
/// them, what is stored of each): an index of another format is made again from the
/// logs. 3: passages keep their telling tokens' states; 4: projected to
/// [`TOKEN_DIMENSIONS`]; 5: sentence vectors in a column, not stored with the text.
const STATE_FORMAT: u32 = 5;

/// How far the index has read one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// Log offset where the open (last, still growing) passage starts; every passage
    /// before it is final.
    pub tail: u64,
    /// Bytes of the log indexed.
    pub len: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    format: u32,
    /// Whether passages keep their telling tokens' states (late interaction); an
    /// embedder of the other kind makes the index again.
    #[serde(default = "yes")]
    token_states: bool,
    streams: BTreeMap<u64, StreamState>,
}

fn yes() -> bool {
    true
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

impl Recall {
    /// Opens (or creates) the index in `dir`; with an embedder, passages are also
    /// indexed and searched by meaning.
    ///
    /// An index of another layout (written by another version of memagent), with an
    /// unreadable state, or made with token states when the embedder now gives none (or
    /// the reverse, [`Embedder::without_token_states`]) is derived data: it is removed
    /// and made again, empty, for the caller's catch-up to fill from the logs.
    pub fn open(dir: &Path, embedder: Option<Arc<Embedder>>) -> Result<Self> {
        match Self::open_as_is(dir, embedder.clone()) {
            Err(e @ (Error::State { .. } | Error::Stale { .. }))
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
        let token_states = embedder.as_ref().map(|e| e.keeps_token_states());
        let state = match metas.payload.as_deref() {
            None => State {
                format: STATE_FORMAT,
                token_states: token_states.unwrap_or(true),
                streams: BTreeMap::new(),
            },
            Some(p) => serde_json::from_str::<State>(p)
                .ok()
                .filter(|s| s.format == STATE_FORMAT)
                .ok_or_else(|| Error::State {
                    path: dir.to_path_buf(),
                    reason: format!("commit payload {p:?}"),
                })?,
        };
        if token_states.is_some_and(|keeps| keeps != state.token_states) {
            return Err(Error::Stale {
                path: dir.to_path_buf(),
                reason: match state.token_states {
                    true => "with token states, and the embedder now gives none".into(),
                    false => "without token states, and the embedder now gives them".into(),
                },
            });
        }
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

//! Search: passages ranked by words (BM25) and by meaning (the question's embedding
//! against each passage's vector), the two fused by their scores: each ranking's scores
//! scaled to 0–1 over its candidates, then weighted ([`WORDS_WEIGHT`]); the best
//! [`LATE_CANDIDATES`] ranked again by late interaction, the question's telling tokens
//! against each passage's ([`LATE_WEIGHT`]).

use super::*;

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
    /// The text with each chat turn's relative dates resolved ("yesterday [7 May
    /// 2023]", see [`dates`](crate::dates)), when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dated: Option<String>,
    pub source: Option<String>,
    pub line: Option<u64>,
    /// The time of the chat turn the passage starts in (its first turn, or the turn it
    /// continues when cut inside one), when it has one.
    pub time: Option<String>,
    /// Fused score: the BM25 score over the best one's, and the similarity scaled
    /// between the least and most similar candidates, weighted ([`WORDS_WEIGHT`]; 0–1
    /// together), then the late interaction's similarity scaled over the best
    /// candidates and weighted ([`LATE_WEIGHT`]); a ranking that did not find it adds 0.
    pub score: f64,
    /// 1-based rank by words (BM25) and by meaning, where each found it.
    pub bm25_rank: Option<usize>,
    pub vector_rank: Option<usize>,
    /// Cosine similarity to the query, when ranked by meaning.
    pub similarity: Option<f32>,
    /// Late interaction, when ranked again by it: for each of the question's telling
    /// tokens, the cosine similarity of the passage's token most like it, averaged
    /// (ColBERT's MaxSim over the embedder's token states).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_similarity: Option<f32>,
}

impl Hit {
    /// The text as it is shown to a reader: with its relative dates resolved.
    pub fn shown(&self) -> &str {
        self.dated.as_deref().unwrap_or(&self.text)
    }
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

impl Recall {
    /// The best `k` passages for `request.text`: BM25 and (with an embedder) vector
    /// rankings of up to 50 candidates each, fused by their scaled scores; with an
    /// embedder, the best [`LATE_CANDIDATES`] then ranked again by late interaction.
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
            let top = scored.first().map_or(1.0, |s| s.0.max(f32::MIN_POSITIVE));
            for (rank, (score, position, address)) in scored.into_iter().enumerate() {
                let e = fused.entry(position).or_insert_with(|| Fused::new(address));
                e.score += WORDS_WEIGHT * f64::from(score / top);
                e.bm25_rank = Some(rank + 1);
            }
        }
        // By meaning.
        let mut question_tokens = Vec::new();
        if let Some(embedder) = &self.embedder {
            let (mut embedded, _) = embedder.embed_tokens_with_stats(&[request.text])?;
            let Embedded {
                vector: query,
                tokens,
            } = embedded.remove(0);
            question_tokens = tokens;
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
            let hi = scored.first().map_or(1.0, |s| s.0);
            let lo = scored.last().map_or(0.0, |s| s.0);
            for (rank, (similarity, position, address)) in
                scored.into_iter().take(CANDIDATES).enumerate()
            {
                let e = fused.entry(position).or_insert_with(|| Fused::new(address));
                e.score +=
                    (1.0 - WORDS_WEIGHT) * f64::from((similarity - lo) / (hi - lo).max(1e-6));
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
        // With an embedder, the best candidates are ranked again by late interaction:
        // their documents are read anyway when they are among the `k`.
        let late = if self.embedder.is_some() {
            LATE_CANDIDATES
        } else {
            0
        };
        let read = request.k.max(late).min(ranked.len());
        let mut hits = Vec::with_capacity(read);
        for (_, found) in ranked.into_iter().take(read) {
            let Fused {
                address,
                score,
                bm25_rank,
                vector_rank,
                similarity,
            } = found;
            let doc: TantivyDocument = searcher.doc(address).map_err(|e| self.err(e))?;
            let token_similarity = match (&self.embedder, hits.len() < late) {
                (Some(embedder), true) => doc
                    .get_first(self.f.tokens)
                    .and_then(|v| v.as_bytes())
                    .and_then(|b| {
                        late_similarity(b, embedder.token_dimensions(), &question_tokens)
                    }),
                _ => None,
            };
            hits.push(Hit {
                score,
                bm25_rank,
                vector_rank,
                similarity,
                token_similarity,
                ..self.hit(&doc)
            });
        }
        late_rank(&mut hits[..read.min(late)]);
        hits.truncate(request.k);
        Ok(hits)
    }

    /// Every passage stored for a stream, by start: what a rebuild must reproduce (the
    /// scores are left empty).
    pub fn passages(&self, stream: u64) -> Result<Vec<Hit>> {
        let mut hits = self.latest_passages(stream, usize::MAX)?;
        hits.sort_by_key(|h| (h.start, h.end));
        Ok(hits)
    }

    /// A stream's `n` passages that start last, oldest first (the scores left empty):
    /// only those are read from the index.
    pub fn latest_passages(&self, stream: u64, n: usize) -> Result<Vec<Hit>> {
        let searcher = self.reader.searcher();
        let q = TermQuery::new(
            Term::from_field_u64(self.f.stream_id, stream),
            IndexRecordOption::Basic,
        );
        let addresses = searcher
            .search(&q, &tantivy::collector::DocSetCollector)
            .map_err(|e| self.err(e))?;
        let mut placed = addresses
            .into_iter()
            .map(|a| Ok((self.position(&searcher, a)?.1, a)))
            .collect::<Result<Vec<(u64, DocAddress)>>>()?;
        placed.sort_by_key(|&(start, a)| std::cmp::Reverse((start, a)));
        placed.truncate(n);
        let mut hits = Vec::with_capacity(placed.len());
        for (_, address) in placed.into_iter().rev() {
            let doc: TantivyDocument = searcher.doc(address).map_err(|e| self.err(e))?;
            hits.push(self.hit(&doc));
        }
        Ok(hits)
    }

    /// A stored passage as a hit without scores.
    fn hit(&self, doc: &TantivyDocument) -> Hit {
        let text_of = |f: Field| doc.get_first(f).and_then(|v| v.as_str()).map(String::from);
        let u64_of = |f: Field| doc.get_first(f).and_then(|v| v.as_u64());
        let text = text_of(self.f.text).unwrap_or_default();
        let time = text_of(self.f.time);
        Hit {
            stream: text_of(self.f.stream).unwrap_or_default(),
            stream_id: u64_of(self.f.stream_id).unwrap_or_default(),
            start: u64_of(self.f.start).unwrap_or_default(),
            end: u64_of(self.f.end).unwrap_or_default(),
            dated: crate::dates::dated(&text, time.as_deref().and_then(crate::dates::parse_time)),
            text,
            source: text_of(self.f.source),
            line: u64_of(self.f.line),
            time,
            score: 0.0,
            bm25_rank: None,
            vector_rank: None,
            similarity: None,
            token_similarity: None,
        }
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

    /// The vectors of one segment's passages, read once from its columns (the vector,
    /// stream and start fast fields), not from its stored documents, which hold each
    /// passage's text and token states too.
    fn load_vectors(&self, segment: &tantivy::SegmentReader) -> Result<SegmentVectors> {
        let dims = self.embedder.as_ref().map_or(0, |e| e.dimensions());
        let mut out = SegmentVectors {
            docs: Vec::new(),
            values: Vec::new(),
            dims,
        };
        let fast = segment.fast_fields();
        let column = |name: &str| fast.u64(name).map_err(|e| self.err(e));
        let (streams, starts) = (column("stream_id")?, column("start")?);
        let Some(vectors) = fast.bytes("vector").map_err(|e| self.err(e))? else {
            return Ok(out);
        };
        // The column keeps each distinct vector once, sorted: read them in that order,
        // then each passage's by its number among them.
        let mut distinct: Vec<Vec<u8>> = Vec::with_capacity(vectors.num_terms());
        let mut stream = vectors
            .dictionary()
            .stream()
            .map_err(|e| self.err(e.into()))?;
        while stream.advance() {
            distinct.push(stream.key().to_vec());
        }
        for doc in 0..segment.max_doc() {
            let Some(bytes) = vectors
                .term_ords(doc)
                .next()
                .and_then(|ord| distinct.get(ord as usize))
            else {
                continue;
            };
            let (Some(stream), Some(start)) = (streams.first(doc), starts.first(doc)) else {
                continue;
            };
            if bytes.len() != 4 + dims {
                continue;
            }
            let scale = f32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
            out.docs.push((doc, stream, start, scale));
            out.values.extend(bytes[4..].iter().map(|&b| b as i8));
        }
        Ok(out)
    }
}

/// `hits` sorted again by their fused score plus [`LATE_WEIGHT`] times their late
/// interaction's similarity scaled 0–1 over them (a passage without one adds 0), which
/// joins the fused score. Equal sums keep the order they had.
fn late_rank(hits: &mut [Hit]) {
    let known = || hits.iter().filter_map(|h| h.token_similarity);
    let (Some(high), Some(low)) = (known().reduce(f32::max), known().reduce(f32::min)) else {
        return;
    };
    let span = f64::from(high - low).max(1e-6);
    for h in hits.iter_mut() {
        if let Some(t) = h.token_similarity {
            h.score += LATE_WEIGHT * f64::from(t - low) / span;
        }
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
}

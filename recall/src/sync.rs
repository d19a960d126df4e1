//! Catching the index up with a stream's log: passages cut from the bytes past what was
//! read, committed with how far the index has read (the commit's payload), small
//! segments merged; and a stream's passages dropped for a rebuild.

use super::*;

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

/// What one sync did.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncReport {
    pub bytes: u64,
    pub passages: usize,
    pub embed: EmbedStats,
    pub seconds: f64,
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

/// The time of the chat turn open at byte `at` of the log, from the line that started it
/// within [`TURN_LOOKBACK`] bytes before.
fn turn_before(log: &LogSource<'_>, at: u64) -> Result<Option<String>> {
    let back = at.saturating_sub(TURN_LOOKBACK);
    let before = (log.read)(back, at).map_err(|reason| Error::Read {
        stream: log.name.to_string(),
        offset: back,
        reason,
    })?;
    let before = String::from_utf8_lossy(&before);
    Ok(passages::open_turn(&before)
        .and_then(passages::turn_time)
        .map(String::from))
}

impl Recall {
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
                    let (v, stats) = e.embed_tokens_with_stats(&texts)?;
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
            // The time of the turn open where each passage starts (one cut inside a turn
            // is dated by it); before the window's first turn, read from the log only
            // when a passage needs it.
            let mut open_turn: Option<Option<String>> = (from == 0).then_some(None);
            let mut scanned = 0;
            for ((span, piece), vector) in spans.iter().zip(&texts).zip(vectors) {
                if let Some(found) = passages::open_turn(&text[scanned..span.start]) {
                    open_turn = Some(passages::turn_time(found).map(String::from));
                }
                scanned = span.start;
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
                let time = match passages::is_turn(piece.trim_start()) {
                    true => passages::turn_time(piece),
                    false => match &open_turn {
                        Some(t) => t.as_deref(),
                        None => open_turn.insert(turn_before(log, from)?).as_deref(),
                    },
                };
                if let Some(t) = time {
                    doc.add_text(self.f.time, t);
                }
                if let Some(v) = vector {
                    doc.add_bytes(self.f.vector, &quantize(&v.vector));
                    if !v.tokens.is_empty() {
                        doc.add_bytes(self.f.tokens, &quantize_tokens(&v.tokens));
                    }
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
}

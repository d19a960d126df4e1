//! Export and import of a stream as JSON Lines (format in `docs/storage.md`): one
//! record per line, the stream first, then its log, where each piece of it came from,
//! sources, chunks, memory versions, cursors, standing questions and their answers:
//! everything the stream has.

use serde::{Deserialize, Serialize};

use crate::codec::{decode, encode, key1, key2, key3, key_parts};
use crate::records::{
    ChunkRecord, Cursor, MemoryVersion, QuestionRecord, SegmentRecord, SourceRecord, StandingAnswer,
};
use crate::{Error, Result, Store, StreamRecord};

/// Version of the export format, in the first line. Format 2 added the provenance of
/// log pieces (`segment`), standing questions and their answers; format 1 still imports.
pub const EXPORT_FORMAT: u32 = 2;

/// One line of an export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExportRecord {
    Stream {
        format: u32,
        name: String,
        created: u64,
    },
    /// A segment of the content log at `offset`.
    Log {
        offset: u64,
        text: String,
    },
    Source(SourceRecord),
    Chunk(ChunkRecord),
    Version {
        chain: u64,
        #[serde(flatten)]
        version: MemoryVersion,
    },
    Cursor {
        chain: u64,
        #[serde(flatten)]
        cursor: Cursor,
    },
    /// Where the log piece at `offset` came from (a file's lines, a chat log's turns).
    Segment {
        offset: u64,
        #[serde(flatten)]
        segment: SegmentRecord,
    },
    /// A standing question and the memory chain that reads for it.
    Question(QuestionRecord),
    /// A standing question's answer from one memory version.
    Answer(StandingAnswer),
}

impl Store {
    /// Every record of a stream, in export order.
    pub fn export(&self, name: &str) -> Result<Vec<ExportRecord>> {
        let stream = self.require(name)?;
        let prefix = key1(stream.id);
        let mut out = vec![ExportRecord::Stream {
            format: EXPORT_FORMAT,
            name: stream.name.clone(),
            created: stream.created,
        }];
        let mut offset = 0;
        while offset < stream.log_len {
            // A piece's worth and the rest of a character it may end inside.
            let end = (offset + crate::LOG_PIECE as u64 + 3).min(stream.log_len);
            let bytes = self.read_log(&stream, offset, end)?;
            let piece = crate::log_pieces(&bytes)
                .next()
                .map_or(&bytes[..], |(_, p)| p);
            let text = String::from_utf8(piece.to_vec()).map_err(|e| Error::Corrupt {
                tree: "log",
                key: format!("{}/{offset}", stream.id),
                reason: format!("not UTF-8: {e}"),
            })?;
            let len = text.len() as u64;
            out.push(ExportRecord::Log { offset, text });
            offset += len;
        }
        for item in self.sources.scan_prefix(prefix) {
            let (k, v) = item?;
            out.push(ExportRecord::Source(decode("sources", &k, &v)?));
        }
        for chunk in self.chunks(&stream)? {
            out.push(ExportRecord::Chunk(chunk));
        }
        for item in self.versions.scan_prefix(prefix) {
            let (k, v) = item?;
            let [_, chain, _] = key_parts("versions", &k)?;
            out.push(ExportRecord::Version {
                chain,
                version: decode("versions", &k, &v)?,
            });
        }
        for item in self.cursors.scan_prefix(prefix) {
            let (k, v) = item?;
            out.push(ExportRecord::Cursor {
                chain: key_parts::<2>("cursors", &k)?[1],
                cursor: decode("cursors", &k, &v)?,
            });
        }
        for item in self.segments.scan_prefix(prefix) {
            let (k, v) = item?;
            out.push(ExportRecord::Segment {
                offset: key_parts::<2>("segments", &k)?[1],
                segment: decode("segments", &k, &v)?,
            });
        }
        for question in self.questions(&stream)? {
            out.push(ExportRecord::Question(question));
        }
        for answer in self.answers(&stream)? {
            out.push(ExportRecord::Answer(answer));
        }
        Ok(out)
    }

    /// Recreates a stream from its export, under `rename` if given. The stream must not
    /// exist; a failed import leaves nothing behind.
    pub fn import(&self, records: &[ExportRecord], rename: Option<&str>) -> Result<StreamRecord> {
        let Some(ExportRecord::Stream {
            format,
            name,
            created,
        }) = records.first()
        else {
            return Err(Error::Import(
                "the first line must be the stream record (\"type\": \"stream\")".to_string(),
            ));
        };
        if !(1..=EXPORT_FORMAT).contains(format) {
            return Err(Error::Import(format!(
                "export format {format} is not supported (this memctl reads {EXPORT_FORMAT})"
            )));
        }
        let name = rename.unwrap_or(name);
        if self.stream(name)?.is_some() {
            return Err(Error::Import(format!(
                "stream `{name}` already exists; remove it first or import under another name"
            )));
        }
        let stream = self.create_stream(name)?;
        let result = self.import_into(&stream, *created, &records[1..]);
        if result.is_err() {
            let _ = self.remove_stream(name);
        }
        result
    }

    fn import_into(
        &self,
        stream: &StreamRecord,
        created: u64,
        records: &[ExportRecord],
    ) -> Result<StreamRecord> {
        let _turn = self.logs.appending();
        let mut log_len = 0u64;
        for (line, record) in records.iter().enumerate() {
            let line = line + 2;
            match record {
                ExportRecord::Stream { .. } => {
                    return Err(Error::Import(format!(
                        "line {line}: a second stream record"
                    )))
                }
                ExportRecord::Log { offset, text } => {
                    if *offset != log_len {
                        return Err(Error::Import(format!(
                            "line {line}: log segment at {offset}, expected {log_len}"
                        )));
                    }
                    self.logs.write(stream.id, *offset, text.as_bytes())?;
                    log_len += text.len() as u64;
                }
                ExportRecord::Source(source) => {
                    self.sources
                        .insert(crate::source_key(stream.id, &source.name), encode(source))?;
                }
                ExportRecord::Chunk(chunk) => {
                    self.chunks
                        .insert(key2(stream.id, chunk.index), encode(chunk))?;
                }
                ExportRecord::Version { chain, version } => {
                    self.versions
                        .insert(key3(stream.id, *chain, version.version), encode(version))?;
                }
                ExportRecord::Cursor { chain, cursor } => {
                    self.cursors
                        .insert(key2(stream.id, *chain), encode(cursor))?;
                }
                ExportRecord::Segment { offset, segment } => {
                    self.segments
                        .insert(key2(stream.id, *offset), encode(segment))?;
                }
                ExportRecord::Question(question) => {
                    self.questions.insert(
                        crate::source_key(stream.id, &question.question),
                        encode(question),
                    )?;
                }
                ExportRecord::Answer(answer) => {
                    // After its question, whose chain keys it.
                    let Some(question) = records[..line - 2].iter().find_map(|r| match r {
                        ExportRecord::Question(q) if q.question == answer.question => Some(q),
                        _ => None,
                    }) else {
                        return Err(Error::Import(format!(
                            "line {line}: an answer to a question not exported before it: {:?}",
                            answer.question
                        )));
                    };
                    self.answers.insert(
                        key3(stream.id, answer.version, question.chain),
                        encode(answer),
                    )?;
                }
            }
        }
        let record = StreamRecord {
            id: stream.id,
            name: stream.name.clone(),
            created,
            log_len,
        };
        self.streams
            .insert(stream.name.as_bytes(), encode(&record))?;
        self.flush()?;
        Ok(record)
    }
}

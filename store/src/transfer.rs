//! Export and import of a stream as JSON Lines (format in `docs/storage.md`): one
//! record per line, the stream first, then its log, where each piece of it came from,
//! sources, chunks, memory versions, cursors, standing questions and their answers:
//! everything the stream has.

use serde::{Deserialize, Serialize};

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
        let backend = &self.backend;
        out.extend(
            backend
                .sources(&stream)?
                .into_iter()
                .map(ExportRecord::Source),
        );
        out.extend(self.chunks(&stream)?.into_iter().map(ExportRecord::Chunk));
        out.extend(
            backend
                .all_versions(&stream)?
                .into_iter()
                .map(|(chain, version)| ExportRecord::Version { chain, version }),
        );
        out.extend(
            backend
                .cursors(&stream)?
                .into_iter()
                .map(|(chain, cursor)| ExportRecord::Cursor { chain, cursor }),
        );
        out.extend(
            backend
                .segments(&stream)?
                .into_iter()
                .map(|(offset, segment)| ExportRecord::Segment { offset, segment }),
        );
        out.extend(
            self.questions(&stream)?
                .into_iter()
                .map(ExportRecord::Question),
        );
        out.extend(self.answers(&stream)?.into_iter().map(ExportRecord::Answer));
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
        check(&records[1..])?;
        let name = rename.unwrap_or(name);
        if self.stream(name)?.is_some() {
            return Err(Error::Import(format!(
                "stream `{name}` already exists; remove it first or import under another name"
            )));
        }
        let stream = self.create_stream(name)?;
        let result = self.backend.restore(&stream, *created, &records[1..]);
        if result.is_err() {
            let _ = self.remove_stream(name);
        }
        result
    }
}

/// Checks an export's records after the stream's: no second stream record, log pieces
/// that follow each other from 0, each answer after its question. Errors name the line.
fn check(records: &[ExportRecord]) -> Result<()> {
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
                log_len += text.len() as u64;
            }
            ExportRecord::Answer(answer) => {
                let asked = records[..line - 2].iter().any(
                    |r| matches!(r, ExportRecord::Question(q) if q.question == answer.question),
                );
                if !asked {
                    return Err(Error::Import(format!(
                        "line {line}: an answer to a question not exported before it: {:?}",
                        answer.question
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The chain of the standing question `question` among an export's records (checked to
/// come before its answers).
pub(crate) fn chain_of(records: &[ExportRecord], question: &str) -> Result<u64> {
    records
        .iter()
        .find_map(|r| match r {
            ExportRecord::Question(q) if q.question == question => Some(q.chain),
            _ => None,
        })
        .ok_or_else(|| {
            Error::Import(format!(
                "an answer to a question not exported: {question:?}"
            ))
        })
}

//! Export and import of a stream as JSON Lines (format in `docs/storage.md`): one
//! record per line, the stream first, then its log, sources, chunks, memory versions
//! and cursors.

use serde::{Deserialize, Serialize};

use crate::codec::{decode, encode, key1, key2, key3, last_u64};
use crate::records::{ChunkRecord, Cursor, MemoryVersion, SourceRecord};
use crate::{Error, Result, Store, StreamRecord};

/// Version of the export format, in the first line.
pub const EXPORT_FORMAT: u32 = 1;

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
        for item in self.log.scan_prefix(prefix) {
            let (key, value) = item?;
            let offset = last_u64(&key);
            let bytes = self.read_log(&stream, offset, offset + value.len() as u64 - 1)?;
            let text = String::from_utf8(bytes).map_err(|e| Error::Corrupt {
                tree: "log",
                key: crate::show_key(&key),
                reason: format!("not UTF-8: {e}"),
            })?;
            out.push(ExportRecord::Log { offset, text });
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
            let chain = u64::from_be_bytes(k[8..16].try_into().expect("versions key"));
            out.push(ExportRecord::Version {
                chain,
                version: decode("versions", &k, &v)?,
            });
        }
        for item in self.cursors.scan_prefix(prefix) {
            let (k, v) = item?;
            out.push(ExportRecord::Cursor {
                chain: last_u64(&k),
                cursor: decode("cursors", &k, &v)?,
            });
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
        if *format != EXPORT_FORMAT {
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
                    let mut value = vec![crate::codec::FORMAT];
                    value.extend_from_slice(text.as_bytes());
                    self.log.insert(key2(stream.id, *offset), value)?;
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

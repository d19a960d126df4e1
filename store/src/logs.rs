//! Content logs as append-only files beside the database, one per stream
//! (`logs/<stream id>.log`).
//!
//! An append writes its bytes at the stream's committed length and syncs them before the
//! database commits the new length, so a committed length never covers bytes that are
//! not on disk. Bytes past it (an append that failed or was killed before its commit)
//! are never read, are overwritten by the next append and are cut off at open. Reads go
//! to the file, so the database holds a stream's records, never its text: memory stays
//! bounded whatever is appended.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::{Error, Result};

pub(crate) struct Logs {
    dir: PathBuf,
    /// Held across an append's write and its commit: appends take turns.
    appending: Mutex<()>,
}

impl Logs {
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            appending: Mutex::new(()),
        })
    }

    pub(crate) fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.log"))
    }

    /// The turn to append: held until the append is committed.
    pub(crate) fn appending(&self) -> MutexGuard<'_, ()> {
        self.appending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream's log file, opened for each use: a daemon with thousands of streams
    /// holds no descriptor between reads.
    fn file(&self, id: u64) -> Result<File> {
        let path = self.path(id);
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| Error::Io { path, source })
    }

    /// Writes `bytes` at `at` in the stream's log and syncs them.
    pub(crate) fn write(&self, id: u64, at: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let file = self.file(id)?;
        let io = |source| Error::Io {
            path: self.path(id),
            source,
        };
        file.write_all_at(bytes, at).map_err(io)?;
        file.sync_data().map_err(io)
    }

    /// Bytes `[from, to)` of the stream's log; a file shorter than that is corrupt.
    pub(crate) fn read(&self, id: u64, from: u64, to: u64) -> Result<Vec<u8>> {
        let mut out = vec![0; to.saturating_sub(from) as usize];
        if out.is_empty() {
            return Ok(out);
        }
        let file = self.file(id)?;
        file.read_exact_at(&mut out, from)
            .map_err(|e| Error::Corrupt {
                tree: "log",
                key: self.path(id).display().to_string(),
                reason: match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => {
                        format!("the file ends before byte {to} the database says it holds")
                    }
                    _ => e.to_string(),
                },
            })?;
        Ok(out)
    }

    /// Cuts the stream's log back to its committed length.
    pub(crate) fn cut(&self, id: u64, len: u64) -> Result<()> {
        let file = self.file(id)?;
        let io = |source| Error::Io {
            path: self.path(id),
            source,
        };
        if file.metadata().map_err(io)?.len() > len {
            file.set_len(len).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        Ok(())
    }

    /// Deletes the stream's log file.
    pub(crate) fn remove(&self, id: u64) -> Result<()> {
        match std::fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io {
                path: self.path(id),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// The stream ids that have a log file.
    pub(crate) fn ids(&self) -> Result<Vec<u64>> {
        let io = |source| Error::Io {
            path: self.dir.clone(),
            source,
        };
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let name = entry.map_err(io)?.file_name();
            if let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|n| n.parse().ok())
            {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// Bytes the log files take.
    pub(crate) fn size(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

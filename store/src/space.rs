//! Free space kept on the data directory's filesystem: every write checks it first and
//! is refused below the reserve, so sled never meets a full disk inside a commit (where
//! it would wait forever on a buffer it cannot write).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

use crate::{Error, Result};

/// The free space writes leave by default: room for sled to grow its segments and for
/// a memory step to commit.
pub const DEFAULT_RESERVE: u64 = 64 << 20;

/// Sled writes a record to its log and again when it compacts it: what a write of `n`
/// bytes may need.
const WRITE_FACTOR: u64 = 2;

/// The data directory's filesystem as writes see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Space {
    /// Bytes available to this process on the filesystem.
    pub available: u64,
    /// Bytes writes leave free.
    pub reserve: u64,
    /// Whether the last write was refused for want of space (and none has succeeded
    /// since).
    pub refusing: bool,
}

pub(crate) struct Guard {
    dir: PathBuf,
    reserve: AtomicU64,
    refusing: AtomicBool,
}

impl Guard {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            reserve: AtomicU64::new(DEFAULT_RESERVE),
            refusing: AtomicBool::new(false),
        }
    }

    pub(crate) fn set_reserve(&self, bytes: u64) {
        self.reserve.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn measure(&self) -> Result<Space> {
        let available = fs4::available_space(&self.dir).map_err(|source| Error::Io {
            path: self.dir.clone(),
            source,
        })?;
        Ok(Space {
            available,
            reserve: self.reserve.load(Ordering::Relaxed),
            refusing: self.refusing.load(Ordering::Relaxed),
        })
    }

    /// Ok when a write of `bytes` leaves the reserve free; else [`Error::NoSpace`],
    /// and the store counts as refusing until a write fits again.
    pub(crate) fn make_room(&self, bytes: u64) -> Result<()> {
        let space = self.measure()?;
        let needed = space
            .reserve
            .saturating_add(bytes.saturating_mul(WRITE_FACTOR));
        if space.available < needed {
            if !self.refusing.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "{}: {} available, {} kept free: refusing writes until space returns",
                    self.dir.display(),
                    size(space.available),
                    size(space.reserve)
                );
            }
            return Err(Error::NoSpace {
                path: self.dir.clone(),
                available: size(space.available),
                reserve: size(space.reserve),
                write: size(bytes),
            });
        }
        if self.refusing.swap(false, Ordering::Relaxed) {
            tracing::info!(
                "{}: {} available again: writing resumes",
                self.dir.display(),
                size(space.available)
            );
        }
        Ok(())
    }
}

/// Bytes as people read them: "512 bytes", "12.5 MB".
fn size(bytes: u64) -> String {
    match bytes {
        0..1_000_000 => format!("{bytes} bytes"),
        _ => format!("{:.1} MB", bytes as f64 / 1e6),
    }
}

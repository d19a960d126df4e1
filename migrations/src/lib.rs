//! Schema versions of the memagent database and the numbered steps between them.
//!
//! The schema version lives in the database (tree `meta`, key `schema_version`, a format
//! byte then the version as a big-endian u32). [`migrate`] runs every step from the
//! stored version to [`CURRENT`] in order, all inside one sled transaction, and refuses a
//! database newer than this binary. Each step is one file (`v1_to_v2.rs`, …); every
//! past on-disk version has a fixture database under `migrations/fixtures/` that a test
//! upgrades.
//!
//! ```no_run
//! let db = sled::open("/tmp/memagent-db")?;
//! let version = memagent_migrations::migrate(&db)?;
//! assert_eq!(version, memagent_migrations::CURRENT);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod v1_to_v2;
mod v2_to_v3;

use std::collections::BTreeMap;

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

/// The schema this binary writes.
pub const CURRENT: u32 = 3;

/// Tree and key of the schema version.
pub const META_TREE: &str = "meta";
pub const SCHEMA_KEY: &[u8] = b"schema_version";
/// Format byte in front of the stored schema version.
const SCHEMA_FORMAT: u8 = 1;

/// Trees every schema version has; a step may add more.
pub const TREES: &[&str] = &[
    "streams",
    "stream_names",
    "log",
    "sources",
    "chunks",
    "versions",
    "cursors",
];

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "the database has schema version {database}, newer than this memctl understands \
         ({binary}); upgrade memagent"
    )]
    TooNew { database: u32, binary: u32 },
    #[error("the database's schema version record (meta/schema_version) is unreadable: {0}")]
    BadVersion(String),
    #[error("migration from schema v{from} to v{to} failed: {reason}")]
    Step { from: u32, to: u32, reason: String },
    #[error(transparent)]
    Sled(#[from] sled::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The writes of a migration, collected before they are applied in one transaction.
/// Steps read the database through it, so each sees what earlier steps wrote.
pub struct Changes<'a> {
    db: &'a sled::Db,
    writes: BTreeMap<(String, Vec<u8>), Option<Vec<u8>>>,
}

impl<'a> Changes<'a> {
    fn new(db: &'a sled::Db) -> Self {
        Self {
            db,
            writes: BTreeMap::new(),
        }
    }

    /// Every key and value of `tree`, with the pending writes applied.
    pub fn scan(&self, tree: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut all: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for item in self.db.open_tree(tree)?.iter() {
            let (k, v) = item?;
            all.insert(k.to_vec(), v.to_vec());
        }
        for ((t, k), v) in &self.writes {
            if t == tree {
                match v {
                    Some(v) => all.insert(k.clone(), v.clone()),
                    None => all.remove(k),
                };
            }
        }
        Ok(all.into_iter().collect())
    }

    pub fn insert(&mut self, tree: &str, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert((tree.to_string(), key), Some(value));
    }

    pub fn remove(&mut self, tree: &str, key: Vec<u8>) {
        self.writes.insert((tree.to_string(), key), None);
    }
}

type StepFn = fn(&mut Changes<'_>) -> std::result::Result<(), String>;

/// The steps, in order: `STEPS[i]` goes from version `i + 1` to `i + 2`.
const STEPS: &[StepFn] = &[v1_to_v2::run, v2_to_v3::run];

/// The stored schema version; `None` for a database that has none yet (new and empty).
pub fn stored_version(db: &sled::Db) -> Result<Option<u32>> {
    let meta = db.open_tree(META_TREE)?;
    match meta.get(SCHEMA_KEY)? {
        None => Ok(None),
        Some(bytes) => decode_version(&bytes).map(Some),
    }
}

fn decode_version(bytes: &[u8]) -> Result<u32> {
    match bytes {
        [SCHEMA_FORMAT, a, b, c, d] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        [f, ..] if *f != SCHEMA_FORMAT => {
            Err(Error::BadVersion(format!("unknown format version {f}")))
        }
        _ => Err(Error::BadVersion(format!("{} bytes", bytes.len()))),
    }
}

fn encode_version(version: u32) -> Vec<u8> {
    let mut out = vec![SCHEMA_FORMAT];
    out.extend_from_slice(&version.to_be_bytes());
    out
}

/// Brings the database to [`CURRENT`]: a new database is stamped, an older one is
/// upgraded step by step in one transaction, a newer one is refused.
pub fn migrate(db: &sled::Db) -> Result<u32> {
    for tree in TREES {
        db.open_tree(tree)?;
    }
    let from = match stored_version(db)? {
        Some(v) => v,
        None => {
            db.open_tree(META_TREE)?
                .insert(SCHEMA_KEY, encode_version(CURRENT))?;
            db.flush()?;
            return Ok(CURRENT);
        }
    };
    if from > CURRENT {
        return Err(Error::TooNew {
            database: from,
            binary: CURRENT,
        });
    }
    if from == CURRENT {
        return Ok(CURRENT);
    }
    if from == 0 {
        return Err(Error::BadVersion("schema version 0".to_string()));
    }
    let mut changes = Changes::new(db);
    for version in from..CURRENT {
        STEPS[(version - 1) as usize](&mut changes).map_err(|reason| Error::Step {
            from: version,
            to: version + 1,
            reason,
        })?;
    }
    changes.insert(META_TREE, SCHEMA_KEY.to_vec(), encode_version(CURRENT));
    // Every write of every step, and the new version, in one transaction.
    let names: Vec<String> = changes
        .writes
        .keys()
        .map(|(t, _)| t.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let trees: Vec<sled::Tree> = names
        .iter()
        .map(|n| db.open_tree(n))
        .collect::<std::result::Result<_, _>>()?;
    let outcome: std::result::Result<(), TransactionError<Error>> =
        trees.as_slice().transaction(|tx| {
            for ((tree, key), value) in &changes.writes {
                let at = names.iter().position(|n| n == tree).expect("tree listed");
                match value {
                    Some(v) => tx[at].insert(key.as_slice(), v.as_slice())?,
                    None => tx[at].remove(key.as_slice())?,
                };
            }
            Ok::<(), ConflictableTransactionError<Error>>(())
        });
    match outcome {
        Ok(()) => {}
        Err(TransactionError::Abort(e)) => return Err(e),
        Err(TransactionError::Storage(e)) => return Err(e.into()),
    }
    db.flush()?;
    tracing::info!("database upgraded from schema v{from} to v{CURRENT}");
    Ok(CURRENT)
}

/// Writes a schema version directly (for fixtures and tests).
pub fn set_version(db: &sled::Db, version: u32) -> Result<()> {
    db.open_tree(META_TREE)?
        .insert(SCHEMA_KEY, encode_version(version))?;
    db.flush()?;
    Ok(())
}

//! The store in PostgreSQL: the same records as the embedded database, one table each
//! (schema in `migrations/postgres/`, applied at connect by refinery), so that several
//! daemons on several machines can share the streams.
//!
//! The URL is libpq's (`postgres://user@host:5432/memagent`); a password is taken from
//! the URL or, better, from `PGPASSWORD` in the environment. Both commits are single
//! transactions: an append writes its log pieces, their provenance, the stream's new
//! length and the source's record together, and a memory step its version, chunk and
//! cursor; PostgreSQL makes each durable at commit. Unsigned 64-bit values are kept in
//! BIGINT columns with the same bits.
//!
//! The store's API is synchronous: each call runs its queries on a runtime the store
//! owns (one thread that drives the connections), waiting for the result on the calling
//! thread, which may be any thread, a daemon's async workers included.

use std::future::Future;
use std::path::Path;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use sha2::{Digest, Sha256};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row, Transaction};

use crate::backend::Backend;
use crate::records::{
    Author, ChunkRecord, Cursor, FileRecord, Lease, MemoryVersion, QuestionRecord, SegmentRecord,
    SourceRecord, StandingAnswer, StreamRecord, GENERAL,
};
use crate::{now, space, Appended, Changes, Error, ExportRecord, Result, Space};

mod schema {
    refinery::embed_migrations!("../migrations/postgres");
}

/// The most bytes one row of a log holds: a longer append is stored as several rows.
const PIECE: usize = 1 << 20;

/// The database's clock, in milliseconds since 1970: every lease is judged by it.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

/// The advisory lock (its key: "memagent" in ASCII) held while the schema is migrated.
const MIGRATION_LOCK: i64 = 0x6d65_6d61_6765_6e74;

/// Connections a store keeps open at most.
const CONNECTIONS: usize = 8;

/// The PostgreSQL backend (see the module's documentation).
pub(crate) struct PgStore {
    runtime: tokio::runtime::Runtime,
    pool: Pool,
    location: String,
    space: space::Guard,
    /// The data directory's lock: one process uses it at a time.
    _lock: std::fs::File,
}

/// A u64 kept in a BIGINT column.
fn big(v: u64) -> i64 {
    v as i64
}

/// A BIGINT column read back as the u64 it keeps.
fn unsigned(v: i64) -> u64 {
    v as u64
}

impl PgStore {
    pub(crate) fn connect(url: &str, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = crate::lock_dir(dir)?;
        let config = parse_url(url)?;
        let location = describe(&config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("memagent-postgres")
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(CONNECTIONS)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Database(format!("{location}: {e}")))?;
        let store = Self {
            runtime,
            pool,
            location,
            space: space::Guard::new(dir),
            _lock: lock,
        };
        store.run(async {
            let mut client = store.client().await?;
            // Daemons starting at once take turns: the first migrates, the others find
            // the schema current.
            // An engine without advisory locks (some PostgreSQL-compatible ones) migrates
            // unguarded: there, start one process first.
            let locked = match client
                .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
                .await
            {
                Ok(_) => true,
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) =>
                {
                    tracing::warn!(
                        "{}: no advisory locks, so processes starting at once could race to \
                         migrate the schema; start one first",
                        store.location
                    );
                    false
                }
                Err(e) => return Err(e.into()),
            };
            let migrated = schema::migrations::runner().run_async(&mut **client).await;
            if locked {
                client
                    .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
                    .await?;
            }
            migrated.map_err(|e| {
                Error::Database(format!("{}: migrating the schema: {e}", store.location))
            })?;
            Ok(())
        })?;
        Ok(store)
    }

    /// Runs `work` to its end on the calling thread, its connections driven by the
    /// store's runtime. Outside tokio's task budget: on a thread of another tokio
    /// runtime, a spent budget defers the wake-up to that runtime's next turn, which a
    /// thread blocked here never takes, and the call would wait forever.
    fn run<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        let _entered = self.runtime.enter();
        futures_executor::block_on(tokio::task::coop::unconstrained(work))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| {
            Error::Database(format!(
                "cannot reach {}: {}; is the server running, and are the URL and \
                     PGPASSWORD right?",
                self.location,
                causes(&e)
            ))
        })
    }

    /// `work` in one transaction, committed when it returns Ok.
    fn transaction<T>(
        &self,
        work: impl for<'t> AsyncFnOnce(&'t Transaction<'t>) -> Result<T>,
    ) -> Result<T> {
        self.run(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let out = work(&tx).await?;
            tx.commit().await?;
            Ok(out)
        })
    }

    fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        self.run(async {
            let client = self.client().await?;
            Ok(client.query(sql, params).await?)
        })
    }
}

/// An error with its causes, "outer: inner: …" (the pool's and the client's own
/// messages leave out why a connection failed).
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

/// A PostgreSQL URL read as a connection's configuration, the password taken from
/// `PGPASSWORD` where the URL has none.
fn parse_url(url: &str) -> Result<tokio_postgres::Config> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
        Error::Database(format!(
            "the database URL is not one PostgreSQL reads ({}): write it as \
             postgres://user@host:port/dbname",
            causes(&e)
        ))
    })?;
    if config.get_password().is_none() {
        if let Ok(password) = std::env::var("PGPASSWORD") {
            config.password(password);
        }
    }
    Ok(config)
}

/// Runs `sql` statements one after another on the server `server` names, each outside
/// any transaction (as CREATE and DROP DATABASE must be).
fn administer(server: &str, sql: &[String]) -> Result<()> {
    let config = parse_url(server)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Database(format!("{}: {e}", describe(&config))))?;
    runtime.block_on(async {
        let (client, connection) = config.connect(NoTls).await.map_err(|e| {
            Error::Database(format!(
                "cannot reach {}: {}",
                describe(&config),
                causes(&e)
            ))
        })?;
        tokio::spawn(connection);
        for statement in sql {
            client.batch_execute(statement).await?;
        }
        Ok(())
    })
}

/// A database name made only of ASCII letters, digits and underscores (so it needs no
/// quoting), or an error that says so.
fn plain_name(name: &str) -> Result<&str> {
    match !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        true => Ok(name),
        false => Err(Error::Database(format!(
            "`{name}` is not a database name this can create: use letters, digits and _"
        ))),
    }
}

/// A fresh, empty database `name` on the server `server` names (one left by that name
/// is dropped first), for tests and benchmarks: its URL, with the server's user, host,
/// port and password.
pub fn fresh_database(server: &str, name: &str) -> Result<String> {
    let name = plain_name(name)?;
    administer(
        server,
        &[
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ],
    )?;
    let config = parse_url(server)?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    // A password from PGPASSWORD stays there, out of the URL.
    let password = match url_has_password(server) {
        true => config
            .get_password()
            .map(|p| format!(":{}", String::from_utf8_lossy(p)))
            .unwrap_or_default(),
        false => String::new(),
    };
    Ok(format!("postgres://{user}{password}@{host}:{port}/{name}"))
}

/// Drops the database `name` on the server `server` names, closing its connections.
pub fn drop_database(server: &str, name: &str) -> Result<()> {
    let name = plain_name(name)?;
    administer(
        server,
        &[format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")],
    )
}

/// Whether a PostgreSQL URL (or key=value string) carries a password.
pub fn url_has_password(url: &str) -> bool {
    url.parse::<tokio_postgres::Config>()
        .is_ok_and(|c| c.get_password().is_some())
}

/// Where a configuration points, without its password: `host:port/database`.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or_default();
    format!("postgres://{host}:{port}/{db}")
}

fn stream_row(row: &Row) -> StreamRecord {
    StreamRecord {
        id: unsigned(row.get("id")),
        name: row.get("name"),
        created: unsigned(row.get("created")),
        log_len: unsigned(row.get("log_len")),
    }
}

fn hash(row: &Row, column: &str) -> Result<[u8; 32]> {
    let bytes: Vec<u8> = row.get(column);
    bytes.try_into().map_err(|b: Vec<u8>| Error::Corrupt {
        tree: "postgres",
        key: column.to_string(),
        reason: format!("a sha256 of {} bytes", b.len()),
    })
}

fn source_row(row: &Row) -> Result<SourceRecord> {
    Ok(SourceRecord {
        name: row.get("name"),
        bytes: unsigned(row.get("bytes")),
        sha256: hash(row, "sha256")?,
        revisions: row.get::<_, i32>("revisions") as u32,
    })
}

fn segment_row(row: &Row) -> (u64, SegmentRecord) {
    let turns: Vec<i64> = row.get("turns");
    (
        unsigned(row.get("at")),
        SegmentRecord {
            source: row.get("source"),
            first_line: unsigned(row.get("first_line")),
            turns: turns
                .chunks_exact(2)
                .map(|p| (unsigned(p[0]), unsigned(p[1])))
                .collect(),
        },
    )
}

fn chunk_row(row: &Row) -> Result<ChunkRecord> {
    Ok(ChunkRecord {
        index: unsigned(row.get("idx")),
        start: unsigned(row.get("start_at")),
        end: unsigned(row.get("end_at")),
        tokens: row.get::<_, i32>("tokens") as u32,
        sha256: hash(row, "sha256")?,
    })
}

fn version_row(row: &Row) -> MemoryVersion {
    MemoryVersion {
        version: unsigned(row.get("version")),
        parent: row.get::<_, Option<i64>>("parent").map(unsigned),
        text: row.get("text"),
        tokens: row.get::<_, i32>("tokens") as u32,
        chunk: row.get::<_, Option<i64>>("chunk").map(unsigned),
        model: row.get("model"),
        model_sha256: row.get("model_sha256"),
        template_id: row.get("template_id"),
        template_version: row.get::<_, i32>("template_version") as u32,
        created: unsigned(row.get("created")),
        prompt_tokens: row.get::<_, i32>("prompt_tokens") as u32,
        completion_tokens: row.get::<_, i32>("completion_tokens") as u32,
        seconds: row.get("seconds"),
        cut: row.get("cut"),
        author: match row.get::<_, Option<String>>("author") {
            None => Author::Model,
            Some(name) => Author::Person { name },
        },
    }
}

fn lease_row(row: &Row) -> Lease {
    Lease {
        stream: unsigned(row.get("stream_id")),
        owner: row.get("owner"),
        epoch: unsigned(row.get("epoch")),
        expires_ms: unsigned(row.get("expires_at")),
    }
}

fn cursor_row(row: &Row) -> Cursor {
    Cursor {
        next_chunk: unsigned(row.get("next_chunk")),
        offset: unsigned(row.get("byte_offset")),
        version: unsigned(row.get("version")),
    }
}

fn answer_row(row: &Row) -> StandingAnswer {
    StandingAnswer {
        question: row.get("question"),
        version: unsigned(row.get("version")),
        answer: row.get("answer"),
        created: unsigned(row.get("created")),
        seconds: row.get("seconds"),
    }
}

fn file_row(row: &Row) -> Result<FileRecord> {
    Ok(FileRecord {
        path: row.get("path"),
        stream: row.get("stream"),
        dev: unsigned(row.get("dev")),
        ino: unsigned(row.get("ino")),
        offset: unsigned(row.get("byte_offset")),
        sha256: hash(row, "sha256")?,
        lines: unsigned(row.get("lines")),
        revisions: row.get::<_, i32>("revisions") as u32,
    })
}

/// The stream named `name`, created if missing, its row locked until the transaction
/// ends: appends to one stream take turns across daemons.
async fn locked_stream(tx: &Transaction<'_>, name: &str) -> Result<StreamRecord> {
    tx.execute(
        "INSERT INTO streams (id, name, created, log_len) \
         VALUES (nextval('stream_ids'), $1, $2, 0) ON CONFLICT (name) DO NOTHING",
        &[&name, &big(now())],
    )
    .await?;
    let row = tx
        .query_one("SELECT * FROM streams WHERE name = $1 FOR UPDATE", &[&name])
        .await?;
    Ok(stream_row(&row))
}

/// Writes `bytes` to a stream's log at `at`, in rows of at most [`PIECE`] bytes.
async fn write_log(tx: &Transaction<'_>, stream: u64, at: u64, bytes: &[u8]) -> Result<()> {
    let mut offset = at;
    for piece in bytes.chunks(PIECE) {
        tx.execute(
            "INSERT INTO log_pieces (stream_id, at, bytes) VALUES ($1, $2, $3)",
            &[&big(stream), &big(offset), &piece],
        )
        .await?;
        offset += piece.len() as u64;
    }
    Ok(())
}

async fn put_segment(
    tx: &Transaction<'_>,
    stream: u64,
    at: u64,
    segment: &SegmentRecord,
) -> Result<()> {
    let turns: Vec<i64> = segment
        .turns
        .iter()
        .flat_map(|&(a, b)| [big(a), big(b)])
        .collect();
    tx.execute(
        "INSERT INTO segments (stream_id, at, source, first_line, turns) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (stream_id, at) DO UPDATE SET \
         source = EXCLUDED.source, first_line = EXCLUDED.first_line, turns = EXCLUDED.turns",
        &[
            &big(stream),
            &big(at),
            &segment.source,
            &big(segment.first_line),
            &turns,
        ],
    )
    .await?;
    Ok(())
}

async fn put_source(tx: &Transaction<'_>, stream: u64, source: &SourceRecord) -> Result<()> {
    tx.execute(
        "INSERT INTO sources (stream_id, name, bytes, sha256, revisions) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (stream_id, name) DO UPDATE SET \
         bytes = EXCLUDED.bytes, sha256 = EXCLUDED.sha256, revisions = EXCLUDED.revisions",
        &[
            &big(stream),
            &source.name,
            &big(source.bytes),
            &source.sha256.as_slice(),
            &(source.revisions as i32),
        ],
    )
    .await?;
    Ok(())
}

async fn put_chunk(tx: &Transaction<'_>, stream: u64, chunk: &ChunkRecord) -> Result<()> {
    tx.execute(
        "INSERT INTO chunks (stream_id, idx, start_at, end_at, tokens, sha256) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (stream_id, idx) DO UPDATE SET \
         start_at = EXCLUDED.start_at, end_at = EXCLUDED.end_at, tokens = EXCLUDED.tokens, \
         sha256 = EXCLUDED.sha256",
        &[
            &big(stream),
            &big(chunk.index),
            &big(chunk.start),
            &big(chunk.end),
            &(chunk.tokens as i32),
            &chunk.sha256.as_slice(),
        ],
    )
    .await?;
    Ok(())
}

async fn put_version(
    tx: &Transaction<'_>,
    stream: u64,
    chain: u64,
    v: &MemoryVersion,
) -> Result<()> {
    let author = match &v.author {
        Author::Model => None,
        Author::Person { name } => Some(name.as_str()),
    };
    tx.execute(
        "INSERT INTO versions (stream_id, chain, version, parent, text, tokens, chunk, model, \
         model_sha256, template_id, template_version, created, prompt_tokens, \
         completion_tokens, seconds, cut, author) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
         $9, $10, $11, $12, $13, $14, $15, $16, $17) \
         ON CONFLICT (stream_id, chain, version) DO UPDATE SET parent = EXCLUDED.parent, \
         text = EXCLUDED.text, tokens = EXCLUDED.tokens, chunk = EXCLUDED.chunk, \
         model = EXCLUDED.model, model_sha256 = EXCLUDED.model_sha256, \
         template_id = EXCLUDED.template_id, template_version = EXCLUDED.template_version, \
         created = EXCLUDED.created, prompt_tokens = EXCLUDED.prompt_tokens, \
         completion_tokens = EXCLUDED.completion_tokens, seconds = EXCLUDED.seconds, \
         cut = EXCLUDED.cut, author = EXCLUDED.author",
        &[
            &big(stream),
            &big(chain),
            &big(v.version),
            &v.parent.map(big),
            &v.text,
            &(v.tokens as i32),
            &v.chunk.map(big),
            &v.model,
            &v.model_sha256,
            &v.template_id,
            &(v.template_version as i32),
            &big(v.created),
            &(v.prompt_tokens as i32),
            &(v.completion_tokens as i32),
            &v.seconds,
            &v.cut,
            &author,
        ],
    )
    .await?;
    Ok(())
}

/// Writes a cursor; the general memory's is also kept on the stream's row (`read_to`,
/// which the partial index of unread streams compares with `log_len`).
async fn put_cursor(tx: &Transaction<'_>, stream: u64, chain: u64, c: &Cursor) -> Result<()> {
    if chain == GENERAL {
        tx.execute(
            "UPDATE streams SET read_to = $2 WHERE id = $1",
            &[&big(stream), &big(c.offset)],
        )
        .await?;
    }
    tx.execute(
        "INSERT INTO cursors (stream_id, chain, next_chunk, byte_offset, version) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (stream_id, chain) DO UPDATE SET \
         next_chunk = EXCLUDED.next_chunk, byte_offset = EXCLUDED.byte_offset, \
         version = EXCLUDED.version",
        &[
            &big(stream),
            &big(chain),
            &big(c.next_chunk),
            &big(c.offset),
            &big(c.version),
        ],
    )
    .await?;
    Ok(())
}

async fn put_question(tx: &Transaction<'_>, stream: u64, q: &QuestionRecord) -> Result<()> {
    tx.execute(
        "INSERT INTO questions (stream_id, chain, question) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
        &[&big(stream), &big(q.chain), &q.question],
    )
    .await?;
    Ok(())
}

async fn put_answer(
    tx: &Transaction<'_>,
    stream: u64,
    chain: u64,
    a: &StandingAnswer,
) -> Result<()> {
    tx.execute(
        "INSERT INTO answers (stream_id, version, chain, question, answer, created, seconds) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (stream_id, version, chain) \
         DO UPDATE SET question = EXCLUDED.question, answer = EXCLUDED.answer, \
         created = EXCLUDED.created, seconds = EXCLUDED.seconds",
        &[
            &big(stream),
            &big(a.version),
            &big(chain),
            &a.question,
            &a.answer,
            &big(a.created),
            &a.seconds,
        ],
    )
    .await?;
    Ok(())
}

/// The tables holding a stream's rows, by its id.
const STREAM_TABLES: &[&str] = &[
    "leases",
    "log_pieces",
    "sources",
    "segments",
    "chunks",
    "versions",
    "cursors",
    "questions",
    "answers",
];

/// Sorted as the embedded database keys them (by the sha256 of the name), so that an
/// export reads the same from either.
fn by_name_hash<T>(mut items: Vec<T>, name: impl Fn(&T) -> &str) -> Vec<T> {
    items.sort_by_cached_key(|item| Sha256::digest(name(item).as_bytes()));
    items
}

impl Backend for PgStore {
    fn shared(&self) -> bool {
        true
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn size_on_disk(&self) -> Result<u64> {
        // Not every PostgreSQL-compatible engine tells: 0 where it does not.
        let rows = self.query("SELECT pg_database_size(current_database())", &[]);
        Ok(rows
            .ok()
            .and_then(|rows| rows.first().map(|r| unsigned(r.get(0))))
            .unwrap_or(0))
    }

    fn space(&self) -> Result<Space> {
        self.space.measure()
    }

    fn set_reserve(&self, bytes: u64) {
        self.space.set_reserve(bytes);
    }

    /// The records are on the server, whose disk is its own: nothing is refused here.
    fn make_room(&self, _bytes: u64) -> Result<()> {
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn stream(&self, name: &str) -> Result<Option<StreamRecord>> {
        let rows = self.query("SELECT * FROM streams WHERE name = $1", &[&name])?;
        Ok(rows.first().map(stream_row))
    }

    fn streams(&self) -> Result<Vec<StreamRecord>> {
        let mut streams: Vec<StreamRecord> = self
            .query("SELECT * FROM streams", &[])?
            .iter()
            .map(stream_row)
            .collect();
        streams.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        Ok(streams)
    }

    fn change_mark(&self) -> Result<Option<u64>> {
        let rows = self.query(
            "SELECT greatest((SELECT coalesce(max(changed), 0) FROM streams), \
                    (SELECT coalesce(max(changed), 0) FROM removed_streams)) AS mark",
            &[],
        )?;
        Ok(rows.first().map(|row| unsigned(row.get("mark"))))
    }

    /// Two index scans, whatever the number of streams.
    fn changes(&self, after: u64) -> Result<Option<Changes>> {
        let mut changes = Changes {
            through: after,
            ..Changes::default()
        };
        for row in self.query("SELECT * FROM streams WHERE changed > $1", &[&big(after)])? {
            changes.through = changes.through.max(unsigned(row.get("changed")));
            changes.streams.push(stream_row(&row));
        }
        for row in self.query(
            "SELECT id, changed FROM removed_streams WHERE changed > $1",
            &[&big(after)],
        )? {
            changes.through = changes.through.max(unsigned(row.get("changed")));
            changes.removed.push(unsigned(row.get("id")));
        }
        changes
            .streams
            .sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        Ok(Some(changes))
    }

    /// One query, whatever the number of streams.
    fn unread(&self) -> Result<Vec<(StreamRecord, u64)>> {
        let rows = self.query("SELECT * FROM streams WHERE log_len > read_to", &[])?;
        let mut unread: Vec<(StreamRecord, u64)> = rows
            .iter()
            .map(|row| (stream_row(row), unsigned(row.get("read_to"))))
            .collect();
        unread.sort_by(|a, b| a.0.name.as_bytes().cmp(b.0.name.as_bytes()));
        Ok(unread)
    }

    fn create_stream(&self, name: &str) -> Result<StreamRecord> {
        self.transaction(async |tx| locked_stream(tx, name).await)
    }

    fn remove_stream(&self, name: &str) -> Result<()> {
        self.transaction(async |tx| {
            let row = tx
                .query_opt("SELECT * FROM streams WHERE name = $1 FOR UPDATE", &[&name])
                .await?
                .ok_or_else(|| Error::NoStream(name.to_string()))?;
            let id = row.get::<_, i64>("id");
            for table in STREAM_TABLES {
                tx.execute(&format!("DELETE FROM {table} WHERE stream_id = $1"), &[&id])
                    .await?;
            }
            tx.execute("DELETE FROM files WHERE stream = $1", &[&name])
                .await?;
            tx.execute("DELETE FROM streams WHERE id = $1", &[&id])
                .await?;
            tx.execute(
                "INSERT INTO removed_streams (id, changed) VALUES ($1, nextval('log_changes'))",
                &[&id],
            )
            .await?;
            Ok(())
        })
    }

    fn append_turns(
        &self,
        stream: &str,
        bytes: &[u8],
        source: Option<&str>,
        force: bool,
        turns: Vec<(u64, u64)>,
    ) -> Result<Appended> {
        self.transaction(async |tx| {
            let record = locked_stream(tx, stream).await?;
            let previous = match source {
                Some(name) => tx
                    .query_opt(
                        "SELECT * FROM sources WHERE stream_id = $1 AND name = $2",
                        &[&big(record.id), &name],
                    )
                    .await?
                    .map(|row| source_row(&row))
                    .transpose()?,
                None => None,
            };
            let plan = crate::plan_append(bytes, source, previous.as_ref(), force, turns);
            if plan.unchanged {
                return Ok(Appended {
                    bytes: 0,
                    revision: plan.revision,
                    log_len: record.log_len,
                });
            }
            write_log(tx, record.id, record.log_len, plan.new).await?;
            if let Some(segment) = &plan.segment {
                put_segment(tx, record.id, record.log_len, segment).await?;
            }
            let log_len = record.log_len + plan.new.len() as u64;
            tx.execute(
                "UPDATE streams SET log_len = $2, changed = nextval('log_changes') WHERE id = $1",
                &[&big(record.id), &big(log_len)],
            )
            .await?;
            if let Some(src) = &plan.source {
                put_source(tx, record.id, src).await?;
            }
            Ok(Appended {
                bytes: plan.new.len() as u64,
                revision: plan.revision,
                log_len,
            })
        })
    }

    fn append_file(
        &self,
        text: &[u8],
        file: &FileRecord,
        renamed_from: Option<&str>,
        segment: &SegmentRecord,
    ) -> Result<Appended> {
        self.transaction(async |tx| {
            let record = locked_stream(tx, &file.stream).await?;
            let log_len = record.log_len + text.len() as u64;
            if !text.is_empty() {
                write_log(tx, record.id, record.log_len, text).await?;
                put_segment(tx, record.id, record.log_len, segment).await?;
                tx.execute(
                    "UPDATE streams SET log_len = $2, changed = nextval('log_changes') WHERE id = $1",
                    &[&big(record.id), &big(log_len)],
                )
                .await?;
            }
            if let Some(old) = renamed_from.filter(|old| *old != file.path) {
                tx.execute("DELETE FROM files WHERE path = $1", &[&old])
                    .await?;
            }
            tx.execute(
                "INSERT INTO files (path, stream, dev, ino, byte_offset, sha256, lines, \
                 revisions) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (path) DO \
                 UPDATE SET stream = EXCLUDED.stream, dev = EXCLUDED.dev, ino = EXCLUDED.ino, \
                 byte_offset = EXCLUDED.byte_offset, sha256 = EXCLUDED.sha256, \
                 lines = EXCLUDED.lines, revisions = EXCLUDED.revisions",
                &[
                    &file.path,
                    &file.stream,
                    &big(file.dev),
                    &big(file.ino),
                    &big(file.offset),
                    &file.sha256.as_slice(),
                    &big(file.lines),
                    &(file.revisions as i32),
                ],
            )
            .await?;
            Ok(Appended {
                bytes: text.len() as u64,
                revision: false,
                log_len,
            })
        })
    }

    fn segment_at(
        &self,
        stream: &StreamRecord,
        offset: u64,
    ) -> Result<Option<(u64, SegmentRecord)>> {
        let rows = self.query(
            "SELECT * FROM segments WHERE stream_id = $1 AND at <= $2 ORDER BY at DESC LIMIT 1",
            &[&big(stream.id), &big(offset)],
        )?;
        Ok(rows.first().map(segment_row))
    }

    fn files(&self) -> Result<Vec<FileRecord>> {
        let mut files = self
            .query("SELECT * FROM files", &[])?
            .iter()
            .map(file_row)
            .collect::<Result<Vec<_>>>()?;
        files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        Ok(files)
    }

    fn read_log(&self, stream: &StreamRecord, from: u64, to: u64) -> Result<Vec<u8>> {
        if from >= to {
            return Ok(Vec::new());
        }
        // The rows overlapping [from, to): from the last one starting at or before
        // `from`, each cut to the range on the server.
        let rows = self.query(
            "SELECT at, substring(bytes FROM (greatest($2 - at, 0) + 1)::integer \
             FOR (least($3 - at, length(bytes)) - greatest($2 - at, 0))::integer) AS part \
             FROM log_pieces WHERE stream_id = $1 AND at < $3 AND at >= coalesce(\
             (SELECT max(at) FROM log_pieces WHERE stream_id = $1 AND at <= $2), 0) \
             ORDER BY at",
            &[&big(stream.id), &big(from), &big(to)],
        )?;
        let mut out = Vec::with_capacity((to - from) as usize);
        for row in rows {
            let part: &[u8] = row.get("part");
            out.extend_from_slice(part);
        }
        if out.len() as u64 != to - from {
            return Err(Error::Corrupt {
                tree: "log_pieces",
                key: format!("{}/{from}", stream.id),
                reason: format!(
                    "{} bytes of the log stored for {} asked (bytes {from}..{to})",
                    out.len(),
                    to - from
                ),
            });
        }
        Ok(out)
    }

    fn cursor(&self, stream: &StreamRecord, chain: u64) -> Result<Cursor> {
        let rows = self.query(
            "SELECT * FROM cursors WHERE stream_id = $1 AND chain = $2",
            &[&big(stream.id), &big(chain)],
        )?;
        Ok(rows.first().map(cursor_row).unwrap_or_default())
    }

    fn commit_step(
        &self,
        stream: &StreamRecord,
        chain: u64,
        chunk: &ChunkRecord,
        version: &MemoryVersion,
        cursor: &Cursor,
        lease: Option<&Lease>,
    ) -> Result<()> {
        self.transaction(async |tx| {
            // The fence: the lease row locked, so that a takeover waits for this commit
            // or this commit sees the takeover.
            if let Some(lease) = lease {
                let held = tx
                    .query_opt(
                        &format!(
                            "SELECT 1 FROM leases WHERE stream_id = $1 AND owner = $2 AND \
                             epoch = $3 AND expires_at >= {NOW_MS} FOR UPDATE"
                        ),
                        &[&big(stream.id), &lease.owner, &big(lease.epoch)],
                    )
                    .await?;
                if held.is_none() {
                    return Err(Error::Fenced {
                        stream: stream.id,
                        owner: lease.owner.clone(),
                        epoch: lease.epoch,
                    });
                }
            }
            // Chunks are shared by all chains of a stream: the general chain defines
            // them, question chains replay them.
            if chain == GENERAL {
                put_chunk(tx, stream.id, chunk).await?;
            }
            put_version(tx, stream.id, chain, version).await?;
            put_cursor(tx, stream.id, chain, cursor).await
        })
    }

    fn add_version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        mut version: MemoryVersion,
    ) -> Result<MemoryVersion> {
        self.transaction(async |tx| {
            let mut cursor = tx
                .query_opt(
                    "SELECT * FROM cursors WHERE stream_id = $1 AND chain = $2 FOR UPDATE",
                    &[&big(stream.id), &big(chain)],
                )
                .await?
                .map(|row| cursor_row(&row))
                .unwrap_or_default();
            version.version = cursor.version + 1;
            version.parent = (cursor.version > 0).then_some(cursor.version);
            cursor.version = version.version;
            put_version(tx, stream.id, chain, &version).await?;
            put_cursor(tx, stream.id, chain, &cursor).await?;
            Ok(version.clone())
        })
    }

    fn version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        version: u64,
    ) -> Result<Option<MemoryVersion>> {
        let rows = self.query(
            "SELECT * FROM versions WHERE stream_id = $1 AND chain = $2 AND version = $3",
            &[&big(stream.id), &big(chain), &big(version)],
        )?;
        Ok(rows.first().map(version_row))
    }

    fn versions(&self, stream: &StreamRecord, chain: u64) -> Result<Vec<MemoryVersion>> {
        Ok(self.versions_from(stream, chain, 0)?.collect())
    }

    fn versions_from<'a>(
        &'a self,
        stream: &StreamRecord,
        chain: u64,
        first: u64,
    ) -> Result<Box<dyn Iterator<Item = MemoryVersion> + 'a>> {
        let rows = self.query(
            "SELECT * FROM versions WHERE stream_id = $1 AND chain = $2 AND version >= $3 \
             ORDER BY version",
            &[&big(stream.id), &big(chain), &big(first)],
        )?;
        Ok(Box::new(rows.into_iter().map(|row| version_row(&row))))
    }

    fn chunk(&self, stream: &StreamRecord, index: u64) -> Result<Option<ChunkRecord>> {
        let rows = self.query(
            "SELECT * FROM chunks WHERE stream_id = $1 AND idx = $2",
            &[&big(stream.id), &big(index)],
        )?;
        rows.first().map(chunk_row).transpose()
    }

    fn chunks(&self, stream: &StreamRecord) -> Result<Vec<ChunkRecord>> {
        self.query(
            "SELECT * FROM chunks WHERE stream_id = $1 ORDER BY idx",
            &[&big(stream.id)],
        )?
        .iter()
        .map(chunk_row)
        .collect()
    }

    fn question_chain(&self, stream: &StreamRecord, question: &str) -> Result<QuestionRecord> {
        self.transaction(async |tx| {
            let id = big(stream.id);
            let find = "SELECT chain FROM questions WHERE stream_id = $1 AND question = $2";
            if let Some(row) = tx.query_opt(find, &[&id, &question]).await? {
                return Ok(QuestionRecord {
                    chain: unsigned(row.get(0)),
                    question: question.to_string(),
                });
            }
            let count: i64 = tx
                .query_one(
                    "SELECT count(*) FROM questions WHERE stream_id = $1",
                    &[&id],
                )
                .await?
                .get(0);
            let record = QuestionRecord {
                chain: unsigned(count) + 1,
                question: question.to_string(),
            };
            put_question(tx, stream.id, &record).await?;
            Ok(record)
        })
    }

    fn add_answer(&self, stream: &StreamRecord, answer: &StandingAnswer) -> Result<()> {
        let chain = self.question_chain(stream, &answer.question)?.chain;
        self.transaction(async |tx| put_answer(tx, stream.id, chain, answer).await)
    }

    fn answers(&self, stream: &StreamRecord) -> Result<Vec<StandingAnswer>> {
        Ok(self
            .query(
                "SELECT * FROM answers WHERE stream_id = $1 ORDER BY version, chain",
                &[&big(stream.id)],
            )?
            .iter()
            .map(answer_row)
            .collect())
    }

    fn questions(&self, stream: &StreamRecord) -> Result<Vec<QuestionRecord>> {
        let questions = self
            .query(
                "SELECT chain, question FROM questions WHERE stream_id = $1",
                &[&big(stream.id)],
            )?
            .iter()
            .map(|row| QuestionRecord {
                chain: unsigned(row.get("chain")),
                question: row.get("question"),
            })
            .collect();
        Ok(by_name_hash(questions, |q| &q.question))
    }

    fn sources(&self, stream: &StreamRecord) -> Result<Vec<SourceRecord>> {
        let sources = self
            .query(
                "SELECT * FROM sources WHERE stream_id = $1",
                &[&big(stream.id)],
            )?
            .iter()
            .map(source_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(by_name_hash(sources, |s| &s.name))
    }

    fn all_versions(&self, stream: &StreamRecord) -> Result<Vec<(u64, MemoryVersion)>> {
        Ok(self
            .query(
                "SELECT * FROM versions WHERE stream_id = $1 ORDER BY chain, version",
                &[&big(stream.id)],
            )?
            .iter()
            .map(|row| (unsigned(row.get("chain")), version_row(row)))
            .collect())
    }

    fn cursors(&self, stream: &StreamRecord) -> Result<Vec<(u64, Cursor)>> {
        Ok(self
            .query(
                "SELECT * FROM cursors WHERE stream_id = $1 ORDER BY chain",
                &[&big(stream.id)],
            )?
            .iter()
            .map(|row| (unsigned(row.get("chain")), cursor_row(row)))
            .collect())
    }

    fn segments(&self, stream: &StreamRecord) -> Result<Vec<(u64, SegmentRecord)>> {
        Ok(self
            .query(
                "SELECT * FROM segments WHERE stream_id = $1 ORDER BY at",
                &[&big(stream.id)],
            )?
            .iter()
            .map(segment_row)
            .collect())
    }

    fn restore(
        &self,
        stream: &StreamRecord,
        created: u64,
        records: &[ExportRecord],
    ) -> Result<StreamRecord> {
        self.transaction(async |tx| {
            let id = stream.id;
            let mut log_len = 0u64;
            for record in records {
                match record {
                    ExportRecord::Stream { .. } => {}
                    ExportRecord::Log { offset, text } => {
                        write_log(tx, id, *offset, text.as_bytes()).await?;
                        log_len = offset + text.len() as u64;
                    }
                    ExportRecord::Source(source) => put_source(tx, id, source).await?,
                    ExportRecord::Chunk(chunk) => put_chunk(tx, id, chunk).await?,
                    ExportRecord::Version { chain, version } => {
                        put_version(tx, id, *chain, version).await?
                    }
                    ExportRecord::Cursor { chain, cursor } => {
                        put_cursor(tx, id, *chain, cursor).await?
                    }
                    ExportRecord::Segment { offset, segment } => {
                        put_segment(tx, id, *offset, segment).await?
                    }
                    ExportRecord::Question(question) => {
                        put_question(tx, id, question).await?;
                    }
                    ExportRecord::Answer(answer) => {
                        let chain = crate::transfer::chain_of(records, &answer.question)?;
                        put_answer(tx, id, chain, answer).await?;
                    }
                }
            }
            tx.execute(
                "UPDATE streams SET log_len = $2, created = $3, changed = nextval('log_changes') \
                 WHERE id = $1",
                &[&big(id), &big(log_len), &big(created)],
            )
            .await?;
            Ok(StreamRecord {
                id,
                name: stream.name.clone(),
                created,
                log_len,
            })
        })
    }

    fn take_leases(
        &self,
        owner: &str,
        max: usize,
        ttl_ms: u64,
        fresh_bytes: u64,
    ) -> Result<Vec<Lease>> {
        // Streams with text the general memory has not read, unleased or expired; rows
        // another daemon is taking are skipped. Fresh streams first, then the one held
        // least recently (a released one expired when it was
        // released). The upsert's guard takes a
        // lease only when it is still expired, so two daemons never both get one.
        let sql = format!(
            "WITH free AS (\
               SELECT s.id FROM streams s \
               LEFT JOIN leases l ON l.stream_id = s.id \
               WHERE s.log_len > s.read_to \
                 AND (l.stream_id IS NULL OR l.expires_at < {NOW_MS}) \
               ORDER BY s.log_len - s.read_to > $4, \
                 coalesce(l.expires_at, 0), s.id \
               LIMIT $2 FOR UPDATE OF s SKIP LOCKED) \
             INSERT INTO leases (stream_id, owner, epoch, expires_at) \
             SELECT id, $1, 1, {NOW_MS} + $3 FROM free \
             ON CONFLICT (stream_id) DO UPDATE SET owner = EXCLUDED.owner, \
               epoch = leases.epoch + 1, expires_at = EXCLUDED.expires_at \
             WHERE leases.expires_at < {NOW_MS} \
             RETURNING stream_id, owner, epoch, expires_at"
        );
        let rows = self.transaction(async |tx| {
            Ok(tx
                .query(
                    &sql,
                    &[&owner, &(max as i64), &big(ttl_ms), &big(fresh_bytes)],
                )
                .await?)
        })?;
        let mut leases: Vec<Lease> = rows.iter().map(lease_row).collect();
        leases.sort_by_key(|l| l.stream);
        Ok(leases)
    }

    fn renew_leases(&self, leases: &[Lease], ttl_ms: u64) -> Result<Vec<Lease>> {
        let owners: Vec<&str> = leases.iter().map(|l| l.owner.as_str()).collect();
        let streams: Vec<i64> = leases.iter().map(|l| big(l.stream)).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| big(l.epoch)).collect();
        let rows = self.query(
            &format!(
                "UPDATE leases SET expires_at = {NOW_MS} + $4 \
                 WHERE (stream_id, owner, epoch) IN \
                   (SELECT * FROM unnest($1::BIGINT[], $2::TEXT[], $3::BIGINT[])) \
                 AND expires_at >= {NOW_MS} \
                 RETURNING stream_id, owner, epoch, expires_at"
            ),
            &[&streams, &owners, &epochs, &big(ttl_ms)],
        )?;
        let mut renewed: Vec<Lease> = rows.iter().map(lease_row).collect();
        renewed.sort_by_key(|l| l.stream);
        Ok(renewed)
    }

    /// Expired at once (a millisecond ago, which also dates when the stream was last
    /// held) rather than deleted: the epoch only ever rises.
    fn release_lease(&self, lease: &Lease) -> Result<()> {
        self.query(
            &format!(
                "UPDATE leases SET expires_at = {NOW_MS} - 1 WHERE stream_id = $1 AND \
                 owner = $2 AND epoch = $3"
            ),
            &[&big(lease.stream), &lease.owner, &big(lease.epoch)],
        )?;
        Ok(())
    }

    fn leases(&self) -> Result<(Vec<Lease>, u64)> {
        let leases = self
            .query("SELECT * FROM leases ORDER BY stream_id", &[])?
            .iter()
            .map(lease_row)
            .collect();
        let now = self.query(&format!("SELECT {NOW_MS}"), &[])?;
        Ok((leases, now.first().map_or(0, |r| unsigned(r.get(0)))))
    }

    fn raw_insert(&self, tree: &str, _key: &[u8], _value: &[u8]) -> Result<()> {
        Err(Error::Database(format!(
            "raw records ({tree}) are the embedded database's; PostgreSQL keeps typed rows"
        )))
    }
}

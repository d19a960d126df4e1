//! The memagent daemon: watches files, folders and conversation logs, appends what is new
//! to their streams at once (commit 1), has the engine read pending chunks into memory
//! (commit 2), and answers over a local socket.
//!
//! Three parts run side by side and never wait on each other: a thread that follows the
//! files (notify events, a start-up reconciliation scan and periodic rescans), a
//! scheduler that decides which stream the engine reads next, and the HTTP API. The
//! engine itself runs on the thread that owns the model, behind a request channel
//! ([`EngineHandle`]); [`serve_engine`] is that thread's loop. Problems with single files
//! are logged with the file and never stop the daemon. How a question is answered is
//! `memagent_memory`'s: the API and the engine thread pass its typed queries and answers
//! through and serialise them. The crate never prints.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use memagent_watcher::{DaemonInfo, DaemonOptions, EngineHandle};
//!
//! let store = Arc::new(memagent_store::Store::open("/tmp/memagent-data".as_ref())?);
//! let recall = Arc::new(memagent_recall::Recall::open("/tmp/memagent-data/index".as_ref(), None)?);
//! let (engine, requests) = EngineHandle::channel();
//! // The thread that owns the model runs `serve_engine(&agent, &ingestor, requests)`.
//! # drop(requests);
//! let info = DaemonInfo {
//!     pid: std::process::id(),
//!     version: "0.1.0".into(),
//!     model: "SmolLM2-135M-Instruct".into(),
//!     chunk_tokens: 1024,
//!     memory_tokens: 256,
//!     data_dir: "/tmp/memagent-data".into(),
//!     idle_seconds: 30.0,
//!     watches: 0,
//! };
//! memagent_watcher::run(store, recall, engine, info, DaemonOptions::default())?;
//! # Ok(()) }
//! ```

mod api;
mod chat;
mod config;
mod engine;
mod error;
mod files;
mod proxy;
mod scheduler;
mod stats;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use memagent_recall::Recall;
use memagent_store::Store;
use notify::{RecursiveMode, Watcher};

pub use api::{stream_rows, DaemonInfo};
pub use chat::{parse as parse_chat, render_message, utc, Parsed};
pub use config::{
    default_name, socket_path, validate_watches, DaemonOptions, ProxyOptions, TcpOptions,
    WatchConfig, WatchFormat,
};
pub use engine::{
    serve as serve_engine, EngineHandle, EngineRequests, ReadAheadStatus, Request, Step,
};
pub use error::{Error, Result};
pub use proxy::EVIDENCE_CHARS as PROXY_EVIDENCE_CHARS;

use config::Watch;
use files::Tracker;
use stats::Stats;

enum Msg {
    Paths(Vec<PathBuf>),
    Rescan,
    Stop,
}

/// Runs the daemon until SIGTERM or SIGINT, then stops cleanly: the listeners close,
/// the file thread ends, the socket is removed and the store is flushed; within
/// `options.stop_timeout` whatever the store is doing, else (or at a second signal) the
/// process exits at once with status 1. `recall` is the
/// passage index: an indexer thread catches it up at start and indexes each append as it
/// arrives, apart from memory steps.
pub fn run(
    store: Arc<Store>,
    recall: Arc<Recall>,
    engine: EngineHandle,
    info: DaemonInfo,
    options: DaemonOptions,
) -> Result<()> {
    let watches = options
        .watches
        .iter()
        .cloned()
        .map(Watch::new)
        .collect::<Result<Vec<_>>>()?;
    let socket = socket_path(store.path());
    let io = {
        let path = socket.clone();
        move |source| Error::Io {
            path: path.clone(),
            source,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(&io)?;
    let stats = Arc::new(Mutex::new(Stats::default()));
    // Appends go to the indexer and on to the scheduler.
    let (arrivals_tx, mut appended_rx) = tokio::sync::mpsc::unbounded_channel::<files::Arrival>();
    let (scheduler_tx, arrivals_rx) = tokio::sync::mpsc::unbounded_channel();
    let (index_tx, index_rx) = mpsc::channel::<String>();
    let indexer = {
        let (store, recall) = (store.clone(), recall.clone());
        let read_ahead = options.read_ahead.then(|| engine.clone());
        std::thread::Builder::new()
            .name("memagent-index".into())
            .spawn(move || index_appends(&store, &recall, index_rx, read_ahead))
            .map_err(&io)?
    };
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let proxy_state = options.proxy.as_ref().map(|proxy| {
        proxy::ProxyState::new(
            store.clone(),
            recall.clone(),
            engine.clone(),
            arrivals_tx.clone(),
            proxy,
            &info.model,
        )
    });
    let chunk_tokens = info.chunk_tokens;
    let state = api::AppState {
        store: store.clone(),
        engine: engine.clone(),
        stats: stats.clone(),
        info: Arc::new(info),
        arrivals: arrivals_tx.clone(),
        recall: recall.clone(),
        write_timeout: options.write_timeout,
        read_ahead: options.read_ahead,
        rerank: options.rerank,
    };
    let data_dir = store.path().to_path_buf();
    let result = runtime.block_on(async move {
        let forward = tokio::spawn(async move {
            while let Some(arrival) = appended_rx.recv().await {
                let _ = index_tx.send(arrival.stream.clone());
                let _ = scheduler_tx.send(arrival);
            }
        });
        let listeners = Listeners::bind(&socket, &options, proxy_state).await?;
        let (file_tx, file_rx) = mpsc::channel();
        let file_thread = {
            let tracker = Tracker::new(store.clone(), watches, arrivals_tx)?;
            let (stats, events) = (stats.clone(), file_tx.clone());
            let (settle, rescan) = (options.settle, options.rescan);
            std::thread::Builder::new()
                .name("memagent-files".into())
                .spawn(move || follow_files(tracker, events, file_rx, stats, settle, rescan))
                .map_err(io)?
        };
        let scheduler = scheduler::Scheduler {
            store: store.clone(),
            recall,
            engine,
            stats,
            idle: options.idle,
            standing: options
                .watches
                .iter()
                .filter(|w| !w.ask.is_empty())
                .cloned()
                .collect(),
            owner: options.name.clone(),
            lease: options.lease,
            fresh_bytes: (chunk_tokens * BYTES_PER_TOKEN) as u64,
        };
        let scheduler = tokio::spawn(scheduler.run(arrivals_rx, shutdown_rx.clone()));
        let servers = listeners.serve(api::router(state), &options, &shutdown_rx);
        tracing::info!("listening on {}", socket.display());

        let mut signals = Signals::new();
        signals.next().await;
        tracing::info!("stopping");
        let stop = async {
            let _ = shutdown_tx.send(true);
            let _ = file_tx.send(Msg::Stop);
            for server in servers {
                let _ = server.await;
            }
            // The step in flight, if any, is abandoned: its commit is atomic, so it is
            // simply done again at the next start.
            scheduler.abort();
            let _ = tokio::task::spawn_blocking(move || file_thread.join()).await;
            // The indexer ends when the last sender of appends is gone.
            forward.abort();
            let _ = forward.await;
            // The index is derived from the log and caught up at the next start: a
            // long catch-up (a big append) is not waited for past half the bound.
            let indexed = tokio::task::spawn_blocking(move || indexer.join());
            if tokio::time::timeout(options.stop_timeout / 2, indexed)
                .await
                .is_err()
            {
                tracing::info!("search index: still reading; it catches up at the next start");
            }
            let _ = std::fs::remove_file(&socket);
            let flushed = tokio::task::spawn_blocking(move || store.flush()).await;
            flushed.map_err(|e| Error::Stopping(e.to_string()))??;
            Ok(())
        };
        // Whatever the store is doing (a write stuck on a full or failing disk), the
        // daemon exits within the bound; what was acknowledged is already on disk.
        let stopped = tokio::select! {
            stopped = stop => stopped,
            () = tokio::time::sleep(options.stop_timeout) => exit_now(
                &data_dir,
                &format!("not stopped within {:.0} s", options.stop_timeout.as_secs_f64()),
            ),
            () = signals.next() => exit_now(&data_dir, "a second signal"),
        };
        if stopped.is_ok() {
            tracing::info!("stopped");
        }
        stopped
    });
    // Blocking threads still inside the store are not waited for.
    runtime.shutdown_timeout(std::time::Duration::ZERO);
    result
}

/// Ends the process at once, saying why, after removing the socket of `data_dir`;
/// nothing unacknowledged was promised.
fn exit_now(data_dir: &std::path::Path, why: &str) -> ! {
    let _ = std::fs::remove_file(socket_path(data_dir));
    tracing::error!(
        "{why}: exiting now; every acknowledged write is on disk, anything in flight was \
         not acknowledged"
    );
    std::process::exit(1)
}

/// SIGTERM and SIGINT, one after the other.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            term: signal(SignalKind::terminate()).expect("a SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("a SIGINT handler"),
        }
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
        }
    }
}

/// The daemon's listeners: the API's socket, the API on TCP and the proxy, as configured.
struct Listeners {
    unix: tokio::net::UnixListener,
    tcp: Option<(tokio::net::TcpListener, Arc<str>)>,
    proxy: Option<(tokio::net::TcpListener, axum::Router)>,
}

impl Listeners {
    async fn bind(
        socket: &std::path::Path,
        options: &DaemonOptions,
        proxy_state: Option<proxy::ProxyState>,
    ) -> Result<Self> {
        let unix = bind_socket(socket)?;
        let tcp = match &options.tcp {
            Some(tcp) => Some((
                bind_tcp(tcp.addr).await?,
                Arc::<str>::from(tcp.token.as_str()),
            )),
            None => None,
        };
        let proxy = match (&options.proxy, proxy_state) {
            (Some(proxy), Some(state)) => Some((
                bind_tcp(proxy.addr).await?,
                proxy::router(state, Arc::<str>::from(proxy.token.as_str())),
            )),
            _ => None,
        };
        Ok(Self { unix, tcp, proxy })
    }

    /// Serves the API on the socket (and TCP, behind its token) and the proxy, each until
    /// `stop` changes; the Unix socket's server comes first.
    fn serve(
        self,
        app: axum::Router,
        options: &DaemonOptions,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<std::io::Result<()>>> {
        let mut servers = vec![serve_until(self.unix, app.clone(), stop.clone())];
        if let Some((listener, token)) = self.tcp {
            tracing::info!(
                "API on http://{} (bearer token required)",
                listener.local_addr().map_or("?".into(), |a| a.to_string())
            );
            let app = app.layer(axum::middleware::from_fn_with_state(
                token,
                api::require_token,
            ));
            servers.push(serve_until(listener, app, stop.clone()));
        }
        if let Some((listener, app)) = self.proxy {
            tracing::info!(
                "OpenAI-compatible proxy on http://{}/v1 (bearer token required), {}",
                listener.local_addr().map_or("?".into(), |a| a.to_string()),
                match &options.proxy.as_ref().and_then(|p| p.upstream.clone()) {
                    Some(upstream) => format!("forwarding to {upstream}"),
                    None => "answering with the daemon's model".to_string(),
                }
            );
            servers.push(serve_until(listener, app, stop.clone()));
        }
        servers
    }
}

/// Serves `app` on `listener` until `stop` changes.
fn serve_until<L>(
    listener: L,
    app: axum::Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<()>>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.changed().await;
            })
            .await
    })
}

/// Bytes read in one go past which the memory freed after them is given back to the
/// system at once (the allocator would keep it for later, at the daemon's peak size).
pub(crate) const BIG_WORK: u64 = 1 << 20;

/// Returns freed heap memory to the system (glibc keeps it in its arenas otherwise).
pub(crate) fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory the allocator holds; it has no
    // preconditions and may be called from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bytes a token takes in English text, about: turns a chunk's tokens into the unread
/// bytes up to which a stream is leased as fresh.
pub(crate) const BYTES_PER_TOKEN: usize = 4;

/// How often the index of a daemon sharing its database catches up with appends made
/// through the others.
const SHARED_INDEX_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Every this many catch-ups the index of a shared database reads every stream's row
/// instead of the change feed: a write whose change number was taken before another's
/// can commit after it, past a feed that already read the later number.
const FULL_CATCH_UP_EVERY: u32 = 60;

/// Most passages of a stream offered to the engine to read ahead: those that fit in what
/// the model keeps are read (about 160 with the default model).
const READ_AHEAD_PASSAGES: usize = 512;

/// The indexer thread: catches the index up with every stream, then indexes each
/// stream named on `appended` (names that queue up while it works are read once); with
/// `read_ahead`, the newest passages of a stream that gained some go to the engine to
/// read ahead, and at start, when none did, the largest stream's. Errors are logged with
/// the stream and never stop it.
fn index_appends(
    store: &Store,
    recall: &Recall,
    appended: mpsc::Receiver<String>,
    read_ahead: Option<EngineHandle>,
) {
    let offer = |stream: &str, report: &memagent_recall::SyncReport| {
        if report.passages > 0 {
            read_ahead_latest(store, recall, read_ahead.as_ref(), stream);
        }
    };

    // The database's change number the index has caught up to (`None`: read every
    // stream next time).
    let mut mark: Option<u64> = None;
    let mut catch_ups = 0u32;
    match memagent_memory::sync_changes(store, recall, &mut mark) {
        Ok(done) => {
            for (stream, r) in &done {
                tracing::info!(
                    "search index: read {} bytes of `{stream}` into {} passages in {:.1}s",
                    r.bytes,
                    r.passages,
                    r.seconds
                );
                offer(stream, r);
            }
            // Nothing new: the largest stream is read ahead (a restart keeps nothing read).
            if read_ahead.is_some() && done.iter().all(|(_, r)| r.passages == 0) {
                let largest = store
                    .streams()
                    .ok()
                    .and_then(|streams| streams.into_iter().max_by_key(|s| s.log_len));
                if let Some(stream) = largest {
                    read_ahead_latest(store, recall, read_ahead.as_ref(), &stream.name);
                }
            }
        }
        Err(e) => tracing::error!("search index: catching up failed: {e}"),
    }
    give_back_freed_memory();
    loop {
        // A shared database: text appended through other daemons arrives unannounced;
        // every second without an append here, the index catches up with the streams
        // the database changed since the last time (and once a minute with every one).
        let first = match store.is_shared() {
            true => match appended.recv_timeout(SHARED_INDEX_POLL) {
                Ok(name) => name,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    catch_ups += 1;
                    if catch_ups.is_multiple_of(FULL_CATCH_UP_EVERY) {
                        mark = None;
                    }
                    match memagent_memory::sync_changes(store, recall, &mut mark) {
                        Ok(done) => {
                            for (stream, r) in done.iter().filter(|(_, r)| r.bytes > 0) {
                                tracing::debug!(
                                    "search index: `{stream}`: {} bytes appended elsewhere",
                                    r.bytes
                                );
                                offer(stream, r);
                            }
                        }
                        Err(e) => tracing::error!("search index: catching up failed: {e}"),
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
            false => match appended.recv() {
                Ok(name) => name,
                Err(_) => break,
            },
        };
        let mut names = vec![first];
        names.extend(appended.try_iter());
        names.sort();
        names.dedup();
        for name in names {
            let result = match store.stream(&name) {
                Ok(Some(stream)) => {
                    memagent_memory::sync_stream(store, recall, &stream, &mut |_| {})
                }
                Ok(None) => continue,
                Err(e) => Err(e.into()),
            };
            if result.as_ref().is_ok_and(|r| r.bytes >= BIG_WORK) {
                give_back_freed_memory();
            }
            match result {
                Ok(r) if r.passages > 0 => {
                    tracing::debug!(
                        "search index: `{name}`: {} bytes, {} passages in {:.2}s",
                        r.bytes,
                        r.passages,
                        r.seconds
                    );
                    offer(&name, &r);
                }
                Ok(_) => {}
                Err(e) => tracing::error!("search index: stream `{name}`: {e}"),
            }
        }
    }
}

/// Has `engine` read the newest passages of `stream` ahead (none without an engine).
fn read_ahead_latest(store: &Store, recall: &Recall, engine: Option<&EngineHandle>, stream: &str) {
    let Some(engine) = engine else {
        return;
    };
    let latest = store
        .stream(stream)
        .map_err(|e| e.to_string())
        .and_then(|s| s.ok_or_else(|| "removed".to_string()))
        .and_then(|s| {
            recall
                .latest_passages(s.id, READ_AHEAD_PASSAGES)
                .map_err(|e| e.to_string())
        });
    match latest {
        Ok(hits) if !hits.is_empty() => {
            engine.read_ahead(hits.into_iter().map(|h| h.text).collect());
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("reading `{stream}` ahead: {e}"),
    }
}

/// Binds the API socket, readable and writable by its owner only.
/// A TCP listener on `addr`; a failure names the address.
async fn bind_tcp(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Io {
            path: PathBuf::from(addr.to_string()),
            source,
        })
}

fn bind_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener> {
    // The caller holds the database lock, so a socket left here is stale.
    let _ = std::fs::remove_file(path);
    // SAFETY: umask only swaps the process's file-creation mask; no memory is involved.
    let old = unsafe { libc::umask(0o177) };
    let bound = tokio::net::UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(listener)
}

/// The file thread: registers the watches with notify, reconciles at start, then reads
/// each changed path once its events settle, and rescans everything periodically.
fn follow_files(
    mut tracker: Tracker,
    events: mpsc::Sender<Msg>,
    inbox: mpsc::Receiver<Msg>,
    stats: Arc<Mutex<Stats>>,
    settle: std::time::Duration,
    rescan: std::time::Duration,
) {
    let handler = {
        let events = events.clone();
        move |result: notify::Result<notify::Event>| match result {
            Ok(event) => {
                if event.need_rescan() {
                    let _ = events.send(Msg::Rescan);
                }
                let _ = events.send(Msg::Paths(event.paths));
            }
            Err(e) => {
                tracing::warn!("file events: {e}; rescanning");
                let _ = events.send(Msg::Rescan);
            }
        }
    };
    let mut watcher = match notify::RecommendedWatcher::new(
        handler,
        notify::Config::default().with_follow_symlinks(false),
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!(
                "cannot watch files ({e}); relying on rescans every {}s",
                rescan.as_secs()
            );
            None
        }
    };
    let mut registered: HashSet<PathBuf> = HashSet::new();
    let mut dirty: std::collections::HashMap<PathBuf, Instant> = Default::default();
    let mut next_scan = Instant::now();
    let started = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_scan {
            if let Some(w) = watcher.as_mut() {
                register(w, &tracker, &mut registered);
            }
            tracker.scan();
            let mut s = stats.lock().expect("stats");
            if s.scans == 0 {
                tracing::info!(
                    "start-up scan: {} files in {} watches, {:.2}s",
                    tracker.tracked(),
                    tracker.watches.len(),
                    started.elapsed().as_secs_f64()
                );
            }
            s.scans += 1;
            s.files = tracker.tracked();
            next_scan = Instant::now() + rescan;
        }
        let now = Instant::now();
        let wait = dirty
            .values()
            .map(|t| (*t + settle).saturating_duration_since(now))
            .min()
            .unwrap_or(rescan)
            .min(next_scan.saturating_duration_since(now));
        match inbox.recv_timeout(wait) {
            Ok(Msg::Paths(paths)) => {
                for path in paths {
                    // Settling counts from the first event, so that a file written
                    // without pause is still read every `settle`.
                    dirty.entry(path).or_insert_with(Instant::now);
                }
            }
            Ok(Msg::Rescan) => next_scan = Instant::now(),
            Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        let ready: Vec<PathBuf> = dirty
            .iter()
            .filter(|(_, t)| now.duration_since(**t) >= settle)
            .map(|(p, _)| p.clone())
            .collect();
        let mut roots_changed = false;
        for path in ready {
            dirty.remove(&path);
            roots_changed |= tracker.watches.iter().any(|w| w.config.path == path);
            tracker.sync_path(&path);
        }
        if roots_changed {
            if let Some(w) = watcher.as_mut() {
                register(w, &tracker, &mut registered);
            }
        }
        stats.lock().expect("stats").files = tracker.tracked();
    }
}

/// Registers each watch's root with notify (a file through its folder, so that atomic
/// saves that replace it are seen; a root that does not exist yet through its folder,
/// and itself once it appears).
fn register(
    watcher: &mut notify::RecommendedWatcher,
    tracker: &Tracker,
    registered: &mut HashSet<PathBuf>,
) {
    for watch in &tracker.watches {
        let root = &watch.config.path;
        let (target, mode) = match std::fs::metadata(root) {
            Ok(meta) if meta.is_dir() => (
                root.clone(),
                if watch.config.recursive {
                    RecursiveMode::Recursive
                } else {
                    RecursiveMode::NonRecursive
                },
            ),
            // A file, or a root that does not exist yet: its folder tells when it
            // appears or is replaced.
            _ => match root.parent().filter(|p| p.is_dir()) {
                Some(parent) => (parent.to_path_buf(), RecursiveMode::NonRecursive),
                None => continue,
            },
        };
        if registered.contains(&target) {
            continue;
        }
        match watcher.watch(&target, mode) {
            Ok(()) => {
                tracing::debug!("watching {}", target.display());
                registered.insert(target);
            }
            Err(e) => tracing::warn!(
                "{}: cannot watch it ({e}); rescans still read it",
                target.display()
            ),
        }
    }
}

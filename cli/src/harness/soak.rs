//! `memctl bench soak`: the daemon killed with SIGKILL at random moments, again and
//! again, while a chat log it watches grows by a line every 50 ms, the API appends and
//! searches, and the proxy relays chat requests to a loopback OpenAI-protocol server
//! (a stand-in for a served model); restarted by the bench each time. At the end:
//! every line of the chat log is in its stream's log byte for byte, every acknowledged
//! API append is there, each memory chain is continuous, the passage index equals one
//! rebuilt from the logs; with restart-to-ready and memory-lag percentiles.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use memagent_recall::Recall;
use memagent_store::{Store, StreamRecord, GENERAL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::bench::{echo_upstream, percentile};
use crate::cli::BenchSoakArgs;
use crate::commands::client::DaemonClient;
use crate::settings::Settings;

const TOKEN: &str = "memagent-soak";
/// The streams: the watched chat log's, the API's appends', the proxy's turns'.
const CHAT: &str = "chat";
const NOTES: &str = "notes";
const PROXIED: &str = "proxied";

/// The daemon as the bench runs it: a child process, restarted after each kill.
struct Soaked {
    command: Vec<std::ffi::OsString>,
    root: PathBuf,
    data: PathBuf,
    child: Option<Child>,
}

impl Soaked {
    /// Starts it and waits until its API answers: the seconds that took.
    fn spawn(&mut self) -> Result<f64> {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.root.join("daemon.log"))?;
        let started = Instant::now();
        let child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start the daemon")?;
        self.child = Some(child);
        let deadline = started + Duration::from_secs(120);
        loop {
            if DaemonClient::connect(&self.data).is_some() {
                return Ok(started.elapsed().as_secs_f64());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok()?) {
                bail!(
                    "the daemon exited ({status}) while starting{}",
                    self.log_tail()
                );
            }
            if Instant::now() > deadline {
                bail!("the daemon was not ready within 120 s{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then the seconds until it exited; fails past `within`.
    fn stop(&mut self, within: Duration) -> Result<f64> {
        let Some(mut child) = self.child.take() else {
            return Ok(0.0);
        };
        let started = Instant::now();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("the daemon stopped with {status}{}", self.log_tail());
                }
                return Ok(started.elapsed().as_secs_f64());
            }
            if started.elapsed() > within {
                let _ = child.kill();
                bail!(
                    "the daemon did not stop within {} s of SIGTERM{}",
                    within.as_secs(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Still running (not died on its own)?
    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The end of the daemon's log, for an error.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.root.join("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!(
            "; the end of its log ({}):\n{tail}",
            self.root.join("daemon.log").display()
        )
    }
}

impl Drop for Soaked {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// One line of the chat log: its message's rendered end in the stream's log, and when
/// it was written.
struct Written {
    end: u64,
    at: Instant,
}

/// What the chat-log writer wrote.
#[derive(Default)]
struct ChatLog {
    lines: Vec<Written>,
    /// The stream's log as it must be: each message rendered as the daemon renders it.
    rendered: Vec<u8>,
}

/// Appends a chat message to `file` every `pace` until `stop`, each line in two writes
/// cut at a random byte (a reader may find half a line, or half a character).
fn chat_writer(
    file: PathBuf,
    pace: Duration,
    seed: u64,
    log: Arc<Mutex<ChatLog>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut out = std::fs::File::options().append(true).open(&file)?;
        let mut next = Instant::now();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let name = ["Ada", "Ben"][i as usize % 2];
            let message = json!({
                "role": "user",
                "name": name,
                "content": format!(
                    "Entry {i}: the ferry left at {}:{:02}, calm water ✓",
                    6 + i % 12,
                    i % 60
                ),
                "timestamp": format!("2026-11-27 {:02}:{:02}", 8 + i / 3600 % 12, i / 60 % 60),
            });
            let line = format!("{message}\n");
            let cut = rng.random_range(0..line.len());
            out.write_all(&line.as_bytes()[..cut])?;
            out.write_all(&line.as_bytes()[cut..])?;
            let at = Instant::now();
            let turn = memagent_watcher::render_message(&message).map_err(anyhow::Error::msg)?;
            {
                let mut log = log.lock().expect("chat log");
                log.rendered.extend_from_slice(turn.as_bytes());
                log.rendered.push(b'\n');
                let end = log.rendered.len() as u64;
                log.lines.push(Written { end, at });
            }
            i += 1;
            // The writer's pace (a workload, not a wait on a condition).
            next += pace;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        Ok(())
    })
}

/// The API client's appends: each text, and whether the daemon acknowledged it.
#[derive(Default)]
struct ApiLog {
    appends: Vec<(String, bool)>,
    searches: usize,
    searches_failed: usize,
}

/// Appends a note to the `notes` stream through the API about every 100 ms, and
/// searches every stream every fifth time, until `stop`.
fn api_client(
    data: PathBuf,
    log: Arc<Mutex<ApiLog>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut client: Option<DaemonClient> = None;
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if client.is_none() {
                client = DaemonClient::connect(&data);
            }
            if let Some(c) = &client {
                let text = format!(
                    "API note {i}: the harbour master counted {} boats.\n",
                    i % 97
                );
                let acked = c
                    .post("/v1/append", &json!({"stream": NOTES, "text": text}))
                    .is_ok_and(|r| r["appended_bytes"].as_u64() == Some(text.len() as u64));
                log.lock().expect("api log").appends.push((text, acked));
                i += 1;
                if i.is_multiple_of(5) {
                    let found = c.post(
                        "/v1/search",
                        &json!({"text": "ferry calm water", "all": true, "k": 3}),
                    );
                    let mut log = log.lock().expect("api log");
                    match found {
                        Ok(_) => log.searches += 1,
                        Err(_) => log.searches_failed += 1,
                    }
                }
                if !acked {
                    client = None;
                }
            }
            // The client's pace (a workload, not a wait on a condition).
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Chat requests through the proxy about every 200 ms until `stop`: the request numbers
/// answered, and those that failed.
fn proxy_client(
    url: String,
    answered: Arc<Mutex<(Vec<u64>, usize)>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let body = json!({
                "model": "echo", "user": PROXIED,
                "messages": [{"role": "user", "content": proxy_question(i)}],
            });
            let ok = agent
                .post(&format!("{url}/chat/completions"))
                .header("Authorization", format!("Bearer {TOKEN}"))
                .send_json(&body)
                .is_ok_and(|r| r.status().is_success());
            let mut answered = answered.lock().expect("proxy log");
            match ok {
                true => answered.0.push(i),
                false => answered.1 += 1,
            }
            drop(answered);
            i += 1;
            // The client's pace (a workload, not a wait on a condition).
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

fn proxy_question(i: u64) -> String {
    format!("Question {i}: when did the ferry leave?")
}

/// Samples the chat stream's memory every 100 ms until `stop`: for each line, the
/// seconds from its write to the first memory version that read it.
fn lag_monitor(
    data: PathBuf,
    chat: Arc<Mutex<ChatLog>>,
    lags: Arc<Mutex<Vec<f64>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut client: Option<DaemonClient> = None;
        while !stop.load(Ordering::Relaxed) {
            if client.is_none() {
                client = DaemonClient::connect(&data);
            }
            let read = client
                .as_ref()
                .and_then(|c| c.get("/v1/status").ok())
                .and_then(|s| memory_read(&s, CHAT));
            match read {
                Some(read) => record_lags(&chat, &lags, read),
                None => client = None,
            }
            // The sampling interval.
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// The lag of each chat line memory has now read (its log through `read`) and whose
/// lag is not yet recorded: lines are read in order, so `lags[i]` is line `i`'s.
fn record_lags(chat: &Mutex<ChatLog>, lags: &Mutex<Vec<f64>>, read: u64) {
    let now = Instant::now();
    let chat = chat.lock().expect("chat log");
    let mut lags = lags.lock().expect("lags");
    while let Some(line) = chat.lines.get(lags.len()).filter(|l| l.end <= read) {
        lags.push(now.duration_since(line.at).as_secs_f64());
    }
}

/// Bytes of `stream`'s log its memory has read, from a status.
fn memory_read(status: &Value, stream: &str) -> Option<u64> {
    let row = status["streams"]
        .as_array()?
        .iter()
        .find(|r| r["stream"] == stream)?;
    Some(row["log_bytes"].as_u64()? - row["pending_bytes"].as_u64()?)
}

pub fn run(global: &Settings, args: &BenchSoakArgs) -> Result<()> {
    if args.min_up_ms > args.max_up_ms {
        bail!(
            "--min-up-ms {} is more than --max-up-ms {}",
            args.min_up_ms,
            args.max_up_ms
        );
    }
    let quiet = global.quiet || args.json;
    let say = |line: String| {
        if !quiet {
            eprintln!("{line}");
        }
    };
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("memagent-soak-{}", std::process::id())),
    };
    if root.exists() {
        std::fs::remove_dir_all(&root)
            .with_context(|| format!("cannot clear {}", root.display()))?;
    }
    std::fs::create_dir_all(root.join("chat"))
        .with_context(|| format!("cannot create {}", root.display()))?;
    let data = root.join("data");
    let chat_file = root.join("chat").join("chat.jsonl");
    std::fs::write(&chat_file, "")?;
    let (upstream, _upstream_runtime) = echo_upstream()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = root.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[watch]]\npath = \"{}\"\nstream = \"{CHAT}\"\n\n[proxy]\nlisten = \"127.0.0.1:{port}\"\n\
             token = \"{TOKEN}\"\nupstream = \"{upstream}\"\n",
            chat_file.display()
        ),
    )?;
    let embedder = crate::commands::recall::load_embedder(global)?;
    let mut command: Vec<std::ffi::OsString> = vec![
        std::env::current_exe()?.into(),
        "--model".into(),
        global.model_path()?.into(),
        "--embedder".into(),
        match global.embedder_dir()? {
            Some(dir) => dir.into(),
            None => "none".into(),
        },
        "--config".into(),
        config.into(),
        "--data-dir".into(),
        data.clone().into(),
        "daemon".into(),
        "run".into(),
        "--idle-seconds".into(),
        args.idle_seconds.to_string().into(),
    ];
    for (flag, value) in [
        ("--chunk-tokens", args.chunk_tokens),
        ("--memory-tokens", args.memory_tokens),
    ] {
        if let Some(v) = value {
            command.extend([flag.into(), v.to_string().into()]);
        }
    }
    let mut daemon = Soaked {
        command,
        root: root.clone(),
        data: data.clone(),
        child: None,
    };
    let first_start = daemon.spawn()?;
    say(format!(
        "daemon ready in {first_start:.2} s; {} kills, a chat line every {} ms (data in {})",
        args.kills,
        args.interval_ms,
        root.display()
    ));

    let stop = Arc::new(AtomicBool::new(false));
    let chat = Arc::new(Mutex::new(ChatLog::default()));
    let api = Arc::new(Mutex::new(ApiLog::default()));
    let proxied = Arc::new(Mutex::new((Vec::new(), 0usize)));
    let lags = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let writer = chat_writer(
        chat_file.clone(),
        Duration::from_millis(args.interval_ms),
        args.seed,
        chat.clone(),
        stop.clone(),
    );
    let clients = [
        api_client(data.clone(), api.clone(), stop.clone()),
        proxy_client(
            format!("http://127.0.0.1:{port}/v1"),
            proxied.clone(),
            stop.clone(),
        ),
        lag_monitor(data.clone(), chat.clone(), lags.clone(), stop.clone()),
    ];

    let mut rng = StdRng::seed_from_u64(args.seed ^ 0x50a4);
    let mut restarts = Vec::new();
    for kill in 1..=args.kills {
        let up = Duration::from_millis(rng.random_range(args.min_up_ms..=args.max_up_ms));
        let since = Instant::now();
        while since.elapsed() < up {
            if !daemon.running() {
                stop.store(true, Ordering::Relaxed);
                bail!(
                    "the daemon died on its own before kill {kill}{}",
                    daemon.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon.kill()?;
        let ready = daemon.spawn()?;
        restarts.push(ready);
        let (lines, behind) = {
            let chat = chat.lock().expect("chat log");
            let read = lags.lock().expect("lags").len();
            (
                chat.lines.len(),
                chat.lines.len() - read.min(chat.lines.len()),
            )
        };
        say(format!(
            "kill {kill}/{}: after {:.2} s up; ready again in {ready:.2} s; {lines} chat lines \
             written, {behind} not yet in memory",
            args.kills,
            up.as_secs_f64()
        ));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the chat writer")?;
    for client in clients {
        client.join().expect("a client");
    }
    let soak_seconds = started.elapsed().as_secs_f64();

    // Drain: the daemon reads what is left, into memory and into the index.
    let expected_chat = chat.lock().expect("chat log").rendered.clone();
    let drain_started = Instant::now();
    let client = DaemonClient::connect(&data).context("the daemon does not answer")?;
    let drain_deadline = drain_started + Duration::from_secs_f64(args.drain_seconds);
    let lag_lines_before = lags.lock().expect("lags").len();
    let drained = loop {
        let status = client.get("/v1/status")?;
        let rows = status["streams"].as_array().cloned().unwrap_or_default();
        let chat_row = rows.iter().find(|r| r["stream"] == CHAT);
        let chat_complete =
            chat_row.is_some_and(|r| r["log_bytes"].as_u64() == Some(expected_chat.len() as u64));
        let indexed = chat_complete && rows.iter().all(|r| r["index_lag_bytes"] == 0);
        let drained = indexed && rows.iter().all(|r| r["pending_bytes"] == 0);
        if let Some(read) = memory_read(&status, CHAT) {
            record_lags(&chat, &lags, read);
        }
        if drained || (indexed && Instant::now() > drain_deadline) {
            break drained;
        }
        if Instant::now() > drain_deadline + Duration::from_secs(120) {
            bail!(
                "the daemon had not read the whole chat log ({} bytes) into its log and index \
                 {:.0} s after the writers stopped{}",
                expected_chat.len(),
                drain_started.elapsed().as_secs_f64(),
                daemon.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let drain_seconds = drain_started.elapsed().as_secs_f64();
    let stop_seconds = daemon.stop(Duration::from_secs(30))?;
    say(format!(
        "drained in {drain_seconds:.1} s (memory {}); stopped by SIGTERM in {stop_seconds:.2} s",
        if drained { "caught up" } else { "still behind" }
    ));

    // The checks, on the data directory as the daemon left it.
    let store = Store::open(&data)?;
    let chat_stream = store.require(CHAT)?;
    let chat_log = store.read_log(&chat_stream, 0, chat_stream.log_len)?;
    let lines_written = chat.lock().expect("chat log").lines.len();
    let chat_lines_logged = chat_log.iter().filter(|&&b| b == b'\n').count();
    if chat_log != expected_chat {
        let same = chat_log
            .iter()
            .zip(&expected_chat)
            .take_while(|(a, b)| a == b)
            .count();
        bail!(
            "the chat stream's log differs from the chat log's messages from byte {same}: {} \
             bytes logged, {} expected ({chat_lines_logged} lines of {lines_written})",
            chat_log.len(),
            expected_chat.len()
        );
    }
    let api = api.lock().expect("api log");
    let api_check = check_appends(&store, &api.appends)?;
    let proxied = proxied.lock().expect("proxy log");
    let proxy_check = check_proxied(&store, &proxied.0)?;
    let mut chains = Vec::new();
    for name in [CHAT, NOTES, PROXIED] {
        if let Some(stream) = store.stream(name)? {
            chains.push(check_chain(&store, &stream)?);
        }
    }
    let index = check_index(&store, &root, embedder.is_some())?;
    let lags = lags.lock().expect("lags").clone();
    let report = json!({
        "cpu": memagent_engine::bench::cpu_name(),
        "machine": memagent_engine::bench::machine(),
        "kills": args.kills,
        "seconds": soak_seconds,
        "interval_ms": args.interval_ms,
        "chat": {
            "lines_written": lines_written,
            "lines_logged": chat_lines_logged,
            "lines_lost": lines_written - chat_lines_logged.min(lines_written),
            "log_bytes": chat_log.len(),
        },
        "api": api_check,
        "searches": {"answered": api.searches, "failed": api.searches_failed},
        "proxy": proxy_check,
        "proxy_failed": proxied.1,
        "restart_seconds": {
            "first": first_start,
            "p50": percentile(&restarts, 0.5),
            "p99": percentile(&restarts, 0.99),
            "max": restarts.iter().copied().fold(0.0, f64::max),
        },
        "memory_lag_seconds": {
            "lines": lags.len(),
            "p50": percentile(&lags, 0.5),
            "p99": percentile(&lags, 0.99),
            "max": lags.iter().copied().fold(0.0, f64::max),
            "read_while_draining": lags.len() - lag_lines_before.min(lags.len()),
            "lines_unread": lines_written - lags.len().min(lines_written),
        },
        "drain_seconds": drain_seconds,
        "memory_caught_up": drained,
        "stop_seconds": stop_seconds,
        "chains": chains,
        "index": index,
        "data": root.display().to_string(),
    });
    if !args.keep {
        drop(store);
        let _ = std::fs::remove_dir_all(&root);
    }
    if args.json {
        return crate::commands::print_json(&report);
    }
    print_report(&report)
}

/// The API stream's log against the appends: the stored ones in the order sent, byte
/// for byte, and every acknowledged one among them.
fn check_appends(store: &Store, appends: &[(String, bool)]) -> Result<Value> {
    let log = match store.stream(NOTES)? {
        Some(s) => store.read_log(&s, 0, s.log_len)?,
        None => Vec::new(),
    };
    let log = String::from_utf8(log).context("the notes stream's log is not UTF-8")?;
    let mut rest = log.as_str();
    let (mut stored, mut unacknowledged_stored) = (0, 0);
    for (i, (text, acked)) in appends.iter().enumerate() {
        if let Some(after) = rest.strip_prefix(text.as_str()) {
            rest = after;
            stored += 1;
            if !acked {
                unacknowledged_stored += 1;
            }
        } else if *acked {
            bail!(
                "acknowledged API append {i} ({:?}) is not in the notes stream's log where it \
                 belongs (the log goes on with {:?})",
                text.trim_end(),
                rest.lines().next().unwrap_or("")
            );
        }
    }
    if !rest.is_empty() {
        bail!(
            "the notes stream's log holds text no append sent: {:?}",
            rest.lines().next().unwrap_or("")
        );
    }
    let acknowledged = appends.iter().filter(|a| a.1).count();
    Ok(json!({
        "appends": appends.len(),
        "acknowledged": acknowledged,
        "stored": stored,
        "acknowledged_lost": 0,
        "stored_without_acknowledgement": unacknowledged_stored,
    }))
}

/// The proxy stream's log: whole turns (question and echoed reply), each of a request
/// sent, in order, none twice. A reply goes back before its turns are stored, so a kill
/// between the two leaves a request answered and not stored: counted, not an error.
fn check_proxied(store: &Store, answered: &[u64]) -> Result<Value> {
    let log = match store.stream(PROXIED)? {
        Some(s) => store.read_log(&s, 0, s.log_len)?,
        None => Vec::new(),
    };
    let log = String::from_utf8(log).context("the proxied stream's log is not UTF-8")?;
    let lines: Vec<&str> = log.lines().collect();
    if !lines.len().is_multiple_of(2) {
        bail!(
            "the proxied stream's log ends inside a turn: {} lines",
            lines.len()
        );
    }
    let mut last: Option<u64> = None;
    let mut stored = Vec::new();
    for pair in lines.chunks(2) {
        let question = pair[0]
            .strip_prefix("user: Question ")
            .and_then(|q| q.split(':').next())
            .and_then(|n| n.parse::<u64>().ok())
            .with_context(|| format!("the proxied stream's log holds {:?}", pair[0]))?;
        let asked = proxy_question(question);
        if pair[0] != format!("user: {asked}") || pair[1] != format!("assistant: {asked}") {
            bail!("the proxied stream's log holds a broken turn: {pair:?}");
        }
        if last.is_some_and(|l| question <= l) {
            bail!("request {question}'s turn is stored twice or out of order");
        }
        last = Some(question);
        stored.push(question);
    }
    let answered_stored = answered.iter().filter(|q| stored.contains(q)).count();
    Ok(json!({
        "answered": answered.len(),
        "turns_stored": stored.len(),
        "answered_not_stored": answered.len() - answered_stored,
    }))
}

/// A stream's memory: one version per chunk, parents consecutive, chunks contiguous from
/// the log's start, none read twice.
fn check_chain(store: &Store, stream: &StreamRecord) -> Result<Value> {
    let name = &stream.name;
    let chunks = store.chunks(stream)?;
    let versions = store.versions(stream, GENERAL)?;
    if versions.len() != chunks.len() {
        bail!(
            "`{name}`: {} memory versions for {} chunks",
            versions.len(),
            chunks.len()
        );
    }
    let mut offset = 0;
    for (i, (chunk, version)) in chunks.iter().zip(&versions).enumerate() {
        let i = i as u64;
        if chunk.index != i || chunk.start != offset || chunk.end <= chunk.start {
            bail!(
                "`{name}`: chunk {i} is {}..{} (index {}), the one before ended at {offset}",
                chunk.start,
                chunk.end,
                chunk.index
            );
        }
        offset = chunk.end;
        if version.version != i + 1
            || version.parent != (i > 0).then_some(i)
            || version.chunk != Some(i)
        {
            bail!(
                "`{name}`: version {} (parent {:?}, chunk {:?}) breaks the chain at {}",
                version.version,
                version.parent,
                version.chunk,
                i + 1
            );
        }
    }
    if offset > stream.log_len {
        bail!(
            "`{name}`: memory read to {offset}, past the log's {} bytes",
            stream.log_len
        );
    }
    Ok(json!({
        "stream": name,
        "log_bytes": stream.log_len,
        "versions": versions.len(),
        "read_bytes": offset,
        "continuous": true,
    }))
}

/// The daemon's passage index against one rebuilt from the logs into a fresh folder:
/// the same passages (range, text, source, line, time) for every stream.
fn check_index(store: &Store, root: &Path, embedded: bool) -> Result<Value> {
    let live = Recall::open(&memagent_memory::index_dir(store.path()), None)?;
    let rebuilt = Recall::open(&root.join("rebuilt-index"), None)?;
    let mut streams = Vec::new();
    for stream in store.streams()? {
        let state = live.stream_state(stream.id);
        if state.len != stream.log_len {
            bail!(
                "the index read {} bytes of `{}`, whose log has {}",
                state.len,
                stream.name,
                stream.log_len
            );
        }
        memagent_memory::sync_stream(store, &rebuilt, &stream, &mut |_| {})?;
        let (a, b) = (live.passages(stream.id)?, rebuilt.passages(stream.id)?);
        if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
            bail!(
                "`{}`: the index holds passage {}..{} {:?} where a rebuild holds {}..{} {:?}",
                stream.name,
                x.start,
                x.end,
                x.text,
                y.start,
                y.end,
                y.text
            );
        }
        if a.len() != b.len() {
            bail!(
                "`{}`: the index holds {} passages, a rebuild {}",
                stream.name,
                a.len(),
                b.len()
            );
        }
        streams.push(json!({"stream": stream.name, "passages": a.len()}));
    }
    Ok(json!({
        "equal_to_rebuild": true,
        "compared": "passages: byte range, text, source, line, time",
        "embedded": embedded,
        "streams": streams,
    }))
}

fn print_report(r: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    writeln!(out, "machine: {}", memagent_engine::bench::machine())?;
    writeln!(
        out,
        "{} SIGKILLs over {:.0} s ({}); restart to ready p50 {:.2} s, p99 {:.2} s",
        r["kills"],
        f(&r["seconds"]),
        r["cpu"].as_str().unwrap_or("unknown CPU"),
        f(&r["restart_seconds"]["p50"]),
        f(&r["restart_seconds"]["p99"]),
    )?;
    writeln!(
        out,
        "chat log: {} lines written, {} in the stream's log byte for byte, {} lost",
        r["chat"]["lines_written"], r["chat"]["lines_logged"], r["chat"]["lines_lost"],
    )?;
    writeln!(
        out,
        "API: {} appends, {} acknowledged, every acknowledged one stored ({} stored in all); \
         {} searches answered, {} failed while the daemon was down",
        r["api"]["appends"],
        r["api"]["acknowledged"],
        r["api"]["stored"],
        r["searches"]["answered"],
        r["searches"]["failed"],
    )?;
    writeln!(
        out,
        "proxy: {} requests answered ({} failed while down), {} turns stored whole, {} \
         answered but killed before storing",
        r["proxy"]["answered"],
        r["proxy_failed"],
        r["proxy"]["turns_stored"],
        r["proxy"]["answered_not_stored"],
    )?;
    writeln!(
        out,
        "memory lag (a chat line written to the memory version that read it): p50 {:.1} s, \
         p99 {:.1} s, max {:.1} s over {} lines ({} not yet read); drained in {:.1} s{}",
        f(&r["memory_lag_seconds"]["p50"]),
        f(&r["memory_lag_seconds"]["p99"]),
        f(&r["memory_lag_seconds"]["max"]),
        r["memory_lag_seconds"]["lines"],
        r["memory_lag_seconds"]["lines_unread"],
        f(&r["drain_seconds"]),
        if r["memory_caught_up"] == true {
            ""
        } else {
            " (memory still behind at --drain-seconds)"
        },
    )?;
    for c in r["chains"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "memory chain `{}`: {} versions, continuous, {} of {} bytes read",
            c["stream"].as_str().unwrap_or(""),
            c["versions"],
            c["read_bytes"],
            c["log_bytes"],
        )?;
    }
    let passages: u64 = r["index"]["streams"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["passages"].as_u64())
        .sum();
    writeln!(
        out,
        "index: {passages} passages, equal to a rebuild from the logs; SIGTERM stopped the \
         daemon in {:.2} s",
        f(&r["stop_seconds"]),
    )?;
    Ok(())
}

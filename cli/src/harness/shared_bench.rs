//! `memctl bench shared`: the ceiling of many daemons sharing one PostgreSQL database.
//! For each number of daemons, a fresh database gets the same streams of text, the
//! daemons (child processes, each with a data directory of its own) read them under
//! leases, and the memory steps per second until every stream is read are reported.
//!
//! By default the model is a loopback stand-in that answers every request at once with
//! the same short memory, so the figure is the store's and the leases', not a model's;
//! `--upstream` points the daemons at a served model instead (llama-server with
//! parallel slots, vLLM).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use memagent_store::Store;

use crate::cli::BenchSharedArgs;
use crate::commands::client::DaemonClient;
use crate::settings::Settings;

/// The stand-in's memory, whatever it is asked.
const STAND_IN_MEMORY: &str = "Shelves and the lamps each holds are noted in the log.";

/// How long a run may go without a stream read before the bench gives up on it.
const STALL_LIMIT: Duration = Duration::from_secs(60);

/// One daemon of a run, killed when dropped.
struct Child {
    process: std::process::Child,
    client: DaemonClient,
    log: PathBuf,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

pub fn run(global: &Settings, args: &BenchSharedArgs) -> Result<()> {
    if args.daemons.is_empty() || args.daemons.contains(&0) {
        bail!("--daemons takes counts of one or more, e.g. --daemons 1,2,3");
    }
    if args.streams == 0 || args.chunks == 0 || args.chunk_tokens == 0 {
        bail!("--streams, --chunks and --chunk-tokens take one or more: with none there is no step to time");
    }
    let Some(server) = global.database()? else {
        bail!(
            "bench shared needs a PostgreSQL server: pass --database postgres://user@host:port/db \
             (each run creates a database of its own there and drops it after)"
        );
    };
    let (tokenizer, model) = crate::commands::tokenize::tokenizer(global)?;
    let text = texts(&tokenizer, args)?;
    let (upstream, _stand_in) = match &args.upstream {
        Some(url) => (url.clone(), None),
        None => {
            let (url, runtime) = super::bench::loopback_upstream(|_| STAND_IN_MEMORY.to_string())?;
            (url, Some(runtime))
        }
    };
    let root = std::env::temp_dir().join(format!("memagent-bench-shared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut runs = Vec::new();
    for &daemons in &args.daemons {
        let name = format!("memagent_bench_shared_{}_{daemons}", std::process::id());
        let url = memagent_store::postgres::fresh_database(&server, &name)?;
        let measured = run_once(args, &model, &upstream, &url, &text, daemons, &root);
        let dropped = memagent_store::postgres::drop_database(&server, &name);
        let run = measured?;
        dropped?;
        if !global.quiet {
            eprintln!(
                "{daemons} daemon(s): {} steps in {:.2} s, {:.1} steps/s",
                run["steps"],
                run["seconds"].as_f64().unwrap_or(f64::NAN),
                run["steps_per_second"].as_f64().unwrap_or(f64::NAN)
            );
        }
        runs.push(run);
    }
    let _ = std::fs::remove_dir_all(&root);
    let one = runs
        .iter()
        .find(|r| r["daemons"] == 1)
        .and_then(|r| r["steps_per_second"].as_f64());
    for run in &mut runs {
        if let (Some(one), Some(rate)) = (one, run["steps_per_second"].as_f64()) {
            run["over_one"] = (rate / one).into();
        }
    }
    let result = serde_json::json!({
        "cpu": memagent_engine::bench::cpu_name(),
        "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "machine": memagent_engine::bench::machine(),
        "model": match &args.upstream {
            Some(url) => format!("served at {url}"),
            None => "a loopback stand-in answering at once".to_string(),
        },
        "streams": args.streams,
        "chunks_per_stream": args.chunks,
        "chunk_tokens": args.chunk_tokens,
        "lease_seconds": args.lease_seconds,
        "runs": runs,
    });
    if args.json {
        return crate::commands::print_json(&result);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} streams of {} chunks of {} tokens; model: {}\nmachine: {}",
        args.streams,
        args.chunks,
        args.chunk_tokens,
        result["model"].as_str().unwrap_or("?"),
        memagent_engine::bench::machine(),
    )?;
    writeln!(
        out,
        "{:>7} {:>7} {:>9} {:>9} {:>8} {:>7}  steps by daemon",
        "daemons", "steps", "seconds", "steps/s", "x one", "fenced"
    )?;
    for run in result["runs"].as_array().into_iter().flatten() {
        let by: Vec<String> = run["steps_by_daemon"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n.to_string())
            .collect();
        writeln!(
            out,
            "{:>7} {:>7} {:>9.2} {:>9.1} {:>8} {:>7}  {}",
            run["daemons"].to_string(),
            run["steps"].to_string(),
            run["seconds"].as_f64().unwrap_or(f64::NAN),
            run["steps_per_second"].as_f64().unwrap_or(f64::NAN),
            run["over_one"]
                .as_f64()
                .map_or("-".to_string(), |x| format!("{x:.2}")),
            run["fenced"].to_string(),
            by.join(" "),
        )?;
    }
    Ok(())
}

/// Each stream's text: numbered lines of about `chunks` whole chunks of
/// `chunk_tokens` tokens (bytes per token measured with the daemons' tokenizer).
fn texts(tokenizer: &memagent_engine::Tokenizer, args: &BenchSharedArgs) -> Result<Vec<String>> {
    let line =
        |i: usize, j: usize| format!("Stream {i} note {j}: shelf {j} holds {} lamps.\n", i * j);
    let sample: String = (0..200).map(|j| line(1, j)).collect();
    let tokens = tokenizer.encode(&sample, false)?.len().max(1);
    let bytes = args.chunks * args.chunk_tokens * sample.len() / tokens;
    Ok((0..args.streams)
        .map(|i| {
            let mut text = String::new();
            let mut j = 0;
            while text.len() < bytes {
                text.push_str(&line(i, j));
                j += 1;
            }
            text
        })
        .collect())
}

/// One run: `daemons` daemons on the database at `url`, the streams appended once they
/// all answer; the steps, the seconds from the first append until every stream is read,
/// and each daemon's share.
fn run_once(
    args: &BenchSharedArgs,
    model: &Path,
    upstream: &str,
    url: &str,
    text: &[String],
    daemons: usize,
    root: &Path,
) -> Result<serde_json::Value> {
    let dir = root.join(format!("{daemons}"));
    std::fs::create_dir_all(&dir)?;
    let mut children = Vec::new();
    for i in 0..daemons {
        children.push(start_daemon(args, model, upstream, url, &dir, i)?);
    }
    let store = Store::open_with(&dir.join("appender"), Some(url))?;
    let started = Instant::now();
    for (i, text) in text.iter().enumerate() {
        store.append(&format!("s{i:04}"), text.as_bytes(), None)?;
    }
    let (mut left, mut progressed) = (usize::MAX, Instant::now());
    loop {
        let unread = store.unread()?.len();
        if unread == 0 {
            break;
        }
        if unread < left {
            (left, progressed) = (unread, Instant::now());
        }
        if progressed.elapsed() > STALL_LIMIT {
            let last_error = children.iter().find_map(|c| {
                let log = std::fs::read_to_string(&c.log).ok()?;
                log.lines()
                    .rev()
                    .find(|l| l.contains("ERROR"))
                    .map(str::to_string)
            });
            bail!(
                "{unread} streams left unread and none read for {} s; the daemons' logs are \
                 in {}{}",
                STALL_LIMIT.as_secs(),
                dir.display(),
                last_error.map_or(String::new(), |e| format!("; the last error: {e}"))
            );
        }
        for child in &mut children {
            if let Some(status) = child.process.try_wait()? {
                bail!(
                    "a daemon stopped ({status}); see its log, {}",
                    child.log.display()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut steps = 0;
    for stream in store.streams()? {
        steps += store.cursor(&stream, memagent_store::GENERAL)?.version;
    }
    let mut by_daemon = Vec::new();
    for child in &children {
        let status = child.client.get("/v1/status")?;
        let stepped: u64 = status["streams"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["steps"].as_u64())
            .sum();
        by_daemon.push(stepped);
    }
    drop(children);
    let mut fenced = 0;
    for i in 0..daemons {
        let log = std::fs::read_to_string(dir.join(format!("d{i}.log"))).unwrap_or_default();
        fenced += log
            .lines()
            .filter(|l| l.contains("was not committed"))
            .count();
    }
    drop(store);
    Ok(serde_json::json!({
        "daemons": daemons,
        "steps": steps,
        "seconds": seconds,
        "steps_per_second": steps as f64 / seconds,
        "steps_by_daemon": by_daemon,
        "fenced": fenced,
    }))
}

/// Daemon `i` of a run, answering on its socket.
fn start_daemon(
    args: &BenchSharedArgs,
    model: &Path,
    upstream: &str,
    url: &str,
    dir: &Path,
    i: usize,
) -> Result<Child> {
    let data = dir.join(format!("d{i}"));
    let log = dir.join(format!("d{i}.log"));
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command
        // Chunks cut with --tokenizer, else the model file's (set --model to the served
        // model's).
        .arg("--tokenizer")
        .arg(model)
        .args(["--database", url, "--embedder", "none", "--data-dir"])
        .arg(&data)
        .args(["daemon", "run", "--name", &format!("d{i}")])
        .args(["--lease-seconds", &args.lease_seconds.to_string()])
        .args([
            "--profile",
            "small",
            "--idle-seconds",
            "0.2",
            "--memory-tokens",
            "32",
        ])
        .args(["--chunk-tokens", &args.chunk_tokens.to_string()])
        .args(["--backend", "openai", "--base-url", upstream])
        .args(["--context-tokens", "4096"]);
    command.args([
        "--remote-model",
        args.remote_model.as_deref().unwrap_or("stand-in"),
    ]);
    let mut process = command
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("cannot start a daemon")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let client = loop {
        if let Some(client) = DaemonClient::connect(&data) {
            break client;
        }
        let stopped = process.try_wait()?;
        if stopped.is_some() || Instant::now() > deadline {
            let _ = process.kill();
            let _ = process.wait();
            bail!(
                "daemon d{i} did not answer{}; see {}",
                stopped.map_or(String::new(), |s| format!(" ({s})")),
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(Child {
        process,
        client,
        log,
    })
}

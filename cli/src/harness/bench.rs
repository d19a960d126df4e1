use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use memagent_agent::{MemoryAgent, REPEAT_GUARD_TOKENS, UPDATE};
use memagent_engine::bench::{
    bench_batch, bench_decode, bench_decode_batch, bench_prefill, bench_projections, bench_rewrite,
    bench_stacked_prefill, BenchResult, RewriteWork,
};
use memagent_tasks::{single_needle, Haystack, NeedleSample};
use serde::Serialize;

use crate::cli::{
    BenchDaemonArgs, BenchEngineArgs, BenchNeedleArgs, BenchProxyArgs, BenchStoreArgs,
};
use crate::settings::Settings;

/// Sentences cycled to make benchmark prompts of any length (content does not affect speed).
const FILLER: &str = "The grass is green. The sky is blue. The sun is yellow. Here we go. \
There and back again. A long memory is a list of small facts, kept in order and rewritten \
as new text arrives. Numbers such as 1234 and 56.78 appear now and then. ";

pub fn engine(global: &Settings, args: &BenchEngineArgs) -> Result<()> {
    let model = crate::commands::load_model(global)?;
    let longest = args.prefill.iter().copied().max().unwrap_or(0);
    if longest > model.context_length() {
        anyhow::bail!(
            "prefill size {longest} exceeds the model's context of {} tokens",
            model.context_length()
        );
    }
    let unit = model.tokenizer().encode(FILLER, false)?;
    let stacked = args.stacked.0.map_or(0, |(n, t)| n + t);
    let filler: Vec<u32> = unit
        .iter()
        .copied()
        .cycle()
        .take(longest.max(stacked))
        .collect();
    let mut results: Vec<BenchResult> = Vec::new();
    for &n in args.prefill.iter().filter(|&&n| n > 0) {
        let r =
            bench_prefill(&model, &filler, n, args.repeats).with_context(|| format!("pp{n}"))?;
        report_progress(&r);
        results.push(r);
    }
    if let Some((n, tokens)) = args.stacked.0 {
        match bench_stacked_prefill(&model, &filler, n, tokens, args.repeats)
            .with_context(|| format!("pp{tokens}x{n}"))?
        {
            Some((alone, together)) => {
                report_progress(&alone);
                report_progress(&together);
                results.push(alone);
                results.push(together);
            }
            None => eprintln!(
                "pp{tokens}x{n}: skipped: this model's prefill products are not row-exact \
                 here (a GPU, or no integer kernel for every type of its projections), so \
                 prompts prefill one at a time"
            ),
        }
    }
    for &rows in args.projections.iter().filter(|&&rows| rows > 0) {
        let r = bench_projections(&model, rows, args.repeats)?;
        report_progress(&r);
        results.push(r);
    }
    if args.decode > 0 {
        results.extend(decode_results(&model, args, &unit)?);
    }
    results.extend(rewrite_results(&model, args)?);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        return crate::commands::print_json(&serde_json::json!({
            "model": model.path(),
            "device": global.device,
            "threads": threads,
            "machine": memagent_engine::bench::machine(),
            "decode_tuning": model.decode_tuning(),
            "results": results,
        }));
    }
    print_engine_table(global, &model, args, &results, threads)
}

/// One sequence's decoding (`tg`), then a batch of them checked against it.
fn decode_results(
    model: &memagent_engine::LocalModel,
    args: &BenchEngineArgs,
    unit: &[u32],
) -> Result<Vec<BenchResult>> {
    let mut results = Vec::new();
    let (r, alone) = bench_decode(model, unit[0], args.decode, args.repeats)?;
    report_progress(&r);
    results.push(r);
    if args.batch > 1 && !model.exact_rows() {
        // A GPU's products differ in their last bits with the row count, so the
        // daemon decodes one sequence at a time there: a batch would measure a
        // decoding the product never uses.
        tracing::warn!(
            "tg{}x{}: skipped: batched rows are exact only on the CPU's kernels; on \
             this device sequences decode one at a time",
            args.decode,
            args.batch
        );
    } else if args.batch > 1 {
        // Sequence 0 starts as the one-sequence case did; the others from the
        // filler's next tokens.
        let starts: Vec<u32> = unit.iter().copied().cycle().take(args.batch).collect();
        let (r, together) = bench_decode_batch(model, &starts, args.decode, args.repeats)?;
        anyhow::ensure!(
            together[0] == alone,
            "{}: sequence 0 decoded differently in a batch: the batch is not exact; \
             please report this",
            r.test
        );
        report_progress(&r);
        results.push(r);
    }
    Ok(results)
}

/// Memory rewrites (`rw`), plain and drafted, checked to agree; then a batch of them
/// against the same rewrites alone (`bw`).
fn rewrite_results(
    model: &memagent_engine::LocalModel,
    args: &BenchEngineArgs,
) -> Result<Vec<BenchResult>> {
    let mut results = Vec::new();
    let fill = |memory: &str, chunk: &str| {
        UPDATE.fill("What does the text say about libraries?", memory, chunk)
    };
    let work = RewriteWork {
        filler: FILLER,
        fill: &fill,
        repeat_guard: REPEAT_GUARD_TOKENS,
    };
    for &m in args.rewrite.iter().filter(|&&m| m > 0) {
        let (plain, want) = bench_rewrite(model, &work, m, 256, 0, args.repeats)?;
        report_progress(&plain);
        let (drafted, got) =
            bench_rewrite(model, &work, m, 256, args.draft_tokens.max(1), args.repeats)?;
        report_progress(&drafted);
        anyhow::ensure!(
            want == got,
            "rw{m}: speculative decoding changed the output ({} vs {} tokens); please report this",
            got.len(),
            want.len()
        );
        results.push(plain);
        results.push(drafted);
    }
    if args.batch > 1 {
        let (alone, together) = bench_batch(model, &work, args.batch, 128, 256, args.draft_tokens)
            .with_context(|| format!("bw{}", args.batch))?;
        report_progress(&alone);
        report_progress(&together);
        results.push(alone);
        results.push(together);
    }
    Ok(results)
}

/// The table `bench engine` prints without `--json`.
fn print_engine_table(
    global: &Settings,
    model: &memagent_engine::LocalModel,
    args: &BenchEngineArgs,
    results: &[BenchResult],
    threads: usize,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "model: {}  device: {}  threads: {threads}  repeats: {}\nmachine: {}\ndecoding: {}",
        model.path().display(),
        global.device,
        args.repeats,
        memagent_engine::bench::machine(),
        model.decode_tuning()
    )?;
    writeln!(
        out,
        "{:<14} {:>8} {:>10} {:>14} {:>9} {:>10} {:>9}",
        "test", "tokens", "tok/s", "peak RSS MiB", "speedup", "accepted", "tok/pass"
    )?;
    for (i, r) in results.iter().enumerate() {
        let rss = r.peak_rss_bytes.map_or("-".to_string(), |b| {
            format!("{:.0}", b as f64 / (1024.0 * 1024.0))
        });
        // A drafted rewrite follows its plain run, a batch (of rewrites or of short
        // prompts' prefills) its sequences alone.
        let (speedup, accepted, per_pass) = match (&r.decoding, i.checked_sub(1)) {
            (None, Some(j))
                if ((r.test.starts_with("bw") || r.test.starts_with("pp"))
                    && results[j].test == format!("{}-alone", r.test))
                    || (r.test.starts_with("tg") && r.test.contains('x')) =>
            {
                (
                    format!("{:.2}x", r.tokens_per_second / results[j].tokens_per_second),
                    "-".into(),
                    "-".into(),
                )
            }
            (Some(d), Some(j)) if d.drafted > 0 || r.test.contains("-d") => (
                format!("{:.2}x", r.tokens_per_second / results[j].tokens_per_second),
                format!("{:.0}%", 100.0 * d.acceptance_rate()),
                format!(
                    "{:.2}",
                    r.tokens.saturating_sub(1) as f64 / d.passes.max(1) as f64
                ),
            ),
            _ => ("-".into(), "-".into(), "-".into()),
        };
        writeln!(
            out,
            "{:<14} {:>8} {:>10.1} {:>14} {:>9} {:>10} {:>9}",
            r.test, r.tokens, r.tokens_per_second, rss, speedup, accepted, per_pass
        )?;
    }
    for r in results {
        if let Some(rate) = r.gflop_per_second {
            writeln!(
                out,
                "{}: the projections' matrix products alone run at {rate:.1} GFLOP/s",
                r.test
            )?;
        }
    }
    Ok(())
}

fn report_progress(r: &BenchResult) {
    tracing::info!(
        "{}: {:.1} tok/s ({:?} s)",
        r.test,
        r.tokens_per_second,
        r.seconds
    );
}

/// One sample of the needle benchmark.
#[derive(Debug, Clone, Serialize)]
struct NeedleResult {
    length: usize,
    mode: &'static str,
    #[serde(flatten)]
    sample: NeedleSample,
    /// `None` where the mode cannot run (direct beyond the context).
    hit: Option<bool>,
    answer: Option<String>,
    input_tokens: usize,
    seconds: f64,
    steps: usize,
}

pub fn needle(global: &Settings, args: &BenchNeedleArgs) -> Result<()> {
    for mode in &args.modes {
        if mode != "memory" && mode != "direct" {
            bail!("unknown mode `{mode}` in --modes; expected memory and/or direct");
        }
    }
    if args.samples == 0 || args.lengths.is_empty() {
        bail!("nothing to run: --samples and --lengths must be non-empty");
    }
    let haystack = haystack(args.haystack.as_deref())?;
    let mut output = open_output(args.output.as_deref())?;
    let backend = crate::commands::ModelBackend::open(global, &args.run)?;
    let profile = backend.profile();
    tracing::info!(
        "haystack: {}; profile: chunk {} / memory {} / answer {} tokens",
        haystack.source(),
        profile.chunk_tokens,
        profile.memory_tokens,
        profile.answer_tokens
    );
    let results = backend.with_agent(|agent| {
        let mut results = Vec::new();
        for &length in &args.lengths {
            for i in 0..args.samples {
                let depth = (i as f64 + 0.5) / args.samples as f64;
                let sample = single_needle(
                    &haystack,
                    agent.tokenizer(),
                    length,
                    depth,
                    args.task_seed + i as u64,
                )?;
                for mode in &args.modes {
                    let result = run_needle(agent, &sample, length, mode)?;
                    eprintln!(
                        "length {length} sample {}/{} {mode}: {} ({:.1}s, {} tokens)",
                        i + 1,
                        args.samples,
                        match result.hit {
                            Some(true) => "hit",
                            Some(false) => "miss",
                            None => "n/a",
                        },
                        result.seconds,
                        result.input_tokens
                    );
                    if let Some(file) = output.as_mut() {
                        serde_json::to_writer(&mut *file, &result)?;
                        writeln!(file)?;
                        file.flush()?;
                    }
                    results.push(result);
                }
            }
        }
        Ok(results)
    })?;
    if args.json {
        return crate::commands::print_json(&serde_json::json!({
            "haystack": haystack.source(),
            "profile": profile,
            "machine": memagent_engine::bench::machine(),
            "results": results,
        }));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "machine: {}", memagent_engine::bench::machine())?;
    writeln!(
        out,
        "haystack: {}  profile: C={} M={} answer={}  samples per length: {}",
        haystack.source(),
        profile.chunk_tokens,
        profile.memory_tokens,
        profile.answer_tokens,
        args.samples
    )?;
    writeln!(
        out,
        "| length | memory acc | direct acc | memory s/1K tok | direct s/1K tok | memory steps |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|")?;
    for &length in &args.lengths {
        let of = |mode: &str| -> Vec<&NeedleResult> {
            results
                .iter()
                .filter(|r| r.length == length && r.mode == mode)
                .collect()
        };
        let (memory, direct) = (of("memory"), of("direct"));
        writeln!(
            out,
            "| {length} | {} | {} | {} | {} | {} |",
            accuracy(&memory),
            accuracy(&direct),
            seconds_per_k(&memory),
            seconds_per_k(&direct),
            memory
                .first()
                .map_or("-".to_string(), |r| r.steps.to_string()),
        )?;
    }
    Ok(())
}

fn run_needle(
    agent: &MemoryAgent<'_>,
    sample: &NeedleSample,
    length: usize,
    mode: &str,
) -> Result<NeedleResult> {
    let start = Instant::now();
    let mut result = NeedleResult {
        length,
        mode: if mode == "memory" { "memory" } else { "direct" },
        sample: sample.clone(),
        hit: None,
        answer: None,
        input_tokens: sample.tokens,
        seconds: 0.0,
        steps: 0,
    };
    let answer = if mode == "memory" {
        let run = agent.run(&sample.document, &sample.question, &mut |_| {})?;
        result.steps = run.steps.len();
        result.input_tokens = run.input_tokens;
        Some(run.final_answer.answer)
    } else {
        match agent.direct(&sample.document, &sample.question) {
            Ok(report) => Some(report.answer),
            Err(memagent_agent::Error::Budget(reason)) => {
                tracing::debug!("direct n/a at {length}: {reason}");
                None
            }
            Err(e) => return Err(e.into()),
        }
    };
    result.hit = answer.as_deref().map(|a| sample.is_hit(a));
    result.answer = answer;
    result.seconds = start.elapsed().as_secs_f64();
    Ok(result)
}

fn accuracy(results: &[&NeedleResult]) -> String {
    let scored: Vec<bool> = results.iter().filter_map(|r| r.hit).collect();
    if scored.is_empty() {
        return "n/a".to_string();
    }
    let hits = scored.iter().filter(|&&h| h).count();
    format!(
        "{hits}/{} ({:.0}%)",
        scored.len(),
        100.0 * hits as f64 / scored.len() as f64
    )
}

fn seconds_per_k(results: &[&NeedleResult]) -> String {
    let ran: Vec<&&NeedleResult> = results.iter().filter(|r| r.hit.is_some()).collect();
    if ran.is_empty() {
        return "n/a".to_string();
    }
    let seconds: f64 = ran.iter().map(|r| r.seconds).sum();
    let tokens: usize = ran.iter().map(|r| r.input_tokens).sum();
    format!("{:.2}", seconds / (tokens as f64 / 1000.0))
}

/// The file of `--output`, opened for appending.
pub(super) fn open_output(path: Option<&Path>) -> Result<Option<std::fs::File>> {
    path.map(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))
    })
    .transpose()
}

/// The haystack of `--haystack`, else the shared essays, else RULER's noise.
pub(super) fn haystack(dir: Option<&Path>) -> Result<Haystack> {
    Ok(match dir {
        Some(dir) => Haystack::from_dir(dir)?,
        None => match default_haystack() {
            Some(dir) => Haystack::from_dir(&dir)?,
            None => Haystack::noise(),
        },
    })
}

pub fn store(global: &Settings, args: &BenchStoreArgs) -> Result<()> {
    use memagent_store::Store;
    let haystack = haystack(args.haystack.as_deref())?;
    let content = haystack.text(args.megabytes << 20);
    // Bytes per chunk of `chunk_tokens` tokens, measured on the first 64 KB.
    let model = crate::commands::load_model(global)?;
    let sample = &content[..content.floor_char_boundary(65536)];
    let sample_tokens = model.tokenizer().encode(sample, false)?.len().max(1);
    let chunk_bytes = args.chunk_tokens * sample.len() / sample_tokens;
    drop(model);

    let dir = std::env::temp_dir().join(format!("memagent-bench-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir)?;
    let mut sled = measure_store(&store, "bench", &content, chunk_bytes, args)?;
    store.flush()?;
    sled["sled_size_on_disk"] = store.size_on_disk()?.into();
    drop(store);
    let disk_bytes = dir_size(&dir);
    sled["disk_bytes"] = disk_bytes.into();
    sled["disk_over_content"] = (disk_bytes as f64 / content.len() as f64).into();
    let _ = std::fs::remove_dir_all(&dir);
    let mut result = serde_json::json!({
        "cpu": memagent_engine::bench::cpu_name(),
        "machine": memagent_engine::bench::machine(),
        "content_bytes": content.len(),
        "chunk_bytes": chunk_bytes,
        "sled": sled,
    });
    // The same run through PostgreSQL, side by side, when a database is configured.
    if let Some(url) = global.database()? {
        let local = dir.with_extension("postgres");
        let store = Store::open_with(&local, Some(&url))?;
        let stream = format!("bench-store-{}", std::process::id());
        let measured = measure_store(&store, &stream, &content, chunk_bytes, args);
        let removed = store.remove_stream(&stream);
        let _ = std::fs::remove_dir_all(&local);
        let mut pg = measured?;
        removed?;
        pg["server"] = store.location().into();
        result["postgres"] = pg;
    }
    if args.json {
        return crate::commands::print_json(&result);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} MB appended {} bytes at a time, {} chunks of {} bytes\nmachine: {}",
        args.megabytes,
        args.append_bytes,
        result["sled"]["chunks"],
        chunk_bytes,
        memagent_engine::bench::machine()
    )?;
    writeln!(
        out,
        "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "backend", "append p50", "p99", "commit p50", "p99", "read p50", "p99"
    )?;
    for backend in ["sled", "postgres"] {
        let r = &result[backend];
        if r.is_null() {
            continue;
        }
        let ms = |k: &str| format!("{:.2}", r[k].as_f64().unwrap_or(f64::NAN));
        writeln!(
            out,
            "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            backend,
            ms("append_ms_p50"),
            ms("append_ms_p99"),
            ms("commit_ms_p50"),
            ms("commit_ms_p99"),
            ms("read_ms_p50"),
            ms("read_ms_p99"),
        )?;
    }
    writeln!(
        out,
        "(milliseconds; read: a query's store reads, the latest memory and 4 KB of the log)"
    )?;
    if let Some(bytes) = result["sled"]["disk_bytes"].as_u64() {
        writeln!(
            out,
            "sled on disk: {bytes} bytes, {:.2} x the content",
            result["sled"]["disk_over_content"].as_f64().unwrap_or(0.0)
        )?;
    }
    Ok(())
}

/// Appends `content` to `name` in pieces (commit 1), commits a memory step per chunk
/// (commit 2), then reads as a query does (the latest memory and 4 KB of the log at a
/// spread of offsets): each one's latency percentiles, in milliseconds.
fn measure_store(
    store: &memagent_store::Store,
    name: &str,
    content: &str,
    chunk_bytes: usize,
    args: &BenchStoreArgs,
) -> Result<serde_json::Value> {
    use memagent_store::{Author, ChunkRecord, Cursor, MemoryVersion, GENERAL};
    let mut appends = Vec::new();
    for piece in content.as_bytes().chunks(args.append_bytes) {
        let t = Instant::now();
        store.append(name, piece, None)?;
        appends.push(t.elapsed().as_secs_f64());
    }
    let stream = store.require(name)?;
    let memory = |i: usize| -> String {
        // A memory of about a quarter chunk, different at every step.
        let from = content.floor_char_boundary((i * 977) % 50_000);
        let to = content.floor_char_boundary(from + chunk_bytes / 4);
        format!("Memory after chunk {i}: {}", &content[from..to])
    };
    let mut commits = Vec::new();
    let mut cursor = Cursor::default();
    let mut offset = 0usize;
    let mut index = 0u64;
    while offset < content.len() {
        let end = content.floor_char_boundary((offset + chunk_bytes).min(content.len()));
        let chunk = ChunkRecord {
            index,
            start: offset as u64,
            end: end as u64,
            tokens: args.chunk_tokens as u32,
            sha256: [0; 32],
        };
        let text = memory(index as usize);
        let version = MemoryVersion {
            version: cursor.version + 1,
            parent: (cursor.version > 0).then_some(cursor.version),
            tokens: (text.len() / 4) as u32,
            text,
            chunk: Some(index),
            model: "bench".into(),
            model_sha256: String::new(),
            template_id: "bench".into(),
            template_version: 1,
            created: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            seconds: 0.0,
            cut: false,
            author: Author::Model,
        };
        let next = Cursor {
            next_chunk: index + 1,
            offset: end as u64,
            version: version.version,
        };
        let t = Instant::now();
        store.commit_step(&stream, GENERAL, &chunk, &version, &next)?;
        commits.push(t.elapsed().as_secs_f64());
        cursor = next;
        offset = end;
        index += 1;
    }
    let mut reads = Vec::new();
    for i in 0..500u64 {
        let at = (i * 7_919 * 4096) % stream.log_len.max(1);
        let t = Instant::now();
        let latest = store.latest(&stream, GENERAL)?;
        let text = store.read_log(&stream, at, at + 4096)?;
        reads.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(latest.is_some() && !text.is_empty(), "nothing read back");
    }
    let pct = |v: &mut Vec<f64>, p: f64| percentile(v, p) * 1000.0;
    Ok(serde_json::json!({
        "chunks": commits.len(),
        "appends": appends.len(),
        "append_ms_p50": pct(&mut appends, 0.5),
        "append_ms_p99": pct(&mut appends, 0.99),
        "commit_ms_p50": pct(&mut commits, 0.5),
        "commit_ms_p99": pct(&mut commits, 0.99),
        "read_ms_p50": pct(&mut reads, 0.5),
        "read_ms_p99": pct(&mut reads, 0.99),
    }))
}

/// Bytes of the files under `dir`.
fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// The shared haystack folder, looked up from the working directory and from the
/// checkout that holds the executable.
fn default_haystack() -> Option<PathBuf> {
    let tail = Path::new("shared/data/haystack/paul-graham-essays");
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().take(3).map(Path::to_path_buf));
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).take(5).map(Path::to_path_buf));
    }
    roots
        .into_iter()
        .map(|root| root.join(tail))
        .find(|dir| dir.is_dir())
}

/// A `memctl daemon run` child on a fresh data directory, watching one folder with a
/// stream per file.
struct BenchDaemon {
    child: std::process::Child,
    client: crate::commands::client::DaemonClient,
    root: PathBuf,
    folder: PathBuf,
}

impl BenchDaemon {
    fn start(global: &Settings, name: &str, idle: f64) -> Result<Self> {
        Self::start_with(global, name, idle, "")
    }

    /// Started with `extra` appended to its configuration file.
    fn start_with(global: &Settings, name: &str, idle: f64, extra: &str) -> Result<Self> {
        let root = std::env::temp_dir().join(format!(
            "memagent-bench-daemon-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let folder = root.join("watched");
        std::fs::create_dir_all(&folder)?;
        let config = root.join("config.toml");
        std::fs::write(
            &config,
            format!("[[watch]]\npath = \"{}\"\n{extra}", folder.display()),
        )?;
        let data = root.join("data");
        let log = std::fs::File::create(root.join("daemon.log"))?;
        let child = std::process::Command::new(std::env::current_exe()?)
            .arg("--model")
            .arg(global.model_path()?)
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .args(["daemon", "run", "--idle-seconds", &idle.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start the daemon")?;
        let deadline = Instant::now() + std::time::Duration::from_secs(120);
        let client = loop {
            if let Some(client) = crate::commands::client::DaemonClient::connect(&data) {
                break client;
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon did not start; see {}",
                    root.join("daemon.log").display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        Ok(Self {
            child,
            client,
            root,
            folder,
        })
    }

    /// Status rows by stream.
    fn streams(&self) -> Result<Vec<serde_json::Value>> {
        let status = self.client.get("/v1/status")?;
        Ok(status["streams"].as_array().cloned().unwrap_or_default())
    }

    /// Polls until `check` holds on the status rows; returns when it did.
    fn until(
        &self,
        what: &str,
        mut check: impl FnMut(&[serde_json::Value]) -> bool,
    ) -> Result<Instant> {
        let deadline = Instant::now() + std::time::Duration::from_secs(3600);
        loop {
            if check(&self.streams()?) {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn version_of(rows: &[serde_json::Value], stream: &str) -> u64 {
    rows.iter()
        .find(|r| r["stream"] == stream)
        .and_then(|r| r["version"].as_u64())
        .unwrap_or(0)
}

pub fn daemon(global: &Settings, args: &BenchDaemonArgs) -> Result<()> {
    let haystack = haystack(args.haystack.as_deref())?;
    let content = haystack.text(4 << 20);
    // Bytes per token of this content, to write a given number of tokens.
    let (bytes_per_token, chunk_tokens) = {
        let model = crate::commands::load_model(global)?;
        let sample = &content[..content.floor_char_boundary(65536)];
        let tokens = model.tokenizer().encode(sample, false)?.len().max(1);
        let profile = memagent_agent::Profile::for_model(model.name(), Some(model.parameters()));
        (sample.len() as f64 / tokens as f64, profile.chunk_tokens)
    };
    let piece = |i: usize, tokens: usize| -> String {
        let from = content.floor_char_boundary((i * 104_729) % (content.len() / 2));
        let to = content.floor_char_boundary(from + (tokens as f64 * bytes_per_token) as usize);
        let mut text = content[from..to].to_string();
        text.push('\n');
        text
    };
    let quiet = global.quiet || args.json;
    let say = |line: String| {
        if !quiet {
            eprintln!("{line}");
        }
    };

    // Throughput: every file written at once, until every stream has read its whole
    // chunks. Each file holds a quarter chunk more than its whole chunks, and the idle
    // interval is longer than the run, so no stream reads a short tail: every run does
    // the same steps per stream, of C tokens each, and their rates compare.
    let chunks_per_stream = args.tokens / chunk_tokens;
    if chunks_per_stream == 0 {
        bail!(
            "--tokens {} is less than one chunk ({chunk_tokens} tokens): give at least \
             {chunk_tokens}",
            args.tokens
        );
    }
    let runs = throughput(global, args, chunks_per_stream, chunk_tokens, &piece, &say)?;

    // Lag: from writing an append to the first memory version that read it. A
    // chunk-sized append (a little over C tokens) is read at once; a one-line append
    // waits for the idle interval.
    let daemon = BenchDaemon::start(global, "lag", args.idle_seconds)?;
    let file = daemon.folder.join("lag.txt");
    let timed = |appends: usize, tokens: usize, what: &str| -> Result<Vec<f64>> {
        let mut lags = Vec::new();
        for i in 0..appends {
            // Start from a stream with nothing pending.
            daemon.until("the stream to catch up", |rows| {
                rows.iter()
                    .all(|r| r["stream"] != "lag.txt" || r["pending_bytes"] == 0)
            })?;
            let before = version_of(&daemon.streams()?, "lag.txt");
            let text = piece(1000 + i, tokens);
            let written = Instant::now();
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)?
                .write_all(text.as_bytes())?;
            let done = daemon.until(what, |rows| version_of(rows, "lag.txt") > before)?;
            let lag = done.duration_since(written).as_secs_f64();
            say(format!("{what} {}: {lag:.2}s", i + 1));
            lags.push(lag);
        }
        Ok(lags)
    };
    let chunk_lags = timed(
        args.chunk_appends,
        chunk_tokens * 5 / 4,
        "chunk-sized append",
    )?;
    let line_lags = timed(args.line_appends, 12, "one-line append")?;
    drop(daemon);
    let busy = busy_lag(global, args, chunk_tokens, &piece, &say)?;
    let busy_lags: Vec<f64> = busy.iter().map(|b| b.0).collect();
    let p50 = |v: &[f64]| percentile(v, 0.5);
    let mut report = serde_json::json!({
        "model_chunk_tokens": chunk_tokens,
        "throughput": runs,
        "lag": {
            "chunk_append_p50_seconds": p50(&chunk_lags),
            "chunk_appends": chunk_lags,
            "line_append_p50_seconds": p50(&line_lags),
            "line_appends": line_lags,
            "idle_seconds": args.idle_seconds,
            "busy_streams": args.busy_streams,
            "busy_chunk_append_p50_seconds": (!busy.is_empty()).then(|| p50(&busy_lags)),
            "busy_chunk_appends": busy_lags,
            "busy_streams_pending": busy.iter().map(|b| b.1).collect::<Vec<_>>(),
        },
    });
    report["machine"] = serde_json::json!(memagent_engine::bench::machine());
    if args.json {
        return crate::commands::print_json(&report);
    }
    print_daemon_report(args, chunk_tokens, &runs, (&chunk_lags, &line_lags), &busy)
}

/// Throughput: for each `--streams` count, every file written at once, until every
/// stream has read its whole chunks: one JSON row per count.
fn throughput(
    global: &Settings,
    args: &BenchDaemonArgs,
    chunks_per_stream: usize,
    chunk_tokens: usize,
    piece: &dyn Fn(usize, usize) -> String,
    say: &dyn Fn(String),
) -> Result<Vec<serde_json::Value>> {
    let mut runs = Vec::new();
    for &streams in &args.streams {
        let daemon = BenchDaemon::start(global, &format!("s{streams}"), 86_400.0)?;
        let mut names = Vec::new();
        let started = Instant::now();
        for i in 0..streams {
            let name = format!("stream-{i:02}.txt");
            let text = piece(i, chunks_per_stream * chunk_tokens + chunk_tokens / 4);
            std::fs::write(daemon.folder.join(&name), &text)?;
            names.push(name);
        }
        daemon.until("every stream to read its whole chunks", |rows| {
            names
                .iter()
                .all(|name| version_of(rows, name) >= chunks_per_stream as u64)
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let rows = daemon.streams()?;
        let tokens: u64 = rows.iter().filter_map(|r| r["tokens_read"].as_u64()).sum();
        let steps: u64 = rows.iter().filter_map(|r| r["steps"].as_u64()).sum();
        // Seconds the model itself spent on the steps, from each stream's throughput.
        let model_seconds: f64 = rows
            .iter()
            .filter_map(|r| Some(r["tokens_read"].as_f64()? / r["tokens_per_second"].as_f64()?))
            .sum();
        let row = serde_json::json!({
            "streams": streams,
            "chunks_per_stream": chunks_per_stream,
            "tokens": tokens,
            "steps": steps,
            "seconds": seconds,
            "input_tokens_per_second": tokens as f64 / seconds,
            "model_seconds": model_seconds,
            "model_tokens_per_second": tokens as f64 / model_seconds.max(1e-9),
        });
        say(format!(
            "{streams} streams: {tokens} tokens in {steps} steps, {seconds:.1}s, {:.1} input tok/s \
             ({:.1} tok/s of model time)",
            tokens as f64 / seconds,
            tokens as f64 / model_seconds.max(1e-9)
        ));
        runs.push(row);
    }
    Ok(runs)
}

/// The table and lag lines `bench daemon` prints without `--json`.
fn print_daemon_report(
    args: &BenchDaemonArgs,
    chunk_tokens: usize,
    runs: &[serde_json::Value],
    (chunk_lags, line_lags): (&[f64], &[f64]),
    busy: &[(f64, usize)],
) -> Result<()> {
    let p50 = |v: &[f64]| percentile(v, 0.5);
    let busy_lags: Vec<f64> = busy.iter().map(|b| b.0).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "machine: {}", memagent_engine::bench::machine())?;
    writeln!(
        out,
        "| watched streams | tokens read | steps | seconds | input tok/s |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|")?;
    for r in runs {
        writeln!(
            out,
            "| {} | {} | {} | {:.1} | {:.1} |",
            r["streams"],
            r["tokens"],
            r["steps"],
            r["seconds"].as_f64().unwrap_or(0.0),
            r["input_tokens_per_second"].as_f64().unwrap_or(0.0)
        )?;
    }
    writeln!(
        out,
        "\nlag, append -> memory updated (1 stream, C={chunk_tokens}): chunk-sized appends \
         ({} tokens) p50 {:.2}s (n={}); one-line appends p50 {:.2}s (n={}, idle interval {}s)",
        chunk_tokens * 5 / 4,
        p50(chunk_lags),
        chunk_lags.len(),
        p50(line_lags),
        line_lags.len(),
        args.idle_seconds
    )?;
    if !busy.is_empty() {
        writeln!(
            out,
            "lag while {} other streams read (C={chunk_tokens}): chunk-sized appends p50 {:.2}s \
             (n={}; busy streams still reading at each update: {:?})",
            args.busy_streams,
            p50(&busy_lags),
            busy_lags.len(),
            busy.iter().map(|b| b.1).collect::<Vec<_>>()
        )?;
    }
    Ok(())
}

/// Lag under load: `--busy-streams` files of several chunks each are written at once,
/// then chunk-sized appends to one more file are timed from the write to the memory
/// version that read them. Each lag comes with how many busy streams still had text
/// pending when it ended (all of them: the load held for the whole wait).
fn busy_lag(
    global: &Settings,
    args: &BenchDaemonArgs,
    chunk_tokens: usize,
    piece: &dyn Fn(usize, usize) -> String,
    say: &dyn Fn(String),
) -> Result<Vec<(f64, usize)>> {
    if args.busy_streams == 0 || args.busy_appends == 0 {
        return Ok(Vec::new());
    }
    let daemon = BenchDaemon::start(global, "busy", 2.0)?;
    let probe = "probe.txt";
    // Enough for every busy stream to stay busy through the timed appends: each append
    // waits for up to one round over all streams, and each round reads a chunk of each.
    let per_stream = chunk_tokens * (2 * args.busy_appends + 4);
    let mut sizes = Vec::new();
    for i in 0..args.busy_streams {
        let name = format!("busy-{i:02}.txt");
        let text = piece(i, per_stream);
        std::fs::write(daemon.folder.join(&name), &text)?;
        sizes.push((name, text.len() as u64));
    }
    daemon.until("the daemon to see every busy file", |rows| {
        sizes.iter().all(|(name, bytes)| {
            rows.iter()
                .any(|r| r["stream"] == name.as_str() && r["log_bytes"].as_u64() == Some(*bytes))
        })
    })?;
    let file = daemon.folder.join(probe);
    let mut lags = Vec::new();
    for i in 0..args.busy_appends {
        daemon.until("the probe stream to catch up", |rows| {
            rows.iter()
                .all(|r| r["stream"] != probe || r["pending_bytes"] == 0)
        })?;
        let before = version_of(&daemon.streams()?, probe);
        let text = piece(2000 + i, chunk_tokens * 5 / 4);
        let written = Instant::now();
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)?
            .write_all(text.as_bytes())?;
        let mut pending = 0;
        let done = daemon.until("a chunk-sized append under load", |rows| {
            pending = rows
                .iter()
                .filter(|r| r["stream"] != probe && r["pending_bytes"].as_u64() > Some(0))
                .count();
            version_of(rows, probe) > before
        })?;
        let lag = done.duration_since(written).as_secs_f64();
        say(format!(
            "chunk-sized append under load {}: {lag:.2}s ({pending} of {} busy streams still reading)",
            i + 1,
            args.busy_streams
        ));
        lags.push((lag, pending));
    }
    Ok(lags)
}

/// A loopback OpenAI-compatible server that answers every chat request at once, echoing
/// its last message: its base URL, served while the runtime lives.
pub(crate) fn echo_upstream() -> Result<(String, tokio::runtime::Runtime)> {
    loopback_upstream(|last| last.to_string())
}

/// A loopback OpenAI-compatible server (a stand-in for a served model) that answers
/// every chat request at once with `reply` to its last message: its base URL, served
/// while the runtime lives.
pub(crate) fn loopback_upstream(
    reply: impl Fn(&str) -> String + Clone + Send + Sync + 'static,
) -> Result<(String, tokio::runtime::Runtime)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    let answer = move |axum::Json(body): axum::Json<serde_json::Value>| {
        let reply = reply.clone();
        async move {
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .map_or("", |m| m["content"].as_str().unwrap_or(""));
            axum::Json(serde_json::json!({
                "id": "stand-in", "object": "chat.completion", "created": 0, "model": "stand-in",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": reply(last)}}],
            }))
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(answer));
    runtime.spawn(async move { axum::serve(listener, app).await });
    Ok((url, runtime))
}

pub fn proxy(global: &Settings, args: &BenchProxyArgs) -> Result<()> {
    const TOKEN: &str = "memagent-bench-proxy";
    let (upstream, _upstream_runtime) = echo_upstream()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let daemon = BenchDaemon::start_with(
        global,
        "proxy",
        args.idle_seconds,
        &format!(
            "[proxy]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nupstream = \"{upstream}\"\n"
        ),
    )?;
    let proxy = format!("http://127.0.0.1:{port}/v1");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    // One chat request; its seconds.
    let call = |base: &str, turn: usize| -> Result<f64> {
        let body = serde_json::json!({
            "model": "echo", "user": "bench",
            "messages": [{"role": "user", "content": format!("Note {turn}: the meeting moved to room {turn}.")}],
        });
        let start = Instant::now();
        let mut reply = agent
            .post(&format!("{base}/chat/completions"))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .send_json(&body)
            .with_context(|| format!("{base} did not answer"))?;
        let status = reply.status();
        let text = reply.body_mut().read_to_string()?;
        if !status.is_success() {
            bail!("{base} answered {status}: {text}");
        }
        Ok(start.elapsed().as_secs_f64())
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    while call(&proxy, 0).is_err() {
        if Instant::now() > deadline {
            bail!(
                "the proxy did not answer; see the daemon's log in {}",
                daemon.root.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Direct and proxied requests interleaved, after a warm-up.
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for turn in 0..args.requests + 10 {
        let (d, p) = (call(&upstream, turn)?, call(&proxy, turn)?);
        if turn >= 10 {
            direct.push(d * 1000.0);
            proxied.push(p * 1000.0);
        }
    }
    if !global.quiet {
        eprintln!(
            "{} requests each; waiting for the daemon to read the turns…",
            args.requests
        );
    }
    // The lag from a turn through the proxy to the memory version that holds it.
    let caught_up = |rows: &[serde_json::Value]| {
        rows.iter()
            .any(|r| r["stream"] == "bench" && r["pending_bytes"].as_u64() == Some(0))
    };
    daemon.until("the turns to be read", caught_up)?;
    let mut lags = Vec::new();
    for turn in 0..args.turns {
        let before = version_of(&daemon.streams()?, "bench");
        let sent = Instant::now();
        call(&proxy, 100_000 + turn)?;
        let done = daemon.until("the turn's memory step", |rows| {
            version_of(rows, "bench") > before
        })?;
        lags.push(done.duration_since(sent).as_secs_f64());
        daemon.until("the turn to be read", caught_up)?;
    }
    let result = serde_json::json!({
        "requests": args.requests,
        "direct_ms": {"p50": percentile(&direct, 0.5), "p99": percentile(&direct, 0.99)},
        "proxied_ms": {"p50": percentile(&proxied, 0.5), "p99": percentile(&proxied, 0.99)},
        "overhead_ms": {
            "p50": percentile(&proxied, 0.5) - percentile(&direct, 0.5),
            "p99": percentile(&proxied, 0.99) - percentile(&direct, 0.99),
        },
        "idle_seconds": args.idle_seconds,
        "turn_lag_seconds": lags,
        "turn_lag_p50_seconds": percentile(&lags, 0.5),
        "machine": memagent_engine::bench::machine(),
    });
    if args.json {
        return crate::commands::print_json(&result);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "machine: {}", memagent_engine::bench::machine())?;
    writeln!(
        out,
        "{} requests to a loopback echo upstream: direct p50 {:.2} ms, p99 {:.2} ms; through \
         the proxy p50 {:.2} ms, p99 {:.2} ms (overhead p50 {:.2} ms, p99 {:.2} ms)",
        args.requests,
        percentile(&direct, 0.5),
        percentile(&direct, 0.99),
        percentile(&proxied, 0.5),
        percentile(&proxied, 0.99),
        result["overhead_ms"]["p50"].as_f64().unwrap_or(0.0),
        result["overhead_ms"]["p99"].as_f64().unwrap_or(0.0),
    )?;
    writeln!(
        out,
        "memory step lag after a turn through the proxy (idle {} s): p50 {:.2} s over {} turns",
        args.idle_seconds,
        percentile(&lags, 0.5),
        lags.len()
    )?;
    Ok(())
}

/// The `p` quantile (0 to 1) of `values`, nearest rank; 0 when there are none.
pub(crate) fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n => sorted[((n - 1) as f64 * p).round() as usize],
    }
}

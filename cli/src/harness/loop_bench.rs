//! `memctl bench loop`: the same documents through the local loop and through the loop
//! driven against llama.cpp's server (or another OpenAI-compatible server) on the same
//! model file, in one run: input tokens per second of each, their ratio, generated
//! tokens, and where the time went.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use memagent_agent::{AgentRun, MemoryAgent, OpenAiBackend, RemoteOptions};
use memagent_engine::StopReason;
use memagent_tasks::single_needle;
use serde::Serialize;

use crate::cli::{BenchLoopArgs, LoopMode, ProfileKind};
use crate::settings::Settings;

/// One loop over one document.
#[derive(Debug, Clone, Serialize)]
pub struct LoopMeasure {
    pub profile: &'static str,
    pub mode: &'static str,
    /// `local` or `server`.
    pub engine: &'static str,
    pub document: usize,
    pub input_tokens: usize,
    pub steps: usize,
    /// Tokens generated over the steps and the final answer.
    pub generated_tokens: usize,
    pub prompt_tokens: usize,
    pub seconds: f64,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub input_tokens_per_second: f64,
    pub answer: String,
    pub hit: bool,
    /// Tokens each step generated and why it stopped, in order (the final answer last):
    /// where two engines' generated totals differ, this shows at which steps.
    pub step_tokens: Vec<(usize, StopReason)>,
}

pub fn run(global: &Settings, args: &BenchLoopArgs) -> Result<()> {
    if args.documents == 0 || args.tokens == 0 {
        bail!("nothing to run: --documents and --tokens must be at least 1");
    }
    if args.profiles.is_empty() || args.modes.is_empty() {
        bail!("nothing to run: give at least one --profiles and one --modes");
    }
    let server_binary = server_binary(args)?;
    let model = crate::commands::load_model(global)?;
    let haystack = super::bench::haystack(args.haystack.as_deref())?;
    let samples = (0..args.documents)
        .map(|i| {
            single_needle(
                &haystack,
                model.tokenizer(),
                args.tokens,
                (i as f64 + 0.5) / args.documents as f64,
                args.seed + i as u64,
            )
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!(
        "model {} ({}), {} document(s) of {} tokens, {threads} threads",
        model.name(),
        model.path().display(),
        samples.len(),
        args.tokens
    );
    let mut measures = Vec::new();
    for &kind in &args.profiles {
        let profile = kind.profile();
        let local_agent =
            |mode: LoopMode| configure(MemoryAgent::new(&model, model.tokenizer(), profile), mode);
        let context = local_agent(LoopMode::EndToEnd)
            .budget(&samples[0].question)
            .map(|b| b.update_total.max(b.final_total))?;
        // The server's context: the largest step, rounded up as llama.cpp allocates it.
        let server_context = context.div_ceil(256) * 256;
        for &mode in &args.modes {
            // A fresh server per mode, and an empty prefix cache per local run: each loop
            // starts cold (the first prompt of a document is the same in every mode, and
            // a warm cache would skip its whole prefill).
            let (_server, remote) = server_for(
                server_binary.as_deref(),
                args,
                &model,
                server_context,
                threads,
            )?;
            for (i, sample) in samples.iter().enumerate() {
                for engine in ["local", "server"] {
                    let agent = if engine == "local" {
                        model.clear_prefix_cache();
                        local_agent(mode)
                    } else {
                        configure(MemoryAgent::new(&remote, model.tokenizer(), profile), mode)
                    };
                    eprintln!(
                        "{} profile (C = {}, M = {}), {}, document {}: {engine} loop…",
                        kind.name(),
                        profile.chunk_tokens,
                        profile.memory_tokens,
                        mode.name(),
                        i + 1
                    );
                    let run = agent
                        .run(&sample.document, &sample.question, &mut |_| {})
                        .with_context(|| format!("the {engine} loop failed"))?;
                    let measure = measure(
                        kind,
                        mode,
                        engine,
                        i + 1,
                        &run,
                        sample.is_hit(&run.final_answer.answer),
                    );
                    eprintln!(
                        "  {:.1} s, {:.1} input tok/s, {} generated tokens (prefill {:.1} s, \
                         decode {:.1} s)",
                        measure.seconds,
                        measure.input_tokens_per_second,
                        measure.generated_tokens,
                        measure.prefill_seconds,
                        measure.decode_seconds
                    );
                    measures.push(measure);
                }
            }
        }
    }
    if args.json {
        return crate::commands::print_json(&serde_json::json!({
            "model": model.path(),
            "threads": threads,
            "machine": memagent_engine::bench::machine(),
            "tokens": args.tokens,
            "haystack": haystack.source(),
            "measures": measures,
        }));
    }
    print_table(&measures)
}

/// The llama-server binary to start for each run, or none when `--server-url` names a
/// server already running.
fn server_binary(args: &BenchLoopArgs) -> Result<Option<std::path::PathBuf>> {
    Ok(match (&args.llama_server, &args.server_url) {
        (Some(path), None) => Some(check_binary(path)?),
        (None, Some(_)) => None,
        (Some(_), Some(_)) => bail!("give --llama-server PATH or --server-url URL, not both"),
        (None, None) => bail!(
            "the comparison needs llama.cpp's server: pass --llama-server PATH (the \
             llama-server binary; it is started on the model file with the threads and \
             context each profile needs) or --server-url URL of a server already serving \
             the same model"
        ),
    })
}

/// A fresh llama-server for a run (none with `--server-url`) and the backend that talks
/// to it, with the profile's context.
fn server_for(
    server_binary: Option<&Path>,
    args: &BenchLoopArgs,
    model: &memagent_engine::LocalModel,
    server_context: usize,
    threads: usize,
) -> Result<(Option<LlamaServer>, OpenAiBackend)> {
    let server = match server_binary {
        Some(binary) => Some(LlamaServer::start(
            binary,
            model.path(),
            server_context,
            threads,
        )?),
        None => None,
    };
    let url = match (&server, &args.server_url) {
        (Some(server), _) => server.url.clone(),
        (None, Some(url)) => url.clone(),
        (None, None) => unreachable!("checked above"),
    };
    let mut options = RemoteOptions::new(url, args.remote_model.clone());
    options.context_length = Some(server_context);
    options.retries = 0;
    let remote = OpenAiBackend::new(options)?;
    Ok((server, remote))
}

fn check_binary(path: &Path) -> Result<std::path::PathBuf> {
    if !path.is_file() {
        bail!(
            "--llama-server {} is not a file; build llama.cpp and pass its \
             build/bin/llama-server",
            path.display()
        );
    }
    Ok(path.to_path_buf())
}

/// The loop as a mode runs it: end to end as users run it, or every reply exactly at
/// its cap (end-of-turn ignored, no loop stops) so that both engines generate the same
/// number of tokens.
fn configure(mut agent: MemoryAgent<'_>, mode: LoopMode) -> MemoryAgent<'_> {
    if mode == LoopMode::Fixed {
        agent.ignore_eos = true;
        agent.repeat_guard = None;
    }
    agent
}

fn measure(
    kind: ProfileKind,
    mode: LoopMode,
    engine: &'static str,
    document: usize,
    run: &AgentRun,
    hit: bool,
) -> LoopMeasure {
    let timings = run
        .steps
        .iter()
        .map(|s| s.timings)
        .chain([run.final_answer.timings]);
    let (mut prefill, mut decode) = (0.0, 0.0);
    for t in timings.flatten() {
        prefill += t.prefill_seconds;
        decode += t.decode_seconds;
    }
    LoopMeasure {
        profile: kind.name(),
        mode: mode.name(),
        engine,
        document,
        input_tokens: run.input_tokens,
        steps: run.steps.len(),
        generated_tokens: run.steps.iter().map(|s| s.completion_tokens).sum::<usize>()
            + run.final_answer.completion_tokens,
        prompt_tokens: run.steps.iter().map(|s| s.prompt_tokens).sum::<usize>()
            + run.final_answer.prompt_tokens,
        seconds: run.seconds,
        prefill_seconds: prefill,
        decode_seconds: decode,
        input_tokens_per_second: run.input_tokens as f64 / run.seconds.max(f64::EPSILON),
        answer: run.final_answer.answer.clone(),
        hit,
        step_tokens: run
            .steps
            .iter()
            .map(|s| (s.completion_tokens, s.stop_reason))
            .chain([(
                run.final_answer.completion_tokens,
                run.final_answer.stop_reason,
            )])
            .collect(),
    }
}

fn print_table(measures: &[LoopMeasure]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "machine: {}", memagent_engine::bench::machine())?;
    writeln!(
        out,
        "| profile | mode | loop | input tok/s | ratio | generated | prefill s | decode s | total s | needle |"
    )?;
    writeln!(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---|")?;
    let mut groups: Vec<(&str, &str)> = measures.iter().map(|m| (m.profile, m.mode)).collect();
    groups.dedup();
    for (profile, mode) in groups {
        let of = |engine: &str| -> Vec<&LoopMeasure> {
            measures
                .iter()
                .filter(|m| m.profile == profile && m.mode == mode && m.engine == engine)
                .collect()
        };
        let rate = |ms: &[&LoopMeasure]| {
            let tokens: usize = ms.iter().map(|m| m.input_tokens).sum();
            let seconds: f64 = ms.iter().map(|m| m.seconds).sum();
            tokens as f64 / seconds.max(f64::EPSILON)
        };
        let server_rate = rate(&of("server"));
        for engine in ["local", "server"] {
            let ms = of(engine);
            let sum = |f: fn(&LoopMeasure) -> f64| ms.iter().map(|m| f(m)).sum::<f64>();
            writeln!(
                out,
                "| {profile} | {mode} | {engine} | {:.1} | {} | {} | {:.1} | {:.1} | {:.1} | {}/{} |",
                rate(&ms),
                if engine == "local" {
                    format!("{:.2}x", rate(&ms) / server_rate.max(f64::EPSILON))
                } else {
                    "1.00x".to_string()
                },
                ms.iter().map(|m| m.generated_tokens).sum::<usize>(),
                sum(|m| m.prefill_seconds),
                sum(|m| m.decode_seconds),
                sum(|m| m.seconds),
                ms.iter().filter(|m| m.hit).count(),
                ms.len(),
            )?;
        }
    }
    Ok(())
}

/// llama.cpp's server on a free loopback port, stopped when dropped.
struct LlamaServer {
    child: Child,
    url: String,
    log: std::path::PathBuf,
}

impl LlamaServer {
    fn start(binary: &Path, model: &Path, context: usize, threads: usize) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("cannot find a free local port")?
            .port();
        let log = std::env::temp_dir().join(format!("memctl-llama-server-{port}.log"));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        eprintln!(
            "starting {} on {} (-c {context} -t {threads}, port {port}; log {})",
            binary.display(),
            model.display(),
            log.display()
        );
        let child = Command::new(binary)
            .args(["-m", &model.to_string_lossy()])
            .args(["-c", &context.to_string()])
            .args(["-t", &threads.to_string()])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--parallel", "1"])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}/v1"),
            log,
        };
        server.wait_ready(Duration::from_secs(180))?;
        Ok(server)
    }

    /// Waits for `/health` to answer 200 (the model is loaded).
    fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let health = self.url.trim_end_matches("/v1").to_string() + "/health";
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(2)))
            .http_status_as_error(false)
            .build()
            .into();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "llama-server exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if agent
                .get(&health)
                .call()
                .is_ok_and(|r| r.status().as_u16() == 200)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "llama-server did not answer {health} within {} s:\n{}",
                    limit.as_secs(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log_tail(&self) -> String {
        let Ok(file) = std::fs::File::open(&self.log) else {
            return String::new();
        };
        let lines: Vec<String> = std::io::BufReader::new(file)
            .lines()
            .map_while(|l| l.ok())
            .collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! `memctl daemon run|status`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use memagent_agent::Profile;
use memagent_store::Store;
use memagent_watcher::{DaemonInfo, DaemonOptions, EngineHandle, ProxyOptions, TcpOptions};
use serde_json::Value;

use super::client::DaemonClient;
use super::{print_json, ModelBackend};
use crate::cli::DaemonRunArgs;
use crate::settings::{self, Settings};

/// Environment variable holding the TCP listener's bearer token.
const TOKEN_ENV: &str = "MEMAGENT_API_TOKEN";

/// Environment variable holding the proxy's bearer token.
const PROXY_TOKEN_ENV: &str = "MEMAGENT_PROXY_TOKEN";

pub fn run(global: &Settings, args: &DaemonRunArgs) -> Result<()> {
    let config = global.config()?.clone();
    let dir = global.data_dir()?;
    let seconds = |flag: Option<f64>, key: Option<f64>, default: f64, name: &str| {
        let value = flag.or(key).unwrap_or(default);
        if !(value > 0.0 && value.is_finite()) {
            bail!("--{name} must be a positive number of seconds (got {value})");
        }
        Ok(Duration::from_secs_f64(value))
    };
    let idle = seconds(
        args.idle_seconds,
        config.daemon.idle_seconds,
        30.0,
        "idle-seconds",
    )?;
    let rescan = seconds(
        args.rescan_seconds,
        config.daemon.rescan_seconds,
        60.0,
        "rescan-seconds",
    )?;
    let write_timeout = seconds(
        args.write_timeout_seconds,
        config.daemon.write_timeout_seconds,
        30.0,
        "write-timeout-seconds",
    )?;
    let stop_timeout = seconds(
        args.stop_timeout_seconds,
        config.daemon.stop_timeout_seconds,
        10.0,
        "stop-timeout-seconds",
    )?;
    let lease = seconds(
        args.lease_seconds,
        config.daemon.lease_seconds,
        30.0,
        "lease-seconds",
    )?;
    let name = args
        .name
        .clone()
        .or_else(|| config.daemon.name.clone())
        .unwrap_or_else(memagent_watcher::default_name);
    let tcp = tcp_options(args, &config)?;
    let proxy = proxy_options(&config)?;
    if config.watch.is_empty() {
        tracing::warn!(
            "nothing to watch: add files or folders with `memctl watch add PATH`, then \
             restart; the API serves meanwhile"
        );
    }
    let store = Arc::new(global.open_store()?);
    if store.is_shared() {
        tracing::info!(
            "streams in {} shared with other daemons: stepped as `{name}` under leases of \
             {:.0}s",
            store.location(),
            lease.as_secs_f64()
        );
    }
    // The indexer thread catches the index up once the daemon runs.
    let recall = Arc::new(super::recall::open_recall_only(global, &store)?);

    // The engine thread owns the model for the daemon's whole life.
    let (engine, requests) = EngineHandle::channel();
    let (model, profile) = start_engine(global, args, &store, requests)?;
    tracing::info!(
        "model {model} ready: chunks of {} tokens, memory up to {} tokens; {} watches; \
         partial chunks read after {:.0}s idle",
        profile.chunk_tokens,
        profile.memory_tokens,
        config.watch.len(),
        idle.as_secs_f64()
    );
    let info = DaemonInfo {
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        model,
        chunk_tokens: profile.chunk_tokens,
        memory_tokens: profile.memory_tokens,
        data_dir: dir.display().to_string(),
        idle_seconds: idle.as_secs_f64(),
        watches: config.watch.len(),
    };
    let rerank = config.query.rerank.unwrap_or(0);
    let proxy_reranks = config.proxy.is_some() && config.proxy_rerank() > 0;
    let read_ahead = config
        .daemon
        .read_ahead
        .unwrap_or(rerank > 0 || proxy_reranks);
    let options = DaemonOptions {
        read_ahead,
        rerank,
        watches: config.watch,
        idle,
        rescan,
        tcp,
        proxy,
        write_timeout,
        stop_timeout,
        name,
        lease,
        ..DaemonOptions::default()
    };
    memagent_watcher::run(store, recall, engine, info, options)?;
    Ok(())
}

/// The API on TCP, when `--listen` or `daemon.listen` asks for it, with its bearer token.
fn tcp_options(args: &DaemonRunArgs, config: &settings::ConfigFile) -> Result<Option<TcpOptions>> {
    let Some(listen) = args.listen.as_ref().or(config.daemon.listen.as_ref()) else {
        return Ok(None);
    };
    let addr = settings::listen_addr(listen).context("--listen")?;
    let token = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| config.daemon.token.clone())
        .with_context(|| {
            format!(
                "the TCP listener needs a bearer token: set {TOKEN_ENV} or \
                 `daemon.token` in the configuration file"
            )
        })?;
    if !addr.ip().is_loopback() {
        tracing::warn!("the API listens on {addr}, beyond this machine");
    }
    Ok(Some(TcpOptions { addr, token }))
}

/// The proxy, when the configuration file has a `[proxy]`, with its clients' token and
/// the upstream's key.
fn proxy_options(config: &settings::ConfigFile) -> Result<Option<ProxyOptions>> {
    let Some(proxy) = &config.proxy else {
        return Ok(None);
    };
    let addr = settings::listen_addr(&proxy.listen).context("proxy.listen")?;
    let token = std::env::var(PROXY_TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| proxy.token.clone().filter(|t| !t.is_empty()))
        .with_context(|| {
            format!(
                "the proxy needs a bearer token (its clients' API key): set \
                 {PROXY_TOKEN_ENV} or `proxy.token` in the configuration file"
            )
        })?;
    let upstream_key = match &proxy.upstream_api_key_env {
        Some(name) => Some(
            std::env::var(name)
                .ok()
                .filter(|k| !k.is_empty())
                .with_context(|| format!("proxy.upstream_api_key_env: ${name} is not set"))?,
        ),
        None => None,
    };
    Ok(Some(ProxyOptions {
        addr,
        token,
        upstream: proxy.upstream.clone(),
        upstream_key,
        rerank: config.proxy_rerank(),
    }))
}

/// Starts the thread that owns the model and serves `requests` with it, and waits until
/// the model is loaded: its name and profile, or why it could not start.
fn start_engine(
    global: &Settings,
    args: &DaemonRunArgs,
    store: &Arc<Store>,
    requests: memagent_watcher::EngineRequests,
) -> Result<(String, Profile)> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (global, run, store) = (global.clone(), args.run.clone(), store.clone());
    std::thread::Builder::new()
        .name("memagent-engine".into())
        .spawn(move || {
            let served = (|| -> Result<()> {
                let backend = ModelBackend::open(&global, &run)?;
                let (model, sha) = backend.identity()?;
                let writer = backend.writer();
                let embedder = backend.writer_embedder(&global)?;
                backend.with_agent(|agent| {
                    agent.budget("")?;
                    let _ = ready_tx.send(Ok((model.clone(), agent.profile)));
                    let ingestor = memagent_memory::Ingestor::new(&store, agent, &model, &sha)
                        .with_writer(writer, embedder.as_deref());
                    memagent_watcher::serve_engine(agent, &ingestor, requests);
                    Ok(())
                })
            })();
            if let Err(e) = served {
                let _ = ready_tx.send(Err(e));
            }
        })?;
    ready_rx
        .recv()
        .context("the engine thread stopped before it was ready")?
}

pub fn status(global: &Settings, json: bool) -> Result<()> {
    let dir = global.data_dir()?;
    let Some(client) = DaemonClient::connect(&dir) else {
        bail!(
            "no daemon is running for {}; start one with `memctl daemon run`",
            dir.display()
        );
    };
    let status = client.get("/v1/status")?;
    if json {
        return print_json(&status);
    }
    let d = &status["daemon"];
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "daemon {} (pid {}) on {}: model {}, C={} M={}, up {:.0}s, {} files in {} watches{}{}",
        d["version"].as_str().unwrap_or("?"),
        d["pid"],
        client.socket().display(),
        d["model"].as_str().unwrap_or("?"),
        d["chunk_tokens"],
        d["memory_tokens"],
        status["uptime_seconds"].as_f64().unwrap_or(0.0),
        status["files"],
        d["watches"],
        match (
            status["rss_bytes"].as_u64(),
            status["peak_rss_bytes"].as_u64()
        ) {
            (Some(now), Some(peak)) => format!(
                ", {:.0} MB resident (peak {:.0} MB)",
                now as f64 / 1e6,
                peak as f64 / 1e6
            ),
            _ => String::new(),
        },
        match status["busy"].as_str() {
            Some(s) => format!("; reading `{s}`"),
            None => String::new(),
        }
    )?;
    let ahead = &status["read_ahead"];
    if ahead["on"].as_bool() == Some(true) {
        writeln!(
            out,
            "read ahead: {} passages read, {} to go; {} prompts kept for ranking again ({:.0} MB)",
            ahead["passages_read"],
            ahead["pending"],
            ahead["kept_prompts"],
            ahead["kept_bytes"].as_f64().unwrap_or(0.0) / 1e6
        )?;
    }
    let space = &status["space"];
    if let (Some(available), Some(reserve)) =
        (space["available"].as_u64(), space["reserve"].as_u64())
    {
        writeln!(
            out,
            "store {}: {:.1} MB free on its filesystem, {:.1} MB kept free",
            status["store"].as_str().unwrap_or("?"),
            available as f64 / 1e6,
            reserve as f64 / 1e6
        )?;
    }
    writeln!(
        out,
        "{:<24} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>8} {:>10}",
        "stream",
        "bytes",
        "pending",
        "p.tokens",
        "version",
        "lag s",
        "lag p50",
        "tok/s",
        "unindexed"
    )?;
    let num = |v: &Value, digits: usize| match v.as_f64() {
        Some(x) => format!("{x:.digits$}"),
        None => "-".to_string(),
    };
    for s in status["streams"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "{:<24} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>8} {:>10}",
            s["stream"].as_str().unwrap_or(""),
            num(&s["log_bytes"], 0),
            num(&s["pending_bytes"], 0),
            num(&s["pending_tokens"], 0),
            num(&s["version"], 0),
            num(&s["lag_seconds"], 1),
            num(&s["lag_p50_seconds"], 1),
            num(&s["tokens_per_second"], 1),
            num(&s["index_lag_bytes"], 0),
        )?;
        if let Some(owner) = s["lease"]["owner"].as_str() {
            writeln!(
                out,
                "  stepped by {owner} (lease epoch {}, {} s left)",
                num(&s["lease"]["epoch"], 0),
                s["lease"]["ms_left"]
                    .as_f64()
                    .map_or("-".to_string(), |ms| format!("{:.1}", ms / 1000.0))
            )?;
        }
        if let Some(e) = s["last_error"].as_str() {
            writeln!(out, "  last error: {e}")?;
        }
    }
    Ok(())
}

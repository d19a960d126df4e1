//! Diagnostics on stderr through `tracing`; `RUST_LOG` overrides `-v`/`-q`.

use tracing_subscriber::EnvFilter;

/// `daemon`: a long-running service logs what it does (info) by default.
pub fn init(verbose: u8, quiet: bool, daemon: bool) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) if daemon => "info",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "memctl={level},memagent_engine={level},memagent_agent={level},\
             memagent_store={level},memagent_memory={level},memagent_watcher={level}"
        ))
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a daemon's stderr is usually a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

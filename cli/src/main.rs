//! `memctl`: the command-line interface of memagent.
//!
//! Glue over the libraries: clap's syntax (`cli`), flags, variables and the
//! configuration file resolved once into settings (`settings`), one module per
//! user-facing command (`commands`), and the benchmark and training harnesses
//! (`harness`). It owns output, exit codes (0 ok, 1 error, 2 usage) and logging; how
//! memory is read and questions answered is `memagent_memory`'s, never decided here.

mod cli;
mod commands;
mod harness;
mod logging;
mod settings;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // candle asks for its thread count on every matmul and, without this variable, counts
    // physical cores by parsing /proc/cpuinfo each time: pin it once, before any thread.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    // `avx2` or `portable`: a slower integer kernel this CPU also runs, to measure what
    // CPUs without AVX-512 VNNI get.
    if let Ok(kernel) = std::env::var("MEMAGENT_INTEGER_KERNEL") {
        memagent_engine::prefer_integer_kernel(&kernel);
    }
    let cli = cli::Cli::parse();
    let daemon = matches!(
        cli.command,
        cli::Command::Daemon(cli::DaemonCommand::Run(_))
    );
    logging::init(cli.global.verbose, cli.global.quiet, daemon);
    let settings = settings::Settings::resolve(cli.global);
    let ran = match cli.command {
        cli::Command::Bench(command) => harness::bench(&settings, command),
        cli::Command::Train(args) => harness::train(&settings, &args),
        command => commands::run(&settings, command),
    };
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if commands::is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", commands::error_text(&err));
            ExitCode::FAILURE
        }
    }
}

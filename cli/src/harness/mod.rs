//! The benchmark and training harnesses: `memctl bench …` and `memctl train …`. They
//! measure and train the product; the user-facing commands (`crate::commands`) never
//! call them.

mod bench;
mod loop_bench;
mod qa;
mod recall_bench;
mod ruler;
mod sessions;
mod shared_bench;
mod soak;
mod train;
mod train_sample;

use anyhow::Result;

use crate::cli::{BenchCommand, TrainArgs, TrainCommand};
use crate::settings::Settings;

pub fn bench(global: &Settings, command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Engine(args) => bench::engine(global, &args),
        BenchCommand::Sessions(args) => sessions::run(global, &args),
        BenchCommand::Recall(args) => recall_bench::bench(global, &args),
        BenchCommand::Needle(args) => bench::needle(global, &args),
        BenchCommand::Store(args) => bench::store(global, &args),
        BenchCommand::Daemon(args) => bench::daemon(global, &args),
        BenchCommand::Ruler(args) => ruler::run(global, &args),
        BenchCommand::Qa(args) => qa::run(global, &args),
        BenchCommand::Loop(args) => loop_bench::run(global, &args),
        BenchCommand::Proxy(args) => bench::proxy(global, &args),
        BenchCommand::Soak(args) => soak::run(global, &args),
        BenchCommand::Shared(args) => shared_bench::run(global, &args),
    }
}

pub fn train(global: &Settings, args: &TrainArgs) -> Result<()> {
    match &args.command {
        Some(TrainCommand::Data(data)) => train::print_data(global, data),
        Some(TrainCommand::Sample(sample)) => train_sample::run(global, sample),
        None => train::train(global, args),
    }
}

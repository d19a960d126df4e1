//! One module per command; each calls the libraries and owns its output.

mod bench;
mod generate;
mod model;
mod tokenize;

use anyhow::Result;
use memagent_engine::{open_device, LoadOptions, LocalModel, WeightPlan};

use crate::cli::{BenchCommand, Cli, Command, GlobalArgs, ModelCommand};
use crate::settings;

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => generate::run(&cli.global, &args),
        Command::Model(ModelCommand::Info { json }) => model::info(&cli.global, json),
        Command::Tokenize(args) => tokenize::run(&cli.global, &args),
        Command::Bench(BenchCommand::Engine(args)) => bench::engine(&cli.global, &args),
    }
}

/// Loads the model the settings point at, on the chosen device.
fn load_model(global: &GlobalArgs) -> Result<LocalModel> {
    let path = settings::model_path(global)?;
    let options = LoadOptions {
        device: open_device(&global.device)?,
        weights: WeightPlan {
            dense_prefill: true,
        },
        tokenizer_json: global.tokenizer.clone(),
    };
    tracing::info!("loading model {}", path.display());
    Ok(LocalModel::load(&path, &options)?)
}

/// A closed stdout (`memctl ... | head`) ends the program quietly.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

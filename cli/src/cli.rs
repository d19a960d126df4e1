//! Command-line syntax: every flag and subcommand of `memctl`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// memagent: long-term memory for assistants and agents, at a fixed prompt size.
///
/// A language model reads any stream of text chunk by chunk and rewrites a bounded,
/// human-readable memory after each chunk; answers come from that memory alone.
///
/// Exit codes: 0 success, 1 error, 2 usage error.
#[derive(Debug, Parser)]
#[command(name = "memctl", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// GGUF model file [default: $MEMAGENT_MODEL, then `model` in the config file, then
    /// models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(long, global = true, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// tokenizer.json to use instead of the tokenizer stored in the GGUF file
    #[arg(long, global = true, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,

    /// Where the model runs: cpu, cuda[:N] or metal (GPUs need a build with that feature)
    #[arg(long, global = true, env = "MEMAGENT_DEVICE", default_value = "cpu")]
    pub device: String,

    /// Configuration file [default: $XDG_CONFIG_HOME/memagent/config.toml]
    #[arg(long, global = true, env = "MEMAGENT_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// More diagnostics on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Only errors on stderr
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One chat turn with the model: prints its reply
    Generate(GenerateArgs),
    /// Facts about the model file
    #[command(subcommand)]
    Model(ModelCommand),
    /// Token ids of a text, as the model's tokenizer splits it
    Tokenize(TokenizeArgs),
    /// Benchmarks that print numbers
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The user message
    #[arg(long, short)]
    pub prompt: String,

    /// A system message (without one, the model's chat template may insert its own)
    #[arg(long)]
    pub system: Option<String>,

    /// Most tokens to generate
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// Print the reply with token counts and timings as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy (deterministic)
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,

    /// Nucleus sampling: keep the most likely tokens up to this probability mass
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,

    /// Seed of the sampler (used when temperature > 0)
    #[arg(long, default_value_t = 299_792_458)]
    pub seed: u64,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Architecture, size, quantization, context, vocabulary, chat template and sha256
    Info {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// The text; special-token texts such as <|im_start|> become their ids
    pub text: String,

    /// Print ids and token strings as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode speed of the local engine, with peak memory
    Engine(BenchEngineArgs),
}

#[derive(Debug, Args)]
pub struct BenchEngineArgs {
    /// Prompt sizes to prefill, in tokens
    #[arg(long, value_delimiter = ',', default_value = "512,2048,5000")]
    pub prefill: Vec<usize>,

    /// Tokens to decode
    #[arg(long, default_value_t = 256)]
    pub decode: usize,

    /// Repetitions of each case (the median is reported)
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,

    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

use std::io::Write;

use anyhow::Result;
use memagent_engine::{GenerateOptions, Message};

use crate::cli::GenerateArgs;
use crate::settings::Settings;

pub fn run(global: &Settings, args: &GenerateArgs) -> Result<()> {
    let model = super::load_model(global)?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system.clone()));
    }
    messages.push(Message::user(args.prompt.clone()));
    let options = GenerateOptions {
        max_new_tokens: args.max_tokens,
        sampling: args.sampling.params(),
        draft_tokens: args.sampling.draft_tokens,
        ..GenerateOptions::default()
    };
    let reply = model.generate_chat(&messages, &options)?;
    if args.json {
        super::print_json(&reply)?;
    } else {
        writeln!(std::io::stdout().lock(), "{}", reply.text)?;
    }
    tracing::info!(
        "{} prompt tokens in {:.2}s ({:.0} tok/s), {} new tokens in {:.2}s ({:.1} tok/s), stop: {:?}",
        reply.prompt_tokens,
        reply.prefill_seconds,
        reply.prefill_tokens_per_second(),
        reply.completion_tokens,
        reply.decode_seconds,
        reply.decode_tokens_per_second(),
        reply.stop_reason
    );
    Ok(())
}

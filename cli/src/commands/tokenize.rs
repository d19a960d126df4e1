use std::io::Write;

use anyhow::Result;
use memagent_engine::{GgufFile, Tokenizer};

use crate::cli::TokenizeArgs;
use crate::settings::Settings;

/// The tokenizer `--tokenizer` names (a tokenizer.json or a GGUF file), else the model
/// file's (a GGUF file's header alone is read: no weights are loaded to tokenize); with
/// the file it came from.
pub fn tokenizer(global: &Settings) -> Result<(Tokenizer, std::path::PathBuf)> {
    Ok(match &global.tokenizer {
        Some(path) => (Tokenizer::from_file(path)?, path.clone()),
        None => {
            let model = global.model_path()?;
            (Tokenizer::from_gguf(&GgufFile::open(&model)?)?, model)
        }
    })
}

pub fn run(global: &Settings, args: &TokenizeArgs) -> Result<()> {
    let (tokenizer, _) = tokenizer(global)?;
    let ids = tokenizer.encode(&args.text, false)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let tokens: Vec<String> = ids
            .iter()
            .map(|&id| tokenizer.token_text(id).unwrap_or_default())
            .collect();
        let value = serde_json::json!({ "count": ids.len(), "ids": ids, "tokens": tokens });
        serde_json::to_writer_pretty(&mut out, &value)?;
        writeln!(out)?;
    } else {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", ids.join(" "))?;
    }
    Ok(())
}

use std::io::Write;

use anyhow::Result;
use memagent_engine::{GgufFile, Tokenizer};

use crate::cli::TokenizeArgs;
use crate::settings::Settings;

pub fn run(global: &Settings, args: &TokenizeArgs) -> Result<()> {
    let tokenizer = match &global.tokenizer {
        Some(json) => Tokenizer::from_json_file(json)?,
        // Only the header is read: no weights are loaded to tokenize.
        None => Tokenizer::from_gguf(&GgufFile::open(&global.model_path()?)?)?,
    };
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

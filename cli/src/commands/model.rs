use std::io::Write;

use anyhow::Result;
use memagent_engine::{sha256_file, ModelInfo};

use crate::cli::GlobalArgs;
use crate::settings;

pub fn info(global: &GlobalArgs, json: bool) -> Result<()> {
    let path = settings::model_path(global)?;
    let info = ModelInfo::read(&path)?;
    let sha256 = sha256_file(&path)?;
    let quantization: Vec<String> = info
        .quantization
        .iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect();
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(&info)?;
        value["sha256"] = sha256.into();
        value["quantization"] = serde_json::json!(info
            .quantization
            .iter()
            .map(|(t, n)| serde_json::json!({ "type": t, "tensors": n }))
            .collect::<Vec<_>>());
        serde_json::to_writer_pretty(&mut out, &value)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "path:           {}", info.path.display())?;
    writeln!(
        out,
        "name:           {}",
        info.name.as_deref().unwrap_or("-")
    )?;
    writeln!(out, "architecture:   {}", info.architecture)?;
    writeln!(
        out,
        "parameters:     {} ({:.1}M)",
        info.parameters,
        info.parameters as f64 / 1e6
    )?;
    writeln!(out, "quantization:   {}", quantization.join(", "))?;
    writeln!(out, "file size:      {} bytes", info.file_bytes)?;
    writeln!(out, "context length: {}", info.context_length)?;
    writeln!(out, "vocab size:     {}", info.vocab_size)?;
    writeln!(
        out,
        "layers:         {} (embedding {}, heads {}, kv heads {})",
        info.layers, info.embedding_length, info.heads, info.kv_heads
    )?;
    writeln!(out, "sha256:         {sha256}")?;
    match &info.chat_template {
        Some(t) => writeln!(out, "chat template:\n{t}")?,
        None => writeln!(out, "chat template:  (none)")?,
    }
    Ok(())
}

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
    let adapter = match super::adapter_path(global) {
        Some(file) => {
            let adapter = memagent_engine::Adapter::load(&file)?;
            let matches = adapter.manifest.base_sha256 == sha256;
            Some(serde_json::json!({
                "path": file, "projections": adapter.len(), "rank": adapter.manifest.rank,
                "base_sha256": adapter.manifest.base_sha256, "base_matches": matches,
            }))
        }
        None => None,
    };
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(&info)?;
        value["sha256"] = sha256.into();
        value["adapter"] = adapter.unwrap_or(serde_json::Value::Null);
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
    match &adapter {
        Some(a) => writeln!(
            out,
            "adapter:        {} ({} projections, rank {}, base {})",
            a["path"].as_str().unwrap_or("-"),
            a["projections"],
            a["rank"],
            if a["base_matches"] == true {
                "matches"
            } else {
                "DOES NOT MATCH"
            }
        )?,
        None => writeln!(out, "adapter:        none (base model)")?,
    }
    match &info.chat_template {
        Some(t) => writeln!(out, "chat template:\n{t}")?,
        None => writeln!(out, "chat template:  (none)")?,
    }
    Ok(())
}

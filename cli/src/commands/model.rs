use std::io::Write;

use anyhow::{bail, Result};
use memagent_engine::{
    default_adapter_path, default_reader_path, export_merged, sha256_file, AdapterChoice,
    GgmlDType, ModelInfo,
};

use crate::cli::{ExportType, ModelExportArgs};
use crate::settings::Settings;

/// The adapter file `choice` names for `model`, before any check of its base model.
fn adapter_file(model: &std::path::Path, choice: &AdapterChoice) -> Option<std::path::PathBuf> {
    chosen_file(choice, default_adapter_path(model))
}

/// The file `choice` names, `default` when it names the default and that file exists.
fn chosen_file(choice: &AdapterChoice, default: std::path::PathBuf) -> Option<std::path::PathBuf> {
    match choice {
        AdapterChoice::File(file) => Some(file.clone()),
        AdapterChoice::Default => Some(default).filter(|f| f.is_file()),
        AdapterChoice::None => None,
    }
}

/// What `model info` says of the reader: its file, whether it matches the model and
/// whether it learned answers from passages (else passage answers do not use it).
fn reader_info(
    model: &std::path::Path,
    choice: &AdapterChoice,
    sha256: &str,
) -> Result<Option<serde_json::Value>> {
    let Some(file) = chosen_file(choice, default_reader_path(model)) else {
        return Ok(None);
    };
    let reader = memagent_engine::Adapter::load(&file)?;
    let matches = reader.manifest.base_sha256 == sha256;
    let reads = memagent_agent::trained_for(&reader.manifest, memagent_agent::PASSAGE_ANSWER);
    Ok(Some(serde_json::json!({
        "path": file, "projections": reader.len(), "rank": reader.manifest.rank,
        "base_sha256": reader.manifest.base_sha256, "base_matches": matches,
        "default": *choice == AdapterChoice::Default,
        "applied": matches && reads,
        "answers": if reads { vec![memagent_agent::PASSAGE_ANSWER.id] } else { Vec::new() },
    })))
}

/// The templates of answers, which run with an adapter only when it learned them.
fn answer_templates() -> Vec<memagent_agent::Template> {
    use memagent_agent::*;
    vec![
        FINAL_BOXED,
        FINAL_EVAL,
        GENERAL_ANSWER,
        PASSAGE_ANSWER,
        DIRECT_BOXED,
        DIRECT_EVAL,
    ]
}

/// How prefill multiplies this file's weights on this CPU, in words, and the file's types
/// it multiplies in 8-bit integers.
fn prefill_path(info: &ModelInfo) -> Result<(String, Vec<String>)> {
    use memagent_engine::PrefillWeights;
    let capable = memagent_engine::integer_prefill_types();
    let integer: Vec<String> = info
        .quantization
        .iter()
        .map(|(t, _)| t.clone())
        .filter(|t| capable.contains(t))
        .collect();
    let chosen = super::prefill_weights()?;
    let said = match chosen {
        PrefillWeights::Copy => {
            "f32 GEMM on an f32 copy of the weights (MEMAGENT_PREFILL_WEIGHTS=copy)".to_string()
        }
        PrefillWeights::Tiles => {
            "f32 GEMM on blocks of dequantized weights (MEMAGENT_PREFILL_WEIGHTS=tiles)".to_string()
        }
        PrefillWeights::Integer if capable.is_empty() => {
            "f32 GEMM on blocks of dequantized weights (this CPU has neither AVX-512 VNNI nor \
             AVX2 for the 8-bit integer products)"
                .to_string()
        }
        PrefillWeights::Integer if integer.is_empty() => {
            "f32 GEMM on blocks of dequantized weights (no tensor of a type the 8-bit integer \
             products take)"
                .to_string()
        }
        PrefillWeights::Integer => format!(
            "8-bit integer products ({}) for its {} weights, f32 GEMM for other types",
            memagent_engine::integer_prefill_kernel().unwrap_or("portable"),
            integer.join(", ")
        ),
    };
    let integer = match chosen {
        PrefillWeights::Integer => integer,
        _ => Vec::new(),
    };
    Ok((said, integer))
}

pub fn info(global: &Settings, json: bool) -> Result<()> {
    let path = global.model_path()?;
    let info = ModelInfo::read(&path)?;
    let sha256 = sha256_file(&path)?;
    let quantization: Vec<String> = info
        .quantization
        .iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect();
    let choice = super::adapter_choice(global);
    let adapter = match adapter_file(&path, &choice) {
        Some(file) => {
            let adapter = memagent_engine::Adapter::load(&file)?;
            let matches = adapter.manifest.base_sha256 == sha256;
            Some(serde_json::json!({
                "path": file, "projections": adapter.len(), "rank": adapter.manifest.rank,
                "base_sha256": adapter.manifest.base_sha256, "base_matches": matches,
                "default": choice == AdapterChoice::Default,
                "applied": matches,
                "writer": adapter.manifest.writer(),
                "answers": answer_templates()
                    .into_iter()
                    .filter(|t| memagent_agent::trained_for(&adapter.manifest, *t))
                    .map(|t| t.id)
                    .collect::<Vec<_>>(),
            }))
        }
        None => None,
    };
    let reader = reader_info(&path, &super::reader_choice(global), &sha256)?;
    let (prefill, integer_types) = prefill_path(&info)?;
    // How decoding is set for this CPU: from the cache after the first load here.
    let decoding = match info.unsupported.is_empty() {
        true => super::load_model(global)
            .map(|m| m.decode_tuning().clone())
            .map_err(|e| format!("{e:#}")),
        false => Err("the model is not supported".to_string()),
    };
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(&info)?;
        value["sha256"] = sha256.into();
        value["prefill"] = prefill.into();
        value["prefill_integer_types"] = integer_types.into();
        value["adapter"] = adapter.unwrap_or(serde_json::Value::Null);
        value["reader"] = reader.unwrap_or(serde_json::Value::Null);
        value["decode_tuning"] = match &decoding {
            Ok(tuning) => serde_json::to_value(tuning)?,
            Err(e) => serde_json::json!({ "error": e }),
        };
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
    match info.unsupported.as_slice() {
        [] => writeln!(out, "supported:      yes")?,
        reasons => writeln!(out, "supported:      no: {}", reasons.join("; "))?,
    }
    writeln!(out, "prefill:        {prefill}")?;
    match &decoding {
        Ok(tuning) => writeln!(out, "decoding:       {tuning}")?,
        Err(e) => writeln!(out, "decoding:       not measured: {e}")?,
    }
    match &adapter {
        Some(a) => writeln!(
            out,
            "adapter:        {}{} ({} projections, rank {}, writer {}, base {})",
            if a["default"] == true { "default " } else { "" },
            a["path"].as_str().unwrap_or("-"),
            a["projections"],
            a["rank"],
            a["writer"].as_str().unwrap_or("not stated"),
            match (a["base_matches"] == true, a["default"] == true) {
                (true, _) => "matches",
                (false, true) => "does not match: not applied, the base model is used",
                (false, false) => "DOES NOT MATCH: loading is refused",
            }
        )?,
        None => writeln!(out, "adapter:        none (base model)")?,
    }
    if let Some(answers) = adapter.as_ref().and_then(|a| a["answers"].as_array()) {
        let ids: Vec<&str> = answers.iter().filter_map(|t| t.as_str()).collect();
        writeln!(
            out,
            "adapter runs:   memory steps{}; other answers and chats run the base model",
            match ids.as_slice() {
                [] => String::new(),
                ids => format!(", answers with {}", ids.join(", ")),
            }
        )?;
    }
    match &reader {
        Some(r) => writeln!(
            out,
            "reader:         {}{} ({} projections, rank {}, base {}): {}",
            if r["default"] == true { "default " } else { "" },
            r["path"].as_str().unwrap_or("-"),
            r["projections"],
            r["rank"],
            match (r["base_matches"] == true, r["default"] == true) {
                (true, _) => "matches",
                (false, true) => "does not match: not applied",
                (false, false) => "DOES NOT MATCH: loading is refused",
            },
            match r["applied"] == true {
                true => "answers from passages run with it",
                false => "not used",
            }
        )?,
        None => writeln!(
            out,
            "reader:         none (answers from passages run as above)"
        )?,
    }
    match &info.chat_template {
        Some(t) => writeln!(out, "chat template:\n{t}")?,
        None => match memagent_engine::builtin_template(&info.architecture) {
            Some(_) => writeln!(
                out,
                "chat template:  (none in the file; {}'s own chat format is used)",
                info.architecture
            )?,
            None => writeln!(out, "chat template:  (none)")?,
        },
    }
    Ok(())
}

pub fn export(global: &Settings, args: &ModelExportArgs) -> Result<()> {
    let path = global.model_path()?;
    // export_merged checks the adapter's base model itself (one hash of the model file).
    let file = adapter_file(&path, &super::adapter_choice(global));
    let Some(adapter) = file
        .map(|f| memagent_engine::Adapter::load(&f))
        .transpose()?
    else {
        bail!(
            "no adapter to merge into {}: pass --adapter FILE (memctl train's adapter.safetensors), \
             or place the default adapter at {}",
            path.display(),
            default_adapter_path(&path).display()
        );
    };
    let dtype = match args.dtype {
        ExportType::Q8_0 => GgmlDType::Q8_0,
        ExportType::F16 => GgmlDType::F16,
        ExportType::F32 => GgmlDType::F32,
    };
    if !args.json {
        eprintln!(
            "merging {} into {} ...",
            adapter.path.display(),
            path.display()
        );
    }
    let report = export_merged(&path, &adapter, &args.out, dtype)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "wrote {} ({} tensors, {} merged as {}, {} bytes)",
            report.path.display(),
            report.tensors,
            report.merged,
            report.dtype,
            report.bytes
        )?;
    }
    Ok(())
}

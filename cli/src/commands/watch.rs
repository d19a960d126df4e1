//! `memctl watch add|list|rm`: the `[[watch]]` tables of the configuration file, edited
//! in place so that comments and other keys survive.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use toml_edit::{Array, ArrayOfTables, DocumentMut, Item, Table};

use super::print_json;
use crate::cli::WatchCommand;
use crate::settings::{config_path, ConfigFile, Settings};

pub fn run(global: &Settings, command: &WatchCommand) -> Result<()> {
    let path = config_path(global)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let config = ConfigFile::parse(&text, &path)?;
    let mut out = std::io::stdout().lock();
    match command {
        WatchCommand::List { json } => {
            if *json {
                return print_json(&config.watch);
            }
            if config.watch.is_empty() {
                writeln!(
                    out,
                    "nothing is watched; add a path with `memctl watch add PATH`"
                )?;
            }
            for (i, w) in config.watch.iter().enumerate() {
                writeln!(
                    out,
                    "{i}: {} -> {} ({}{}{}{})",
                    w.path.display(),
                    w.stream.as_deref().unwrap_or("one stream per file"),
                    serde_json::to_value(w.format)?.as_str().unwrap_or("auto"),
                    if w.recursive { ", recursive" } else { "" },
                    if w.include.is_empty() {
                        String::new()
                    } else {
                        format!(", include {:?}", w.include)
                    },
                    if w.exclude.is_empty() {
                        String::new()
                    } else {
                        format!(", exclude {:?}", w.exclude)
                    },
                )?;
                for question in &w.ask {
                    writeln!(out, "   asks: {question}")?;
                }
            }
            Ok(())
        }
        WatchCommand::Add {
            path: target,
            stream,
            format,
            include,
            exclude,
            no_recursive,
            ask,
        } => {
            let absolute = std::fs::canonicalize(target)
                .with_context(|| format!("cannot watch {}", target.display()))?;
            let mut doc: DocumentMut = text.parse().context("configuration is not TOML")?;
            let mut table = Table::new();
            table.insert("path", toml_edit::value(absolute.display().to_string()));
            if let Some(stream) = stream {
                table.insert("stream", toml_edit::value(stream.as_str()));
            }
            table.insert("format", toml_edit::value(format.as_str()));
            for (key, globs) in [("include", include), ("exclude", exclude), ("ask", ask)] {
                if !globs.is_empty() {
                    table.insert(key, toml_edit::value(globs.iter().collect::<Array>()));
                }
            }
            table.insert("recursive", toml_edit::value(!no_recursive));
            watches(&mut doc)?.push(table);
            save(&path, &doc)?;
            writeln!(out, "watching {}", absolute.display())?;
            Ok(())
        }
        WatchCommand::Rm { path: which } => {
            let index = match which.parse::<usize>() {
                Ok(i) if i < config.watch.len() => i,
                _ => {
                    let wanted = std::fs::canonicalize(which).unwrap_or_else(|_| which.into());
                    match config
                        .watch
                        .iter()
                        .position(|w| w.path == Path::new(which) || w.path == wanted)
                    {
                        Some(i) => i,
                        None => {
                            bail!("`{which}` is not watched; `memctl watch list` shows what is")
                        }
                    }
                }
            };
            let mut doc: DocumentMut = text.parse().context("configuration is not TOML")?;
            watches(&mut doc)?.remove(index);
            save(&path, &doc)?;
            writeln!(
                out,
                "stopped watching {}",
                config.watch[index].path.display()
            )?;
            Ok(())
        }
    }
}

/// The document's `[[watch]]` array, created when missing.
fn watches(doc: &mut DocumentMut) -> Result<&mut ArrayOfTables> {
    let item = doc
        .entry("watch")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()));
    item.as_array_of_tables_mut()
        .context("`watch` in the configuration must be a list of [[watch]] tables")
}

/// Validates the new configuration, then replaces the file atomically.
fn save(path: &Path, doc: &DocumentMut) -> Result<()> {
    let text = doc.to_string();
    ConfigFile::parse(&text, path)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

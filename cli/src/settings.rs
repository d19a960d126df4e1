//! Resolution of flags, environment and the configuration file into settings.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::cli::GlobalArgs;

/// File name of the default model, as `scripts/fetch-model` installs it.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The configuration file (TOML). Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Path of the GGUF model.
    pub model: Option<PathBuf>,
    /// Where streams and memories are stored.
    pub data_dir: Option<PathBuf>,
    /// What the daemon watches (`[[watch]]` tables).
    #[serde(default)]
    pub watch: Vec<WatchConfig>,
}

/// How a watched file's bytes become text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WatchFormat {
    /// From the extension: `.jsonl` is chat-jsonl, `.md` markdown, else text.
    #[default]
    Auto,
    Text,
    Markdown,
    /// One OpenAI-style message (`{"role": …, "content": …}`) per line.
    ChatJsonl,
}

/// One `[[watch]]` entry: a file or folder the daemon feeds into streams.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    /// An absolute path to a file or a folder.
    pub path: PathBuf,
    /// The stream everything goes to; without it, one stream per file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default)]
    pub format: WatchFormat,
    /// Glob patterns (relative to `path`) of files to take; empty takes all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Glob patterns of files to leave out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Descend into subfolders.
    #[serde(default = "yes")]
    pub recursive: bool,
}

fn yes() -> bool {
    true
}

/// The configuration file's path: `--config` (or `MEMAGENT_CONFIG`), else
/// `$XDG_CONFIG_HOME/memagent/config.toml`.
pub fn config_path(global: &GlobalArgs) -> Result<PathBuf> {
    match &global.config {
        Some(p) => Ok(p.clone()),
        None => match dirs::config_dir() {
            Some(dir) => Ok(dir.join("memagent").join("config.toml")),
            None => bail!("no configuration folder: pass --config PATH"),
        },
    }
}

impl ConfigFile {
    /// Parses and validates configuration text; errors name the file and the key.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let config: Self = toml::from_str(text)
            .with_context(|| format!("invalid configuration file {}", path.display()))?;
        config
            .validate()
            .with_context(|| format!("invalid configuration file {}", path.display()))?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        for (i, watch) in self.watch.iter().enumerate() {
            if !watch.path.is_absolute() {
                bail!(
                    "watch[{i}].path `{}` must be an absolute path",
                    watch.path.display()
                );
            }
            if let Some(stream) = &watch.stream {
                if stream.is_empty() || stream.chars().any(char::is_control) {
                    bail!("watch[{i}].stream `{stream}` is not a valid stream name");
                }
            }
            for (key, globs) in [("include", &watch.include), ("exclude", &watch.exclude)] {
                for (j, glob) in globs.iter().enumerate() {
                    globset::Glob::new(glob)
                        .with_context(|| format!("watch[{i}].{key}[{j}] `{glob}` is not a glob"))?;
                }
            }
            if let Some(first) = self.watch[..i].iter().position(|w| w.path == watch.path) {
                bail!(
                    "watch[{i}].path `{}` is watched already by watch[{first}]",
                    watch.path.display()
                );
            }
        }
        Ok(())
    }

    fn load(explicit: Option<&Path>) -> Result<Self> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => match dirs::config_dir() {
                Some(dir) => dir.join("memagent").join("config.toml"),
                None => return Ok(Self::default()),
            },
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
                Ok(Self::default())
            }
            Err(e) => {
                Err(e).with_context(|| format!("cannot read configuration file {}", path.display()))
            }
        }
    }
}

/// Finds the model: `--model`, then `MEMAGENT_MODEL`, then the config file, then the
/// default file in `./models`, beside the executable's checkout, or the user data folder.
pub fn model_path(global: &GlobalArgs) -> Result<PathBuf> {
    let chosen = match &global.model {
        Some(p) => Some((p.clone(), "--model")),
        None => match std::env::var_os("MEMAGENT_MODEL").filter(|v| !v.is_empty()) {
            Some(p) => Some((PathBuf::from(p), "MEMAGENT_MODEL")),
            None => ConfigFile::load(global.config.as_deref())?
                .model
                .map(|p| (p, "the configuration file")),
        },
    };
    if let Some((path, source)) = chosen {
        if !path.is_file() {
            bail!(
                "model not found at {} (from {source}); check the path",
                path.display()
            );
        }
        return Ok(path);
    }
    let candidates = default_model_candidates();
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "model not found (looked in {}); run scripts/fetch-model in the memagent checkout, \
         or pass --model PATH",
        looked.join(", ")
    )
}

fn default_model_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        out.push(cwd.join("models").join(DEFAULT_MODEL_FILE));
    }
    // target/{debug,release}/memctl inside a checkout: the checkout's models/ folder.
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            let p = dir.join("models").join(DEFAULT_MODEL_FILE);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    if let Some(data) = dirs::data_dir() {
        out.push(
            data.join("memagent")
                .join("models")
                .join(DEFAULT_MODEL_FILE),
        );
    }
    out
}

/// The data directory: `--data-dir`, then `MEMAGENT_DATA_DIR`, then the config file, then
/// `$XDG_DATA_HOME/memagent/data`.
pub fn data_dir(global: &GlobalArgs) -> Result<PathBuf> {
    if let Some(dir) = &global.data_dir {
        return Ok(dir.clone());
    }
    if let Some(dir) = std::env::var_os("MEMAGENT_DATA_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = ConfigFile::load(global.config.as_deref())?.data_dir {
        return Ok(dir);
    }
    match dirs::data_dir() {
        Some(data) => Ok(data.join("memagent").join("data")),
        None => bail!("no data directory: pass --data-dir DIR or set MEMAGENT_DATA_DIR"),
    }
}

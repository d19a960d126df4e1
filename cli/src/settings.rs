//! Resolution of flags, environment and the configuration file into one settings value:
//! [`Settings::resolve`] reads the environment and the configuration file once, at
//! start, and every command gets the result.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

pub use memagent_watcher::WatchConfig;

use crate::cli::{BackendKind, GlobalArgs};

/// File name of the default model, as `scripts/fetch-model` installs it.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The configuration file (TOML). Every key is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Path of the GGUF model.
    pub model: Option<PathBuf>,
    /// Where streams and memories are stored.
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL to keep streams in (postgres://user@host:port/dbname); a password in
    /// it only when the file is readable by its owner alone (mode 0600), else from
    /// $PGPASSWORD.
    pub database: Option<String>,
    /// Megabytes kept free on the data directory's filesystem: a write that would leave
    /// less is refused, and reads go on [default: 64].
    pub reserve_mb: Option<f64>,
    /// The sentence embedder's folder (`none`: passages are searched by words alone).
    pub embedder: Option<String>,
    /// Whether the search keeps each passage's telling words' states and ranks the best
    /// found again by them (late interaction) [default: true]. `false`: a smaller index
    /// (about 15 MB per 1M tokens of prose instead of 51) that finds less in
    /// conversations; changing it makes the index again from the logs.
    pub late_interaction: Option<bool>,
    /// The model backend for the memory loop (`[backend]`); flags and environment
    /// variables win over it.
    #[serde(default)]
    pub backend: BackendConfig,
    /// Overrides of the model's profile (`[profile]`).
    #[serde(default)]
    pub profile: ProfileConfig,
    /// How the daemon runs (`[daemon]`).
    #[serde(default)]
    pub daemon: DaemonConfig,
    /// What the daemon watches (`[[watch]]` tables).
    #[serde(default)]
    pub watch: Vec<WatchConfig>,
    /// The OpenAI-compatible proxy the daemon serves (`[proxy]`); off without it.
    pub proxy: Option<ProxyConfig>,
    /// How questions are answered where a request does not say (`[query]`).
    #[serde(default)]
    pub query: QueryConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryConfig {
    /// Rank the best N passages found for a question again by the local model's
    /// likelihood of it (`memctl query --rerank N`) wherever a question does not say:
    /// `memctl query`, MCP `recall`, the daemon's `/v1/query` and its proxy; 0 or absent:
    /// the search's order.
    pub rerank: Option<usize>,
}

impl ConfigFile {
    /// Passages the daemon's proxy ranks again: `[proxy] rerank`, else `[query] rerank`.
    pub fn proxy_rerank(&self) -> usize {
        self.proxy
            .as_ref()
            .and_then(|p| p.rerank)
            .or(self.query.rerank)
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// The proxy's TCP address (`PORT` alone binds 127.0.0.1).
    pub listen: String,
    /// The bearer token (the API key of its clients); $MEMAGENT_PROXY_TOKEN wins.
    pub token: Option<String>,
    /// The OpenAI-compatible server to forward to (its base URL, e.g.
    /// http://localhost:8000/v1); without one the daemon's model answers.
    pub upstream: Option<String>,
    /// The environment variable holding the upstream's API key, if it needs one.
    pub upstream_api_key_env: Option<String>,
    /// Rank the best N passages found for each request again by the local model's
    /// likelihood of its latest user message (as `memctl query --rerank N`); 0: the
    /// search's order; absent: `[query] rerank`.
    pub rerank: Option<usize>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// `local` or `openai`.
    pub kind: Option<BackendKind>,
    pub base_url: Option<String>,
    pub remote_model: Option<String>,
    pub context_tokens: Option<usize>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    pub chunk_tokens: Option<usize>,
    pub memory_tokens: Option<usize>,
    pub answer_tokens: Option<usize>,
    /// How the general memory is written: `rewrite` or `lines`.
    pub writer: Option<String>,
    /// How question-mode steps read their chunk: `focused` or `whole`.
    pub reading: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Seconds without new content before a partial chunk is read [default: 30].
    pub idle_seconds: Option<f64>,
    /// Seconds between full rescans of the watches [default: 60].
    pub rescan_seconds: Option<f64>,
    /// A TCP address for the API (`PORT` alone binds 127.0.0.1); off by default.
    pub listen: Option<String>,
    /// The bearer token TCP requests must carry (required with `listen`).
    pub token: Option<String>,
    /// Seconds a write through the API or the proxy may take before it is reported
    /// as failed and the store as degraded [default: 30].
    pub write_timeout_seconds: Option<f64>,
    /// Seconds the daemon takes at most to stop after SIGTERM [default: 10].
    pub stop_timeout_seconds: Option<f64>,
    /// This daemon's name in the leases of a shared database [default: HOST:PID].
    pub name: Option<String>,
    /// Seconds a stream's lease lasts unless renewed, in a shared database [default: 30].
    pub lease_seconds: Option<f64>,
    /// Whether the model reads each stream's newest passages ahead while idle (up to the
    /// 1 GiB it keeps of them), so that requests ranking passages again (`rerank`) read
    /// only their question [default: true when `[query]` or `[proxy]` sets `rerank`,
    /// else false].
    pub read_ahead: Option<bool>,
}

/// The configuration file's path: `--config` (or `MEMAGENT_CONFIG`), else
/// `$XDG_CONFIG_HOME/memagent/config.toml`.
pub fn config_path(global: &GlobalArgs) -> Result<PathBuf> {
    match &global.config {
        Some(p) => Ok(p.clone()),
        None => match default_config_path() {
            Some(path) => Ok(path),
            None => bail!("no configuration folder: pass --config PATH"),
        },
    }
}

/// `$XDG_CONFIG_HOME/memagent/config.toml`, where the configuration folder is known.
fn default_config_path() -> Option<PathBuf> {
    Some(dirs::config_dir()?.join("memagent").join("config.toml"))
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
        memagent_watcher::validate_watches(&self.watch)?;
        for (key, value) in [
            ("daemon.idle_seconds", self.daemon.idle_seconds),
            ("daemon.rescan_seconds", self.daemon.rescan_seconds),
        ] {
            if let Some(v) = value {
                if !(v > 0.0 && v.is_finite()) {
                    bail!("{key}: {v} is not a positive number of seconds");
                }
            }
        }
        for (key, value) in [
            ("profile.chunk_tokens", self.profile.chunk_tokens),
            ("profile.memory_tokens", self.profile.memory_tokens),
            ("profile.answer_tokens", self.profile.answer_tokens),
        ] {
            if value == Some(0) {
                bail!("{key}: must be at least 1");
            }
        }
        let max = memagent_memory::RERANK_MAX;
        let proxy_rerank = self.proxy.as_ref().and_then(|p| p.rerank);
        for (key, value) in [
            ("query.rerank", self.query.rerank),
            ("proxy.rerank", proxy_rerank),
        ] {
            if value.unwrap_or(0) > max {
                bail!("{key}: must be at most {max} (passages ranked again)");
            }
        }
        if let Some(proxy) = &self.proxy {
            listen_addr(&proxy.listen).context("proxy.listen")?;
            if let Some(upstream) = &proxy.upstream {
                if !(upstream.starts_with("http://") || upstream.starts_with("https://")) {
                    bail!(
                        "proxy.upstream: `{upstream}` is not an http(s) URL; give the server's \
                         base URL, e.g. http://localhost:8000/v1"
                    );
                }
            }
        }
        if let Some(listen) = &self.daemon.listen {
            listen_addr(listen).context("daemon.listen")?;
            if self.daemon.token.as_deref().is_none_or(str::is_empty) {
                bail!("daemon.token: required with daemon.listen (TCP requests must carry it)");
            }
        }
        Ok(())
    }

    /// A password in `database` only in a file that only its owner can read.
    fn check_secrets(&self, path: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let Some(url) = &self.database else {
            return Ok(());
        };
        let has_password = memagent_store::postgres::url_has_password(url);
        let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
        if has_password && mode & 0o077 != 0 {
            bail!(
                "{}: `database` holds a password and the file can be read by others (mode \
                 {:o}); run `chmod 600 {}`, or take the password out of the URL and set \
                 PGPASSWORD",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
        Ok(())
    }

    fn load(explicit: Option<&Path>) -> Result<Self> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => match default_config_path() {
                Some(path) => path,
                None => return Ok(Self::default()),
            },
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let config = Self::parse(&text, &path)?;
                config.check_secrets(&path)?;
                Ok(config)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
                Ok(Self::default())
            }
            Err(e) => {
                Err(e).with_context(|| format!("cannot read configuration file {}", path.display()))
            }
        }
    }
}

/// Flags, environment and the configuration file, resolved once: what every command
/// reads its model, embedder, data directory and configuration from. Derefs to the
/// global flags.
#[derive(Debug, Clone)]
pub struct Settings {
    args: GlobalArgs,
    /// The configuration file, read and parsed at start; its error is reported by the
    /// first command that needs it, so a broken file stops only those.
    config: std::result::Result<ConfigFile, String>,
    /// `MEMAGENT_MODEL` and `MEMAGENT_DATA_DIR` as they were at start (empty: unset).
    model_env: Option<PathBuf>,
    data_dir_env: Option<PathBuf>,
}

impl std::ops::Deref for Settings {
    type Target = GlobalArgs;

    fn deref(&self) -> &GlobalArgs {
        &self.args
    }
}

impl Settings {
    /// Reads the environment and the configuration file (`--config`, else the default
    /// file when it exists) once.
    pub fn resolve(args: GlobalArgs) -> Self {
        let env = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Self {
            config: ConfigFile::load(args.config.as_deref())
                .map_err(|e| crate::commands::error_text(&e)),
            model_env: env("MEMAGENT_MODEL"),
            data_dir_env: env("MEMAGENT_DATA_DIR"),
            args,
        }
    }

    /// The configuration file's settings (every key unset when there is no file); an
    /// error when the file cannot be read or is invalid, naming the file and the key.
    pub fn config(&self) -> Result<&ConfigFile> {
        self.config.as_ref().map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// The model: `--model`, then `MEMAGENT_MODEL`, then the config file, then the
    /// default file in `./models`, beside the executable's checkout, or the user data
    /// folder.
    pub fn model_path(&self) -> Result<PathBuf> {
        let chosen = match (&self.args.model, &self.model_env) {
            (Some(p), _) => Some((p.clone(), "--model")),
            (None, Some(p)) => Some((p.clone(), "MEMAGENT_MODEL")),
            (None, None) => self
                .config()?
                .model
                .clone()
                .map(|p| (p, "the configuration file")),
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
            "model not found (looked in {}); run scripts/fetch-model in the memagent \
             checkout, or pass --model PATH",
            looked.join(", ")
        )
    }

    /// The sentence embedder: `--embedder` (or `MEMAGENT_EMBEDDER`), then the config
    /// file, then `models/all-MiniLM-L6-v2/` where the model is looked for. `None` when
    /// asked for `none`: search by words alone.
    pub fn embedder_dir(&self) -> Result<Option<PathBuf>> {
        let chosen = match &self.args.embedder {
            Some(e) => Some((e.clone(), "--embedder or MEMAGENT_EMBEDDER")),
            None => self
                .config()?
                .embedder
                .clone()
                .map(|e| (e, "the configuration file")),
        };
        if let Some((choice, source)) = chosen {
            if choice == "none" {
                return Ok(None);
            }
            let dir = PathBuf::from(choice);
            if !dir.join("model.safetensors").is_file() {
                bail!(
                    "embedder not found at {} (from {source}): it needs model.safetensors, \
                     tokenizer.json and config.json; run scripts/fetch-model, or pass \
                     --embedder none to search by words alone",
                    dir.display()
                );
            }
            return Ok(Some(dir));
        }
        let candidates: Vec<PathBuf> = default_model_candidates()
            .into_iter()
            .filter_map(|p| Some(p.parent()?.join(DEFAULT_EMBEDDER_DIR)))
            .collect();
        if let Some(found) = candidates
            .iter()
            .find(|p| p.join("model.safetensors").is_file())
        {
            return Ok(Some(found.clone()));
        }
        let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        bail!(
            "sentence embedder not found (looked in {}); run scripts/fetch-model in the \
             memagent checkout, pass --embedder DIR, or --embedder none to search by words \
             alone",
            looked.join(", ")
        )
    }

    /// Bytes kept free on the data directory's filesystem (see
    /// [`memagent_store::Store::set_reserve`]): `MEMAGENT_RESERVE_MB`, then `reserve_mb`
    /// in the config file, then [`memagent_store::DEFAULT_RESERVE`].
    pub fn reserve(&self) -> Result<u64> {
        let (mb, source) = match std::env::var("MEMAGENT_RESERVE_MB") {
            Ok(v) if !v.is_empty() => (
                v.parse::<f64>()
                    .map_err(|_| anyhow::anyhow!("MEMAGENT_RESERVE_MB is not a number: {v:?}"))?,
                "MEMAGENT_RESERVE_MB",
            ),
            _ => match self.config()?.reserve_mb {
                Some(mb) => (mb, "reserve_mb in the configuration file"),
                None => return Ok(memagent_store::DEFAULT_RESERVE),
            },
        };
        if !(mb >= 0.0 && mb.is_finite()) {
            bail!("{source} must be a number of megabytes, 0 or more (got {mb})");
        }
        Ok((mb * 1e6) as u64)
    }

    /// The PostgreSQL database streams are kept in: `--database` (or
    /// `MEMAGENT_DATABASE`), then `database` in the config file; `None`: the embedded
    /// database in the data directory.
    pub fn database(&self) -> Result<Option<String>> {
        if let Some(url) = self.args.database.as_ref().filter(|u| !u.is_empty()) {
            return Ok(Some(url.clone()));
        }
        Ok(self.config()?.database.clone())
    }

    /// The store: the embedded database in the data directory, or PostgreSQL when one
    /// is configured, with the reserve of free space set.
    pub fn open_store(&self) -> Result<memagent_store::Store> {
        let dir = self.data_dir()?;
        let store = memagent_store::Store::open_with(&dir, self.database()?.as_deref())?;
        store.set_reserve(self.reserve()?);
        Ok(store)
    }

    /// The data directory: `--data-dir`, then `MEMAGENT_DATA_DIR`, then the config file,
    /// then `$XDG_DATA_HOME/memagent/data`.
    pub fn data_dir(&self) -> Result<PathBuf> {
        if let Some(dir) = self.args.data_dir.as_ref().or(self.data_dir_env.as_ref()) {
            return Ok(dir.clone());
        }
        if let Some(dir) = &self.config()?.data_dir {
            return Ok(dir.clone());
        }
        match dirs::data_dir() {
            Some(data) => Ok(data.join("memagent").join("data")),
            None => bail!("no data directory: pass --data-dir DIR or set MEMAGENT_DATA_DIR"),
        }
    }
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

/// Folder of the default sentence embedder, as `scripts/fetch-model` installs it.
pub const DEFAULT_EMBEDDER_DIR: &str = "all-MiniLM-L6-v2";

/// A TCP address from `PORT` (on 127.0.0.1) or `HOST:PORT`.
pub fn listen_addr(text: &str) -> Result<std::net::SocketAddr> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse()
        .with_context(|| format!("`{text}` is neither a port nor an address like 127.0.0.1:8765"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    /// Settings from `memctl ARGS tokenize x`, without the environment's model and data
    /// directory.
    fn settings(args: &[&str]) -> Settings {
        let mut argv = vec!["memctl"];
        argv.extend(args);
        argv.extend(["tokenize", "x"]);
        let mut s = Settings::resolve(Cli::try_parse_from(argv).unwrap().global);
        (s.model_env, s.data_dir_env) = (None, None);
        s
    }

    #[test]
    fn the_configuration_file_is_read_once_at_start() {
        let dir = std::env::temp_dir().join(format!("memctl-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (model, data, config) = (
            dir.join("m.gguf"),
            dir.join("data"),
            dir.join("config.toml"),
        );
        std::fs::write(&model, b"").unwrap();
        let text = format!(
            "model = {model:?}\ndata_dir = {data:?}\nembedder = \"none\"\n",
            model = model.display().to_string(),
            data = data.display().to_string()
        );
        std::fs::write(&config, text).unwrap();
        let s = settings(&["--config", config.to_str().unwrap()]);
        // Gone after start: everything still comes from what was read then.
        std::fs::remove_file(&config).unwrap();
        assert_eq!(s.model_path().unwrap(), model);
        assert_eq!(s.data_dir().unwrap(), data);
        assert_eq!(s.embedder_dir().unwrap(), None);
        // Flags win over the file.
        let s = settings(&["--data-dir", "/elsewhere", "--embedder", "none"]);
        assert_eq!(s.data_dir().unwrap(), PathBuf::from("/elsewhere"));

        // A broken file stops only what needs it, with its name and the key.
        std::fs::write(&config, "data_dir = 3\n").unwrap();
        let s = settings(&["--config", config.to_str().unwrap()]);
        let err = format!("{:#}", s.model_path().unwrap_err());
        assert!(
            err.contains("config.toml") && err.contains("data_dir"),
            "{err}"
        );
        let s = settings(&["--config", config.to_str().unwrap(), "--data-dir", "/d"]);
        assert_eq!(s.data_dir().unwrap(), PathBuf::from("/d"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_proxy_ranking_more_passages_again_than_the_limit_is_refused() {
        let path = Path::new("/etc/memagent/config.toml");
        let proxy = |rerank: usize| format!("[proxy]\nlisten = \"8766\"\nrerank = {rerank}\n");
        let max = memagent_memory::RERANK_MAX;
        let config = ConfigFile::parse(&proxy(max), path).unwrap();
        assert_eq!(config.proxy.unwrap().rerank, Some(max));
        let err = format!(
            "{:#}",
            ConfigFile::parse(&proxy(max + 1), path).unwrap_err()
        );
        assert!(
            err.contains("config.toml")
                && err.contains(&format!("proxy.rerank: must be at most {max}")),
            "{err}"
        );
    }

    /// `[query] rerank` is every surface's default, the proxy's too unless `[proxy]` says,
    /// within the same limit.
    #[test]
    fn a_query_rerank_is_the_default_of_the_proxy_too_within_the_limit() {
        let path = Path::new("/etc/memagent/config.toml");
        let max = memagent_memory::RERANK_MAX;
        let config = ConfigFile::parse("[query]\nrerank = 20\n", path).unwrap();
        assert_eq!(config.query.rerank, Some(20));
        let proxy = "[proxy]\nlisten = \"8766\"\n";
        let config = ConfigFile::parse(&format!("[query]\nrerank = 20\n{proxy}"), path).unwrap();
        assert_eq!(config.proxy_rerank(), 20);
        let own = format!("[query]\nrerank = 20\n{proxy}rerank = 0\n");
        assert_eq!(ConfigFile::parse(&own, path).unwrap().proxy_rerank(), 0);
        assert_eq!(ConfigFile::parse(proxy, path).unwrap().proxy_rerank(), 0);
        let over = format!("[query]\nrerank = {}\n", max + 1);
        let err = format!("{:#}", ConfigFile::parse(&over, path).unwrap_err());
        assert!(
            err.contains("config.toml")
                && err.contains(&format!("query.rerank: must be at most {max}")),
            "{err}"
        );
    }

    /// A configuration file's lines, right and wrong: known keys with values of every
    /// kind, unknown keys, tables, broken TOML.
    fn config_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let key = prop::sample::select(vec![
            "model",
            "data_dir",
            "embedder",
            "reserve_mb",
            "idle_seconds",
            "rescan_seconds",
            "listen",
            "token",
            "write_timeout_seconds",
            "chunk_tokens",
            "path",
            "stream",
            "format",
            "include",
            "ask",
            "upstream",
            "rerank",
            "read_ahead",
            "kind",
            "unknown_key",
        ]);
        let value = prop_oneof![
            Just("\"/tmp/x\"".to_string()),
            Just("\"127.0.0.1:99999\"".to_string()),
            Just("\"http://localhost:8000/v1\"".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| format!("{f:?}")),
            Just("nan".to_string()),
            Just("-inf".to_string()),
            Just("[\"*.md\", 3]".to_string()),
            Just("true".to_string()),
            any::<String>().prop_map(|s| format!("{s:?}")),
        ];
        let line = prop_oneof![
            (key, value).prop_map(|(k, v)| format!("{k} = {v}")),
            prop::sample::select(vec![
                "[daemon]",
                "[profile]",
                "[backend]",
                "[proxy]",
                "[query]",
                "[[watch]]",
                "[nope]",
                "[[",
            ])
            .prop_map(str::to_string),
            any::<String>(),
        ];
        prop::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n"))
    }

    proptest::proptest! {
        /// Fuzzing the configuration file: any text parses, or the error names the file.
        /// 256 cases by default; `PROPTEST_CASES=100000` for a longer run.
        #[test]
        fn any_configuration_text_parses_or_names_the_file(text in config_text()) {
            let path = Path::new("/etc/memagent/config.toml");
            if let Err(e) = ConfigFile::parse(&text, path) {
                proptest::prop_assert!(format!("{e:#}").contains("config.toml"), "{e:#}");
            }
        }
    }
}

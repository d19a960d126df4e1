//! One module per command; each calls the libraries and owns its output.

mod ask;
pub(crate) mod client;
mod daemon;
pub(crate) mod db;
mod generate;
mod mcp;
mod model;
pub(crate) mod recall;
pub(crate) mod streams;
pub(crate) mod tokenize;
mod watch;

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use memagent_agent::{
    MemoryAgent, OpenAiBackend, Profile, RemoteOptions, RemoteTokenizer, TextTokenizer,
};
use memagent_engine::tuning::Prefetch;
use memagent_engine::{
    open_device, AdapterChoice, LoadOptions, LocalModel, PrefillWeights, SamplingParams, Tokenizer,
    WeightPlan,
};

use crate::cli::{
    BackendArgs, BackendKind, Command, DaemonCommand, LoopArgs, ModelCommand, ProfileArgs,
    SamplingArgs,
};
use crate::settings;
use crate::settings::Settings;

/// Runs a user-facing command (`bench` and `train` are [`crate::harness`]'s).
pub fn run(global: &Settings, command: Command) -> Result<()> {
    match command {
        Command::Ask(args) => ask::run(global, &args),
        Command::Ingest(args) => streams::ingest(global, &args),
        Command::Query(args) => streams::query(global, &args),
        Command::Search(args) => recall::search(global, &args),
        Command::Index(command) => recall::index(global, &command),
        Command::Memory(command) => streams::memory(global, &command),
        Command::Streams(command) => streams::streams(global, &command),
        Command::Daemon(DaemonCommand::Run(args)) => daemon::run(global, &args),
        Command::Daemon(DaemonCommand::Status { json }) => daemon::status(global, json),
        Command::Watch(command) => watch::run(global, &command),
        Command::Export { stream } => streams::export(global, &stream),
        Command::Import { file, stream } => {
            streams::import(global, file.as_deref(), stream.as_deref())
        }
        Command::Generate(args) => generate::run(global, &args),
        Command::Model(ModelCommand::Info { json }) => model::info(global, json),
        Command::Model(ModelCommand::Export(args)) => model::export(global, &args),
        Command::Tokenize(args) => tokenize::run(global, &args),
        Command::Bench(_) | Command::Train(_) => {
            unreachable!("main sends bench and train to the harness")
        }
        Command::Mcp(args) => mcp::run(global, &args),
        Command::Answers { stream, json } => streams::answers(global, &stream, json),
    }
}

/// The adapter `--adapter` names: a file; `none` for the base model alone; unset for
/// the model's default adapter (when it matches the model file).
pub fn adapter_choice(global: &Settings) -> AdapterChoice {
    choice(global.adapter.as_deref())
}

/// The reader `--reader` names, as [`adapter_choice`].
pub fn reader_choice(global: &Settings) -> AdapterChoice {
    choice(global.reader.as_deref())
}

fn choice(named: Option<&str>) -> AdapterChoice {
    match named {
        None => AdapterChoice::Default,
        Some("none") | Some("") => AdapterChoice::None,
        Some(path) => AdapterChoice::File(std::path::PathBuf::from(path)),
    }
}

/// How prefill multiplies the weights: $MEMAGENT_PREFILL_WEIGHTS, for comparisons with
/// the default `integer` (8-bit products on the file's own blocks): `tiles` (blocks
/// dequantized inside the GEMM) or `copy` (an f32 copy of the weights).
pub(crate) fn prefill_weights() -> Result<PrefillWeights> {
    match std::env::var("MEMAGENT_PREFILL_WEIGHTS").ok().as_deref() {
        None | Some("") | Some("integer") => Ok(PrefillWeights::Integer),
        Some("tiles") => Ok(PrefillWeights::Tiles),
        Some("copy") => Ok(PrefillWeights::Copy),
        Some(other) => anyhow::bail!(
            "MEMAGENT_PREFILL_WEIGHTS={other}: use integer (8-bit products on the file's own \
             weights where the CPU has AVX-512 VNNI or AVX2, the default), tiles (blocks \
             dequantized to f32 inside the GEMM) or copy (an f32 copy of the weights)"
        ),
    }
}

/// How decoding's prefetch distance is chosen: `MEMAGENT_PREFETCH_AHEAD` bytes when set,
/// else measured once per CPU and model file and kept in
/// `$XDG_CACHE_HOME/memagent/decode-tuning.json` (else `~/.cache/memagent/`).
pub(crate) fn prefetch_choice() -> Result<Prefetch> {
    let by = "MEMAGENT_PREFETCH_AHEAD";
    if let Some(v) = std::env::var(by).ok().filter(|v| !v.trim().is_empty()) {
        let bytes = v.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "{by}={v}: expected a number of bytes, such as {}",
                memagent_engine::prefetch::DEFAULT_AHEAD
            )
        })?;
        return Ok(Prefetch::Set {
            bytes,
            by: by.to_string(),
        });
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".cache"))
        });
    Ok(Prefetch::Measure {
        cache: base.map(|b| b.join("memagent").join("decode-tuning.json")),
    })
}

/// Loads the model the settings point at, on the chosen device.
pub(crate) fn load_model(global: &Settings) -> Result<LocalModel> {
    let path = global.model_path()?;
    let options = LoadOptions {
        device: open_device(&global.device)?,
        weights: WeightPlan {
            dense_prefill: true,
            prefill: prefill_weights()?,
        },
        tokenizer: global.tokenizer.clone(),
        adapter: adapter_choice(global),
        reader: reader_choice(global),
        prefetch: prefetch_choice()?,
    };
    tracing::info!("loading model {}", path.display());
    Ok(LocalModel::load(&path, &options)?)
}

/// The model behind the memory loop: the local GGUF model, or a remote server with the
/// tokenizer that cuts documents for it; with the loop's settings for the command,
/// resolved once when it opens.
pub struct ModelBackend {
    inner: Inner,
    tuning: Tuning,
    /// The model's name and file sha256, once hashed.
    identity: std::sync::OnceLock<(String, String)>,
}

/// How one command runs the loop: flags over the configuration file over the model's
/// own defaults, resolved once.
struct Tuning {
    profile: Profile,
    reading: memagent_agent::Reading,
    writer: memagent_agent::Writer,
    final_form: memagent_agent::FinalForm,
    sampling: SamplingParams,
    draft_tokens: usize,
}

// One value per process: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Inner {
    Local(LocalModel),
    Remote {
        backend: OpenAiBackend,
        tokenizer: Option<Tokenizer>,
        /// Parameters of the model file given as --tokenizer, when it is a GGUF file.
        tokenizer_parameters: Option<usize>,
    },
}

impl ModelBackend {
    /// Opens the backend that flags, environment and the configuration file choose (in
    /// that order), with the loop's settings for `run`.
    pub fn open(global: &Settings, run: &LoopArgs) -> Result<Self> {
        let config = global.config()?;
        let inner = Self::open_inner(global, &run.backend, &config.backend)?;
        let resolve = Resolve {
            inner: &inner,
            config: &config.profile,
            overrides: &run.profile,
        };
        let tuning = Tuning {
            profile: resolve.profile()?,
            reading: resolve.reading()?,
            writer: resolve.writer()?,
            final_form: run.profile.final_template,
            sampling: run.sampling.params(),
            draft_tokens: run.sampling.draft_tokens,
        };
        Ok(Self {
            inner,
            tuning,
            identity: std::sync::OnceLock::new(),
        })
    }

    /// The loop's profile: chunk, memory and answer sizes.
    pub fn profile(&self) -> Profile {
        self.tuning.profile
    }

    /// How the general memory is written.
    pub fn writer(&self) -> memagent_agent::Writer {
        self.tuning.writer
    }

    fn open_inner(
        global: &Settings,
        args: &BackendArgs,
        config: &settings::BackendConfig,
    ) -> Result<Inner> {
        match args.backend.or(config.kind).unwrap_or(BackendKind::Local) {
            BackendKind::Local => Ok(Inner::Local(load_model(global)?)),
            BackendKind::Openai => {
                let base_url = args
                    .base_url
                    .clone()
                    .or_else(|| config.base_url.clone())
                    .context(
                        "the openai backend needs --base-url (or MEMAGENT_BASE_URL), \
                     e.g. http://localhost:8000/v1",
                    )?;
                let model = args
                    .remote_model
                    .clone()
                    .or_else(|| config.remote_model.clone())
                    .context(
                        "the openai backend needs --remote-model (or MEMAGENT_REMOTE_MODEL): \
                     the served model's name",
                    )?;
                let mut options = RemoteOptions::new(base_url, model);
                options.api_key = std::env::var(&args.api_key_env)
                    .ok()
                    .filter(|k| !k.is_empty());
                options.timeout = Duration::from_secs(args.timeout.max(1));
                options.retries = args.retries;
                options.context_length = args.context_tokens.or(config.context_tokens);
                let mut backend = OpenAiBackend::new(options)?;
                backend.discover();
                if backend.options().context_length.is_none() {
                    tracing::warn!(
                        "the server did not say the model's context length; budget checks are \
                         off (pass --context-tokens N to enable them)"
                    );
                }
                let tokenizer = match &global.tokenizer {
                    Some(path) => Some(Tokenizer::from_file(path).with_context(|| {
                        format!("cannot read the tokenizer {}", path.display())
                    })?),
                    None => None,
                };
                // A GGUF tokenizer is the served model's file: its header gives the size.
                let tokenizer_parameters = global
                    .tokenizer
                    .as_deref()
                    .and_then(|path| memagent_engine::ModelInfo::read(path).ok())
                    .map(|info| info.parameters);
                Ok(Inner::Remote {
                    backend,
                    tokenizer,
                    tokenizer_parameters,
                })
            }
        }
    }

    /// The model's name and file sha256 (empty for a remote model), for memory records.
    pub fn identity(&self) -> Result<(String, String)> {
        if let Some(known) = self.identity.get() {
            return Ok(known.clone());
        }
        let identity = match &self.inner {
            Inner::Local(model) => (
                model.name().to_string(),
                memagent_engine::sha256_file(model.path())?,
            ),
            Inner::Remote { backend, .. } => (backend.options().model.clone(), String::new()),
        };
        Ok(self.identity.get_or_init(|| identity).clone())
    }

    /// The embedder the line writer compares lines with, when it writes the memory.
    pub fn writer_embedder(
        &self,
        global: &Settings,
    ) -> Result<Option<std::sync::Arc<memagent_recall::Embedder>>> {
        match self.tuning.writer {
            memagent_agent::Writer::Lines => recall::load_embedder(global),
            memagent_agent::Writer::Rewrite => Ok(None),
        }
    }

    /// Runs `f` with a memory agent over this backend.
    pub fn with_agent<R>(&self, f: impl FnOnce(&MemoryAgent<'_>) -> Result<R>) -> Result<R> {
        let t = &self.tuning;
        let configure = |mut agent: MemoryAgent<'_>| {
            agent.final_form = t.final_form;
            agent.reading = t.reading;
            agent.sampling = t.sampling;
            agent.draft_tokens = t.draft_tokens;
            f(&agent)
        };
        let chosen = t.profile;
        match &self.inner {
            Inner::Local(model) => configure(MemoryAgent::new(model, model.tokenizer(), chosen)),
            Inner::Remote {
                backend,
                tokenizer: Some(tokenizer),
                ..
            } => configure(MemoryAgent::new(backend, tokenizer, chosen)),
            Inner::Remote {
                backend,
                tokenizer: None,
                ..
            } => {
                let remote = RemoteTokenizer::connect(backend)?;
                let tokenizer: &dyn TextTokenizer = &remote;
                configure(MemoryAgent::new(backend, tokenizer, chosen))
            }
        }
    }
}

/// The loop's settings resolved from a command's flags, the configuration file's
/// `[profile]` and the model itself.
struct Resolve<'a> {
    inner: &'a Inner,
    config: &'a settings::ProfileConfig,
    overrides: &'a ProfileArgs,
}

impl Resolve<'_> {
    /// The model's own profile (--profile, else from its size), before the sizes given
    /// on the command line or in the config file.
    fn model_profile(&self) -> Result<Profile> {
        Ok(match (self.inner, self.overrides.profile) {
            (_, Some(kind)) => kind.profile(),
            (Inner::Local(model), None) => {
                Profile::for_model(model.name(), Some(model.parameters()))
            }
            (
                Inner::Remote {
                    backend,
                    tokenizer_parameters,
                    ..
                },
                None,
            ) => {
                let name = &backend.options().model;
                let Some(parameters) = backend.options().parameters.or(*tokenizer_parameters)
                else {
                    anyhow::bail!(
                        "the size of the remote model {name} is unknown, so the loop \
                             cannot choose its chunk and memory sizes: pass --profile small \
                             (models under 1B parameters: C = 1024, M = 256) or --profile \
                             paper (C = 5000, M = 1024), or --tokenizer with the served \
                             model's GGUF file"
                    );
                };
                Profile::for_model(name, Some(parameters))
            }
        })
    }

    /// The model's default profile with the command line's overrides.
    fn profile(&self) -> Result<Profile> {
        let overrides = self.overrides;
        // The model's own profile, needed only for the sizes nothing else gives.
        let base = || self.model_profile();
        let config = self.config;
        let size = |given: Option<usize>, from: fn(&Profile) -> usize| -> Result<usize> {
            match given {
                Some(n) => Ok(n),
                None => Ok(from(&base()?)),
            }
        };
        Ok(Profile {
            chunk_tokens: size(overrides.chunk_tokens.or(config.chunk_tokens), |p| {
                p.chunk_tokens
            })?,
            memory_tokens: size(overrides.memory_tokens.or(config.memory_tokens), |p| {
                p.memory_tokens
            })?,
            answer_tokens: size(overrides.answer_tokens.or(config.answer_tokens), |p| {
                p.answer_tokens
            })?,
        })
    }

    /// How the general memory is written: --writer, else the config file's, else the
    /// one the model's adapter was trained for, else rewrite.
    fn writer(&self) -> Result<memagent_agent::Writer> {
        if let Some(w) = self.overrides.writer {
            return Ok(w);
        }
        match &self.config.writer {
            Some(name) => name
                .parse()
                .with_context(|| "`writer` under [profile] in the configuration file".to_string()),
            None => Ok(match self.inner {
                Inner::Local(model) => memagent_agent::adapter_writer(model).unwrap_or_default(),
                Inner::Remote { .. } => memagent_agent::Writer::default(),
            }),
        }
    }

    /// How question-mode steps read their chunk: --reading, else the config file's,
    /// else focused for models of the small profile and whole for the others (the
    /// RL-trained checkpoints read whole chunks).
    fn reading(&self) -> Result<memagent_agent::Reading> {
        if let Some(r) = self.overrides.reading {
            return Ok(r);
        }
        match &self.config.reading {
            Some(name) => name
                .parse()
                .with_context(|| "`reading` under [profile] in the configuration file".to_string()),
            None => Ok(
                if matches!(self.model_profile(), Ok(p) if p == Profile::SMALL) {
                    memagent_agent::Reading::Focused
                } else {
                    memagent_agent::Reading::Whole
                },
            ),
        }
    }
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

/// Reads a document from `path`, else from standard input (never from a terminal).
pub fn read_document(path: Option<&std::path::Path>) -> Result<String> {
    use std::io::{IsTerminal, Read};
    let (bytes, name) = match path {
        Some(path) => (
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
            path.display().to_string(),
        ),
        None => {
            if std::io::stdin().is_terminal() {
                bail!("no document: pass --file PATH or pipe the text on standard input");
            }
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("cannot read standard input")?;
            (bytes, "standard input".to_string())
        }
    };
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(e) => {
            tracing::warn!(
                "{name} is not valid UTF-8 (first bad byte at offset {}); invalid bytes \
                 are read as U+FFFD",
                e.utf8_error().valid_up_to()
            );
            Ok(String::from_utf8_lossy(e.as_bytes()).into_owned())
        }
    }
}

/// A progress bar on stderr with `template`, when `show` (a terminal, not quiet, not
/// JSON); it ticks on its own so that long steps still show life.
pub fn progress_bar(show: bool, template: &str) -> Option<indicatif::ProgressBar> {
    show.then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(template)
                .expect("a valid progress template")
                .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    })
}

/// Writes `value` to stdout as pretty JSON, for `--json`.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// An error and its causes on one line, each said once: a message that already quotes
/// its cause ("cannot read notes.md: No such file or directory") is not followed by
/// the cause again, as `{:#}` would.
pub fn error_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

/// A closed stdout (`memctl ... | head`) ends the program quietly.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[test]
    fn an_error_says_each_cause_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        // The message quotes its cause: the cause is not said again.
        let quoted = anyhow::Error::new(io()).context(format!("cannot read notes.md: {}", io()));
        assert_eq!(
            error_text(&quoted),
            format!("cannot read notes.md: {}", io())
        );
        // A message that does not: the cause follows it.
        let plain = anyhow::anyhow!("disk full").context("cannot append");
        assert_eq!(error_text(&plain), "cannot append: disk full");
    }
}

//! A complete local model: weights, tokenizer and chat template from one GGUF file.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use candle_core::Device;
use serde::Serialize;

use crate::adapter::{AdapterChoice, Weights};
use crate::chat::{ChatTemplate, Message};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::models::{Config, KvCache, Transformer};
use crate::prefix::{KeptPrompt, PrefixCache, PrefixCacheStats, ScoredPromptStats, ScoredPrompts};
use crate::sampling::{argmax, log_probability, Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;

pub use crate::models::{PrefillWeights, WeightPlan};

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    pub weights: WeightPlan,
    /// A tokenizer (`tokenizer.json`, or another GGUF file) to use instead of the file's own.
    pub tokenizer: Option<PathBuf>,
    /// A LoRA adapter (`memctl train`) loaded beside the weights: the calls that ask for
    /// it ([`GenerateOptions::weights`]) run with it, the others with the base model.
    pub adapter: AdapterChoice,
    /// A second LoRA adapter beside the weights, for the calls that ask for the reader
    /// (answers read from passages); its default is `<model stem>.reader.safetensors`.
    pub reader: AdapterChoice,
    /// How decoding's prefetch distance is chosen on this CPU ([`crate::tuning`]).
    pub prefetch: crate::tuning::Prefetch,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            weights: WeightPlan {
                dense_prefill: true,
                prefill: PrefillWeights::default(),
            },
            tokenizer: None,
            adapter: AdapterChoice::None,
            reader: AdapterChoice::None,
            prefetch: crate::tuning::Prefetch::default(),
        }
    }
}

/// Limits and sampling of one generation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop when the last this many generated tokens already occurred earlier in the
    /// reply (a degenerate loop), dropping the repeated tail. `None` never stops early.
    pub stop_on_repeat: Option<usize>,
    /// Stop when a completed line of the reply repeats an earlier line (list numbering
    /// ignored), dropping that line: loops of numbered copies escape the token check.
    pub stop_on_repeated_line: bool,
    /// Speculative decoding by prompt lookup: up to this many tokens are drafted from
    /// earlier text that ends like the reply so far and checked in one forward pass.
    /// Greedy decoding only (sampling decodes plainly); the tokens are exactly those of
    /// plain decoding. 0 turns it off.
    pub draft_tokens: usize,
    /// Reuse the keys and values of a prompt prefix computed for an earlier prompt (see
    /// [`crate::prefix`]); results agree with a full prefill to rounding.
    pub reuse_prefix: bool,
    /// Never end at an end-of-turn token (it is never chosen): every reply runs to
    /// `max_new_tokens` unless a loop stop ends it, for benchmarks of a fixed generation
    /// length (llama.cpp's and vLLM's `ignore_eos`).
    pub ignore_eos: bool,
    /// The weights the call runs with: the model's adapter by default (the memory
    /// writer's calls), its reader (answers read from passages), or the base model's
    /// weights alone; one that was not loaded runs the base model.
    pub weights: Weights,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            sampling: SamplingParams::default(),
            stop_on_repeat: None,
            stop_on_repeated_line: false,
            draft_tokens: DEFAULT_DRAFT_TOKENS,
            reuse_prefix: true,
            ignore_eos: false,
            weights: Weights::Adapter,
        }
    }
}

/// Most tokens drafted per forward pass by default (the adaptive length starts lower).
pub const DEFAULT_DRAFT_TOKENS: usize = 8;

/// Most prompt rows a pass of prompts prefilled together takes
/// ([`Transformer::prefill_many`]): two prefill chunks' worth. Measured on LoCoMo's
/// development conversations (docs/benchmarks/conversations/), every 4th single-hop
/// question (three passages of about 300 tokens each): 2.04 s a question one prompt at
/// a time, 2.01 s with passes of up to 512 rows, 1.90 s with 1,024.
const STACKED_ROWS: usize = 2 * crate::models::PREFILL_CHUNK;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-turn token (kept in `token_ids`, not in `text`).
    EndOfTurn,
    /// `max_new_tokens` were produced.
    MaxTokens,
    /// The reply started repeating itself (see [`GenerateOptions::stop_on_repeat`]); the
    /// repeated tokens were dropped.
    Repetition,
}

/// The result of one generation, with its cost.
#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub stop_reason: StopReason,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Prompt tokens reused from the prefix cache, forward passes after the prefill, and
    /// the drafting that saved some of them.
    pub decoding: DecodeStats,
}

/// How a reply was computed: prompt tokens whose keys and values came from the prefix
/// cache, forward passes after the prefill (one per generated token without
/// speculation), tokens drafted by prompt lookup, and how many the model confirmed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DecodeStats {
    pub cached_prompt: usize,
    pub passes: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl DecodeStats {
    /// Share of drafted tokens the model confirmed (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

impl Generation {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds.max(f64::EPSILON)
    }

    /// Tokens per second after the first one (which comes out of the prefill).
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.completion_tokens.saturating_sub(1) as f64 / self.decode_seconds.max(f64::EPSILON)
    }
}

/// What a model file holds, for `memctl model info`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub name: Option<String>,
    pub architecture: String,
    pub parameters: usize,
    pub quantization: Vec<(String, usize)>,
    pub file_type: Option<usize>,
    pub context_length: usize,
    pub vocab_size: usize,
    pub layers: usize,
    pub embedding_length: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub chat_template: Option<String>,
    pub file_bytes: u64,
    /// What of the file this engine does not run (empty: it runs it), each naming what
    /// and why.
    pub unsupported: Vec<String>,
}

impl ModelInfo {
    /// Reads only the header of a GGUF file (no weights). A file the engine cannot run
    /// is still described, with what it does not support in `unsupported`.
    pub fn read(path: &Path) -> Result<Self> {
        let gguf = GgufFile::open(path)?;
        let mut unsupported = Vec::new();
        let dims = match Config::from_gguf(&gguf) {
            Ok(c) => [
                c.context_length,
                c.vocab_size,
                c.n_layer,
                c.n_embd,
                c.n_head,
                c.n_kv_head,
            ],
            Err(e @ (Error::UnsupportedArchitecture(_) | Error::Gguf { .. })) => {
                unsupported.push(e.to_string());
                // What the keys under the file's own prefix say (missing ones read 0).
                let p = gguf.string("general.architecture")?;
                let mut dims = [0; 6];
                let keys = [
                    "context_length",
                    "vocab_size",
                    "block_count",
                    "embedding_length",
                    "attention.head_count",
                    "attention.head_count_kv",
                ];
                for (d, key) in dims.iter_mut().zip(keys) {
                    *d = gguf.opt_usize(&format!("{p}.{key}"))?.unwrap_or(0);
                }
                if dims[1] == 0 {
                    dims[1] = gguf
                        .string_array("tokenizer.ggml.tokens")
                        .map_or(0, |t| t.len());
                }
                dims
            }
            Err(e) => return Err(e),
        };
        let [context_length, vocab_size, layers, embedding_length, heads, kv_heads] = dims;
        let file_bytes = std::fs::metadata(path)
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        Ok(Self {
            path: path.to_path_buf(),
            name: gguf.opt_string("general.name")?.map(str::to_string),
            architecture: gguf.string("general.architecture")?.to_string(),
            parameters: gguf.tensor_sizes().map(|(_, n)| n).sum(),
            quantization: gguf.tensor_types(),
            file_type: gguf.opt_usize("general.file_type")?,
            context_length,
            vocab_size,
            layers,
            embedding_length,
            heads,
            kv_heads,
            chat_template: gguf
                .opt_string("tokenizer.chat_template")?
                .map(str::to_string),
            file_bytes,
            unsupported,
        })
    }
}

/// A model ready to generate.
pub struct LocalModel {
    path: PathBuf,
    name: String,
    parameters: usize,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    transformer: Transformer,
    adapter: Option<PathBuf>,
    adapter_manifest: Option<crate::adapter::AdapterManifest>,
    reader: Option<PathBuf>,
    reader_manifest: Option<crate::adapter::AdapterManifest>,
    prefixes: Mutex<PrefixCache>,
    scored: Mutex<ScoredPrompts>,
    decode_tuning: crate::tuning::DecodeTuning,
}

impl LocalModel {
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        let mut gguf = GgufFile::open(path)?;
        let config = Config::from_gguf(&gguf)?;
        let tokenizer = match &options.tokenizer {
            Some(file) => Tokenizer::from_file(file)?,
            None => Tokenizer::from_gguf(&gguf)?,
        };
        let architecture = gguf.string("general.architecture")?;
        let source = match gguf.opt_string("tokenizer.chat_template")? {
            Some(source) => source,
            None => {
                let builtin = crate::chat::builtin_template(architecture).ok_or_else(|| {
                    Error::Template(format!(
                        "{} has no tokenizer.chat_template; memagent needs a chat (instruct) model",
                        path.display()
                    ))
                })?;
                tracing::info!(
                    "{} carries no chat template: using {architecture}'s own",
                    path.display()
                );
                builtin
            }
        };
        let template = ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())?;
        let name = gguf
            .opt_string("general.name")?
            .map(str::to_string)
            .unwrap_or_else(|| {
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
        let parameters = gguf.tensor_sizes().map(|(_, n)| n).sum();
        tracing::debug!(?config, "loading {}", path.display());
        let adapter = crate::adapter::resolve(
            path,
            &options.adapter,
            &crate::adapter::default_adapter_path(path),
        )?;
        let reader = crate::adapter::resolve(
            path,
            &options.reader,
            &crate::adapter::default_reader_path(path),
        )?;
        for (what, loaded) in [("adapter", &adapter), ("reader", &reader)] {
            if let Some(a) = loaded {
                tracing::info!(
                    "loading {what} {} ({} projections)",
                    a.path.display(),
                    a.len()
                );
            }
        }
        let transformer = Transformer::load(
            &mut gguf,
            config,
            options.weights,
            [adapter.as_ref(), reader.as_ref()],
            &options.device,
        )?;
        let decode_tuning = crate::tuning::tune_decode(&transformer, path, &options.prefetch)?;
        tracing::debug!("decoding: {decode_tuning}");
        Ok(Self {
            decode_tuning,
            path: path.to_path_buf(),
            name,
            parameters,
            tokenizer,
            template,
            transformer,
            adapter_manifest: adapter.as_ref().map(|a| a.manifest.clone()),
            adapter: adapter.map(|a| a.path),
            reader_manifest: reader.as_ref().map(|a| a.manifest.clone()),
            reader: reader.map(|a| a.path),
            prefixes: Mutex::new(PrefixCache::default()),
            scored: Mutex::new(ScoredPrompts::default()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The adapter loaded beside the weights, if any.
    pub fn adapter(&self) -> Option<&Path> {
        self.adapter.as_deref()
    }

    /// The manifest of the adapter loaded beside the weights, if any: what it was
    /// trained on, as plain facts.
    pub fn adapter_manifest(&self) -> Option<&crate::adapter::AdapterManifest> {
        self.adapter_manifest.as_ref()
    }

    /// The reader loaded beside the weights, if any.
    pub fn reader(&self) -> Option<&Path> {
        self.reader.as_deref()
    }

    /// The manifest of the reader loaded beside the weights, if any.
    pub fn reader_manifest(&self) -> Option<&crate::adapter::AdapterManifest> {
        self.reader_manifest.as_ref()
    }

    /// Number of weights in the file.
    pub fn parameters(&self) -> usize {
        self.parameters
    }

    pub fn config(&self) -> &Config {
        self.transformer.config()
    }

    pub fn context_length(&self) -> usize {
        self.config().context_length
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// How decoding's CPU-dependent setting was chosen for this model on this CPU
    /// ([`crate::tuning`]).
    pub fn decode_tuning(&self) -> &crate::tuning::DecodeTuning {
        &self.decode_tuning
    }

    pub fn transformer(&self) -> &Transformer {
        &self.transformer
    }

    pub fn chat_template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The conversation rendered by the model's chat template, ending where the reply begins.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String> {
        self.template.render(messages, true)
    }

    /// Token ids of a rendered chat prompt (the template writes any BOS itself).
    pub fn chat_prompt_ids(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.tokenizer.encode(&self.chat_prompt(messages)?, false)
    }

    /// How likely the model finds `reply` as its answer to `messages`: the mean natural
    /// log-probability of `reply`'s tokens, each given the prompt and the reply's tokens
    /// before it, with `weights` (the base model's when that adapter is not loaded). A
    /// search ranks passages by the likelihood of the question given each (query
    /// likelihood); higher is likelier, 0 the most. The prompt's keys and values are kept
    /// (see [`LocalModel::scored_prompt_stats`]): another reply to the same messages reads
    /// only its own tokens, with the same result.
    pub fn reply_log_probability(
        &self,
        messages: &[Message],
        reply: &str,
        weights: Weights,
    ) -> Result<f64> {
        let prompt = self.chat_prompt_ids(messages)?;
        let reply = self.tokenizer.encode(reply, false)?;
        if prompt.is_empty() || reply.is_empty() {
            return Err(Error::InvalidRequest(
                "a reply's likelihood needs a prompt and a reply of one token or more".into(),
            ));
        }
        let total = prompt.len() + reply.len();
        let context = self.context_length();
        if total > context {
            return Err(Error::ContextOverflow {
                prompt: prompt.len(),
                max_new: reply.len(),
                total,
                context,
                over: total - context,
            });
        }
        let transformer = &self.transformer;
        let weights = transformer.loaded(weights);
        let kept = self.scored().start(&prompt, total, weights)?;
        let (mut cache, last) = match kept {
            Some(found) => found,
            None => {
                let (cache, last, _) = self.read_scored_prompt(&prompt, total, weights)?;
                (cache, last)
            }
        };
        let mut sum = log_probability(&last, reply[0]);
        // Each piece's logits predict the token after each of its tokens.
        for (i, piece) in reply[..reply.len() - 1]
            .chunks(Transformer::MAX_VERIFY)
            .enumerate()
        {
            let logits = transformer.forward_all(&[piece.to_vec()], &mut cache)?;
            let rows: Vec<Vec<f32>> = logits.squeeze(0)?.to_vec2()?;
            let next = &reply[i * Transformer::MAX_VERIFY + 1..];
            sum += rows
                .iter()
                .zip(next)
                .map(|(row, &token)| log_probability(row, token))
                .sum::<f64>();
        }
        Ok(sum / reply.len() as f64)
    }

    /// Reads `messages` as the prompt of a scored reply and keeps it, as
    /// [`LocalModel::reply_log_probability`] does, so that the first reply scored to it
    /// reads only its own tokens, with the same result (a daemon reading passages ahead
    /// while nothing waits on the model). A prompt kept already is only marked as the
    /// most recently used.
    pub fn keep_scored_prompt(&self, messages: &[Message], weights: Weights) -> Result<KeptPrompt> {
        let prompt = self.chat_prompt_ids(messages)?;
        let weights = self.transformer.loaded(weights);
        if let Some(bytes) = self.scored().touch(&prompt, weights) {
            return Ok(KeptPrompt { read: false, bytes });
        }
        // Room for a reply of one token: a prompt that leaves none is never scored.
        if prompt.is_empty() || prompt.len() >= self.context_length() {
            return Ok(KeptPrompt {
                read: false,
                bytes: 0,
            });
        }
        let (_, _, bytes) = self.read_scored_prompt(&prompt, prompt.len(), weights)?;
        Ok(KeptPrompt { read: true, bytes })
    }

    /// `prompt` read into a cache with room for `capacity` tokens, the logits after it,
    /// and the bytes it takes kept.
    fn read_scored_prompt(
        &self,
        prompt: &[u32],
        capacity: usize,
        weights: Weights,
    ) -> Result<(KvCache, Vec<f32>, usize)> {
        let transformer = &self.transformer;
        let mut cache = transformer.new_cache_with(1, capacity, weights);
        let last: Vec<f32> = transformer
            .forward(&[prompt.to_vec()], &mut cache)?
            .flatten_all()?
            .to_vec1()?;
        let bytes = self.scored().remember(prompt, &cache, &last)?;
        Ok((cache, last, bytes))
    }

    /// One assistant reply to `messages`.
    pub fn generate_chat(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
    ) -> Result<Generation> {
        let ids = self.chat_prompt_ids(messages)?;
        self.generate(&ids, options)
    }

    /// Continues `prompt` (token ids) until an end-of-turn token or `max_new_tokens`.
    /// Greedy generations draft by prompt lookup (see [`GenerateOptions::draft_tokens`]).
    pub fn generate(&self, prompt: &[u32], options: &GenerateOptions) -> Result<Generation> {
        self.generate_with_drafts(prompt, options, |generated, max| {
            lookup_draft(prompt, generated, max)
        })
    }

    /// [`LocalModel::generate`] with drafts from `draft(generated, max)`: up to `max`
    /// tokens guessed to follow `generated`. Whatever the drafts, the tokens are those of
    /// plain decoding; good drafts only make it faster.
    pub fn generate_with_drafts(
        &self,
        prompt: &[u32],
        options: &GenerateOptions,
        mut draft: impl FnMut(&[u32], usize) -> Vec<u32>,
    ) -> Result<Generation> {
        let mut out = self.decode_batch(&[prompt], options, &mut |_, generated, max| {
            draft(generated, max)
        })?;
        Ok(out.pop().expect("one generation per prompt"))
    }

    /// Continues several prompts at once: each is prefilled on its own (a prefill is
    /// already one large matrix product), then every decoding pass runs the next tokens of
    /// all unfinished sequences together, so that each weight row is read once per pass
    /// instead of once per sequence. Each sequence stops on its own, and gets exactly the
    /// tokens [`LocalModel::generate`] gives it alone.
    pub fn generate_batch(
        &self,
        prompts: &[&[u32]],
        options: &GenerateOptions,
    ) -> Result<Vec<Generation>> {
        if prompts.len() > 1 && !self.exact_rows() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::info!(
                    "batched decoding is exact only on the CPU kernels: sequences on {:?} \
                     are decoded one at a time",
                    self.transformer.device()
                )
            });
            return prompts
                .iter()
                .map(|prompt| {
                    let mut one = self.decode_batch(&[prompt], options, &mut |_, g, max| {
                        lookup_draft(prompt, g, max)
                    })?;
                    Ok(one.pop().expect("one generation per prompt"))
                })
                .collect();
        }
        self.decode_batch(prompts, options, &mut |i, generated, max| {
            lookup_draft(prompts[i], generated, max)
        })
    }

    /// Whether a decoding pass of several rows (drafted tokens, other sequences) gives
    /// each row exactly the logits it gets alone, so that drafting and batching never
    /// change a reply. The engine's CPU kernels do (tested); candle's GPU matrix products
    /// choose their kernels by shape and differ in the last bits (measured on an H100:
    /// drafted and batched greedy replies parted from one-token decoding), so on a GPU
    /// replies are decoded one token and one sequence at a time.
    pub fn exact_rows(&self) -> bool {
        self.transformer.device().is_cpu()
    }

    fn decode_batch(
        &self,
        prompts: &[&[u32]],
        options: &GenerateOptions,
        draft: &mut Drafter<'_>,
    ) -> Result<Vec<Generation>> {
        self.check_prompts(prompts, options)?;
        let speculate =
            options.sampling.temperature <= 0.0 && options.draft_tokens > 0 && self.exact_rows();
        let max_draft = options.draft_tokens.min(Transformer::MAX_VERIFY - 1);
        let mut seqs = self.start_sequences(prompts, options, max_draft)?;
        let decode_start = Instant::now();
        loop {
            let drafting = Drafting {
                speculate,
                max_draft,
                draft: &mut *draft,
            };
            let inputs = self.next_inputs(&mut seqs, options, drafting, decode_start)?;
            if inputs.is_empty() {
                break;
            }
            let mut rows_of = self.forward_inputs(&mut seqs, &inputs)?;
            // Each sequence keeps the longest prefix of its draft the model agrees with.
            for (i, input) in inputs {
                let rows = rows_of[i].take().expect("rows for every input");
                self.accept(&mut seqs[i], &input, rows, options, max_draft, decode_start)?;
            }
        }
        seqs.into_iter().map(|seq| self.generation(seq)).collect()
    }

    /// Every prompt has a token, and room in the context for `max_new_tokens` more.
    fn check_prompts(&self, prompts: &[&[u32]], options: &GenerateOptions) -> Result<()> {
        let context = self.context_length();
        for prompt in prompts {
            if prompt.is_empty() {
                return Err(Error::InvalidRequest(
                    "the prompt has no tokens".to_string(),
                ));
            }
            let total = prompt.len() + options.max_new_tokens;
            if total > context {
                return Err(Error::ContextOverflow {
                    prompt: prompt.len(),
                    max_new: options.max_new_tokens,
                    total,
                    context,
                    over: total - context,
                });
            }
        }
        Ok(())
    }

    /// Sequences with their prompts prefilled. Where the model's prefill products are
    /// row-exact ([`Transformer::stacks_prefill`]), the prompts prefill together, up to
    /// [`STACKED_ROWS`] rows a pass, each after the prefix the prefix cache holds of it
    /// ([`Transformer::prefill_many`]); a first prompt whose head is not cached yet
    /// prefills alone first, for the others to reuse it. An answer's prompts are many
    /// and short, and a short prompt alone makes a small, slow product. Each gets exactly
    /// the logits it gets alone.
    fn start_sequences<'p>(
        &self,
        prompts: &[&'p [u32]],
        options: &GenerateOptions,
        max_draft: usize,
    ) -> Result<Vec<Sequence<'p>>> {
        if prompts.len() < 2 || options.max_new_tokens == 0 || !self.transformer.stacks_prefill() {
            return prompts
                .iter()
                .map(|prompt| self.start_sequence(prompt, options, max_draft))
                .collect();
        }
        let reuse = options.reuse_prefix && self.exact_rows();
        let weights = self.transformer.loaded(options.weights);
        let mut seqs = Vec::with_capacity(prompts.len());
        // Prompts waiting to prefill together: (sequence, cache, tokens reused).
        let mut waiting: Vec<(usize, KvCache, usize)> = Vec::new();
        for (i, prompt) in prompts.iter().enumerate() {
            let capacity = prompt.len() + options.max_new_tokens;
            let (cache, reused) = self.prefix_start(prompt, capacity, reuse, weights)?;
            // A first prompt without a cached prefix prefills alone, for the others to
            // reuse its head.
            let leads = i == 0 && reuse && reused == 0;
            let mut seq = self.new_sequence(prompt, options, max_draft);
            if !leads && Transformer::stackable(cache.len(), prompt.len() - reused) {
                waiting.push((i, cache, reused));
            } else {
                let (logits, cache) = self.prefill_from(prompt, cache, reused, reuse)?;
                seq.prefilled(&logits, cache, reused)?;
                seq.prefill_seconds = seq.start.elapsed().as_secs_f64();
            }
            seqs.push(seq);
        }
        let mut waiting = waiting.into_iter().peekable();
        while waiting.peek().is_some() {
            let mut group = Vec::new();
            let mut rows = 0;
            while let Some((i, _, reused)) = waiting.peek() {
                let t = seqs[*i].prompt.len() - reused;
                if !group.is_empty() && rows + t > STACKED_ROWS {
                    break;
                }
                rows += t;
                group.push(waiting.next().expect("peeked"));
            }
            let start = Instant::now();
            let mut inputs: Vec<(&[u32], &mut KvCache)> = group
                .iter_mut()
                .map(|(i, cache, reused)| (&seqs[*i].prompt[*reused..], cache))
                .collect();
            let logits = self.transformer.prefill_many(&mut inputs)?;
            let seconds = start.elapsed().as_secs_f64();
            for ((i, cache, reused), logits) in group.into_iter().zip(logits) {
                if reuse {
                    self.prefixes().remember(seqs[i].prompt, &cache)?;
                }
                let seq = &mut seqs[i];
                seq.start = start;
                seq.prefilled(&logits, cache, reused)?;
                // The pass's time shared by rows.
                seq.prefill_seconds = seconds * (seq.prompt.len() - reused) as f64 / rows as f64;
            }
        }
        Ok(seqs)
    }

    /// A sequence of `prompt`, not yet prefilled.
    fn new_sequence<'p>(
        &self,
        prompt: &'p [u32],
        options: &GenerateOptions,
        max_draft: usize,
    ) -> Sequence<'p> {
        Sequence {
            prompt,
            sampler: Sampler::new(options.sampling),
            generated: Vec::new(),
            cache: None,
            row: Vec::new(),
            draft_len: max_draft.min(4),
            decoding: DecodeStats::default(),
            stop: (options.max_new_tokens == 0).then_some(StopReason::MaxTokens),
            start: Instant::now(),
            prefill_seconds: 0.0,
            decode_seconds: 0.0,
        }
    }

    /// A sequence with its prompt prefilled (unless it is to generate nothing).
    fn start_sequence<'p>(
        &self,
        prompt: &'p [u32],
        options: &GenerateOptions,
        max_draft: usize,
    ) -> Result<Sequence<'p>> {
        let mut seq = self.new_sequence(prompt, options, max_draft);
        let start = seq.start;
        if seq.stop.is_none() {
            let total = prompt.len() + options.max_new_tokens;
            let (logits, cache, reused) =
                self.prefill(prompt, total, options.reuse_prefix, options.weights)?;
            seq.prefilled(&logits, cache, reused)?;
        }
        seq.prefill_seconds = start.elapsed().as_secs_f64();
        Ok(seq)
    }

    /// Each unfinished sequence takes its next token and drafts what may follow: the
    /// tokens each runs through the model next, by sequence index. A cache holds its
    /// prompt and every generated token but the last; `row` predicts the token after the
    /// last.
    fn next_inputs(
        &self,
        seqs: &mut [Sequence<'_>],
        options: &GenerateOptions,
        drafting: Drafting<'_, '_>,
        decode_start: Instant,
    ) -> Result<Vec<(usize, Vec<u32>)>> {
        let active = seqs.iter().filter(|s| s.stop.is_none()).count();
        // Alone, a sequence drafts up to its limit. In a batch the rows of a pass are
        // better spent on other sequences' tokens (measured: four sequences without
        // drafts decode 1.2-1.35x faster than with two drafts each), so none drafts.
        let share = if active > 1 { 0 } else { drafting.max_draft };
        let mut inputs: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, seq) in seqs.iter_mut().enumerate() {
            if seq.stop.is_some() {
                continue;
            }
            self.mask_stops(&mut seq.row, options);
            let next = seq.sampler.sample(&seq.row);
            if let Some(reason) = self.push_token(&mut seq.generated, next, options)? {
                seq.finish(reason, decode_start);
                continue;
            }
            let room = options.max_new_tokens - seq.generated.len();
            let want = seq.draft_len.min(room).min(share);
            let mut drafted = if drafting.speculate && want > 0 {
                (drafting.draft)(i, &seq.generated, want)
            } else {
                Vec::new()
            };
            drafted.truncate(want);
            let mut input = vec![next];
            input.extend_from_slice(&drafted);
            inputs.push((i, input));
        }
        Ok(inputs)
    }

    /// Runs every sequence's input through the model, one pass per group of at most
    /// [`Transformer::MAX_VERIFY`] rows (more only with many sequences): the logits of
    /// each input token, by sequence index.
    fn forward_inputs(
        &self,
        seqs: &mut [Sequence<'_>],
        inputs: &[(usize, Vec<u32>)],
    ) -> Result<Vec<Option<Vec<Vec<f32>>>>> {
        let mut rows_of: Vec<Option<Vec<Vec<f32>>>> = vec![None; seqs.len()];
        let mut group: Vec<usize> = Vec::new();
        let mut group_rows = 0;
        for at in 0..=inputs.len() {
            let fits =
                at < inputs.len() && group_rows + inputs[at].1.len() <= Transformer::MAX_VERIFY;
            if !fits && !group.is_empty() {
                let mut caches: Vec<(&[u32], &mut KvCache)> = Vec::new();
                let mut owners = Vec::new();
                for (i, seq) in seqs.iter_mut().enumerate() {
                    if let Some(k) = group.iter().position(|&g| inputs[g].0 == i) {
                        let cache = seq.cache.as_mut().expect("an active sequence's cache");
                        caches.push((inputs[group[k]].1.as_slice(), cache));
                        owners.push(i);
                    }
                }
                let logits = self.transformer.forward_many(&mut caches)?;
                for (i, rows) in owners.into_iter().zip(logits) {
                    rows_of[i] = Some(rows.to_vec2()?);
                }
                group.clear();
                group_rows = 0;
            }
            if at < inputs.len() {
                group.push(at);
                group_rows += inputs[at].1.len();
            }
        }
        Ok(rows_of)
    }

    /// Keeps the longest prefix of `seq`'s draft (the input after its first token) that
    /// the model agrees with, sizes its next draft by how much was kept, and rewinds its
    /// cache to the tokens kept.
    fn accept(
        &self,
        seq: &mut Sequence<'_>,
        input: &[u32],
        mut rows: Vec<Vec<f32>>,
        options: &GenerateOptions,
        max_draft: usize,
        decode_start: Instant,
    ) -> Result<()> {
        let drafted = &input[1..];
        seq.decoding.passes += 1;
        seq.decoding.drafted += drafted.len();
        let mut accepted = 0;
        let mut stopped = None;
        for (k, &token) in drafted.iter().enumerate() {
            self.mask_stops(&mut rows[k], options);
            if argmax(&rows[k]) != token {
                break;
            }
            accepted += 1;
            if let Some(reason) = self.push_token(&mut seq.generated, token, options)? {
                stopped = Some(reason);
                break;
            }
        }
        seq.decoding.accepted += accepted;
        if let Some(reason) = stopped {
            seq.finish(reason, decode_start);
            return Ok(());
        }
        if !drafted.is_empty() {
            seq.draft_len = if accepted == drafted.len() {
                (seq.draft_len + 2).min(max_draft)
            } else {
                (accepted + 1).min(max_draft)
            };
        }
        let kept = seq.prompt.len() + seq.generated.len();
        seq.cache
            .as_mut()
            .expect("an active sequence's cache")
            .truncate(kept);
        seq.row = rows
            .into_iter()
            .nth(accepted)
            .expect("a row per input token");
        Ok(())
    }

    /// A finished sequence's reply.
    fn generation(&self, seq: Sequence<'_>) -> Result<Generation> {
        let text_ids: Vec<u32> = seq
            .generated
            .iter()
            .copied()
            .filter(|id| !self.tokenizer.stop_ids().contains(id))
            .collect();
        Ok(Generation {
            text: self.tokenizer.decode(&text_ids)?,
            completion_tokens: seq.generated.len(),
            token_ids: seq.generated,
            prompt_tokens: seq.prompt.len(),
            stop_reason: seq.stop.unwrap_or(StopReason::MaxTokens),
            prefill_seconds: seq.prefill_seconds,
            decode_seconds: seq.decode_seconds,
            decoding: seq.decoding,
        })
    }

    /// Runs `prompt` into a new cache with room for `capacity` tokens, starting from a
    /// cached prefix when `reuse` allows and one is there: the logits after the prompt,
    /// the cache, and how many prompt tokens came from the prefix cache. Only where rows
    /// are exact ([`Self::exact_rows`]): on a GPU the rest of a prompt run after a cached
    /// prefix goes through other kernels than the whole prompt, so a reply would depend
    /// on what ran before it (measured on an H200: a 128-token memory rewrite came out
    /// 70 tokens long after a cached prefix and 52 without).
    fn prefill(
        &self,
        prompt: &[u32],
        capacity: usize,
        reuse: bool,
        weights: Weights,
    ) -> Result<(candle_core::Tensor, KvCache, usize)> {
        let reuse = reuse && self.exact_rows();
        let weights = self.transformer.loaded(weights);
        let (cache, reused) = self.prefix_start(prompt, capacity, reuse, weights)?;
        let (logits, cache) = self.prefill_from(prompt, cache, reused, reuse)?;
        Ok((logits, cache, reused))
    }

    /// Runs the rest of `prompt` after the `reused` tokens `cache` holds, and remembers
    /// the prompt's prefix (with `reuse`): the logits after the prompt, and the cache.
    fn prefill_from(
        &self,
        prompt: &[u32],
        mut cache: KvCache,
        reused: usize,
        reuse: bool,
    ) -> Result<(candle_core::Tensor, KvCache)> {
        let logits = self
            .transformer
            .forward(&[prompt[reused..].to_vec()], &mut cache)?;
        if reuse {
            self.prefixes().remember(prompt, &cache)?;
        }
        Ok((logits, cache))
    }

    /// A cache of `capacity` for `prompt` holding the longest prefix of it the prefix
    /// cache has (with `reuse`), and how many tokens that is.
    fn prefix_start(
        &self,
        prompt: &[u32],
        capacity: usize,
        reuse: bool,
        weights: Weights,
    ) -> Result<(KvCache, usize)> {
        let found = match reuse {
            true => self.prefixes().start(prompt, capacity, weights)?,
            false => None,
        };
        Ok(found.unwrap_or_else(|| (self.transformer.new_cache_with(1, capacity, weights), 0)))
    }

    fn prefixes(&self) -> std::sync::MutexGuard<'_, PrefixCache> {
        // A panic elsewhere cannot leave an entry half-written: entries are replaced whole.
        self.prefixes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The logits after `prompt` (one forward pass, nothing generated, with the adapter if
    /// one is loaded), reusing a cached prefix when `reuse` allows, and how many prompt
    /// tokens came from the cache.
    pub fn prompt_logits(&self, prompt: &[u32], reuse: bool) -> Result<(Vec<f32>, usize)> {
        if prompt.is_empty() {
            return Err(Error::InvalidRequest(
                "the prompt has no tokens".to_string(),
            ));
        }
        let (logits, _, reused) = self.prefill(prompt, prompt.len(), reuse, Weights::Adapter)?;
        Ok((logits.squeeze(0)?.to_vec1()?, reused))
    }

    /// Entries and positions held by the prefix cache.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.prefixes().stats()
    }

    /// Empties the prefix cache.
    pub fn clear_prefix_cache(&self) {
        self.prefixes().clear();
    }

    fn scored(&self) -> std::sync::MutexGuard<'_, ScoredPrompts> {
        // Entries are replaced whole, as the prefix cache's.
        self.scored.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prompts whose replies were scored, kept so that another reply to one reads only
    /// its own tokens, the bytes they take and the most they may.
    pub fn scored_prompt_stats(&self) -> ScoredPromptStats {
        self.scored().stats()
    }

    /// Bytes of keys and values kept for prompts whose replies were scored (default
    /// [`crate::prefix::SCORED_PROMPT_BYTES`]; 0 keeps none). The least recently used
    /// go first.
    pub fn set_scored_prompt_budget(&self, bytes: usize) {
        self.scored().set_budget(bytes);
    }

    /// Empties the prompts kept for scoring.
    pub fn clear_scored_prompts(&self) {
        self.scored().clear();
    }

    /// Rules out end-of-turn tokens when `options` ignore them.
    fn mask_stops(&self, row: &mut [f32], options: &GenerateOptions) {
        if options.ignore_eos {
            for &id in self.tokenizer.stop_ids() {
                if let Some(logit) = row.get_mut(id as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Appends one generated token and applies the stops of `options`: the reason to
    /// stop, if any, with `generated` cut where the stop says.
    fn push_token(
        &self,
        generated: &mut Vec<u32>,
        next: u32,
        options: &GenerateOptions,
    ) -> Result<Option<StopReason>> {
        generated.push(next);
        if self.tokenizer.stop_ids().contains(&next) {
            return Ok(Some(StopReason::EndOfTurn));
        }
        if let Some(keep) = options
            .stop_on_repeat
            .and_then(|span| repeated_tail(generated, span))
        {
            generated.truncate(keep);
            return Ok(Some(StopReason::Repetition));
        }
        if options.stop_on_repeated_line
            && self
                .tokenizer
                .token_text(next)
                .is_some_and(|t| t.contains('\n') || t.contains('Ċ'))
        {
            let text = self.tokenizer.decode(generated)?;
            if let Some(keep) = crate::words::repeated_last_line(&text) {
                // Keep the tokens that decode within the kept prefix.
                let mut n = generated.len();
                while n > 0 && self.tokenizer.decode(&generated[..n])?.len() > keep {
                    n -= 1;
                }
                generated.truncate(n);
                return Ok(Some(StopReason::Repetition));
            }
        }
        if generated.len() >= options.max_new_tokens {
            return Ok(Some(StopReason::MaxTokens));
        }
        Ok(None)
    }
}

/// Drafts for sequence `i` of a batch: up to `max` tokens guessed to follow its
/// `generated` tokens.
type Drafter<'a> = dyn FnMut(usize, &[u32], usize) -> Vec<u32> + 'a;

/// How a decoding pass drafts: whether it may (greedy, with exact rows), at most how
/// many tokens, and the drafter.
struct Drafting<'d, 'a> {
    speculate: bool,
    max_draft: usize,
    draft: &'d mut Drafter<'a>,
}

/// One sequence of a batch being decoded.
struct Sequence<'p> {
    prompt: &'p [u32],
    sampler: Sampler,
    generated: Vec<u32>,
    /// Absent when nothing is to be generated.
    cache: Option<KvCache>,
    /// Logits of the token after the last generated one.
    row: Vec<f32>,
    draft_len: usize,
    decoding: DecodeStats,
    stop: Option<StopReason>,
    start: Instant,
    prefill_seconds: f64,
    decode_seconds: f64,
}

impl Sequence<'_> {
    /// The sequence after its prompt's prefill: the logits after the prompt (1, vocab),
    /// its cache, and how many prompt tokens came from the prefix cache.
    fn prefilled(
        &mut self,
        logits: &candle_core::Tensor,
        cache: KvCache,
        reused: usize,
    ) -> Result<()> {
        self.decoding.cached_prompt = reused;
        self.row = logits.squeeze(0)?.to_vec1()?;
        self.cache = Some(cache);
        Ok(())
    }

    fn finish(&mut self, reason: StopReason, decode_start: Instant) {
        self.stop = Some(reason);
        self.cache = None;
        // Its own decoding time: from the batch's first pass (or its own prefill, when
        // later) to now.
        let began = decode_start.max(self.start);
        self.decode_seconds = began.elapsed().as_secs_f64();
    }
}

/// Shortest run of tokens looked up, and the longest tried first.
const LOOKUP_MIN: usize = 2;
const LOOKUP_MAX: usize = 4;

/// Up to `max` tokens that followed an earlier occurrence of the reply's last few tokens:
/// in the prompt first (a memory rewrite copies the old memory and quotes the section),
/// earliest occurrence first, then in the reply itself. Longer matches win.
fn lookup_draft(prompt: &[u32], generated: &[u32], max: usize) -> Vec<u32> {
    let context: Vec<u32> = prompt.iter().chain(generated).copied().collect();
    let end = context.len();
    for n in (LOOKUP_MIN..=LOOKUP_MAX.min(end.saturating_sub(1))).rev() {
        let tail = &context[end - n..];
        // Earlier windows only: a match must leave at least one token to draft.
        if let Some(at) = context[..end - 1].windows(n).position(|w| w == tail) {
            let from = at + n;
            return context[from..(from + max).min(end)].to_vec();
        }
    }
    Vec::new()
}

/// When the last `span` tokens of `tokens` already occur earlier in it, the length to keep
/// (everything before that repeated tail).
pub fn repeated_tail(tokens: &[u32], span: usize) -> Option<usize> {
    let len = tokens.len();
    if span == 0 || len < 2 * span {
        return None;
    }
    let keep = len - span;
    let tail = &tokens[keep..];
    tokens[..len - 1]
        .windows(span)
        .take(keep)
        .any(|w| w == tail)
        .then_some(keep)
}

#[cfg(test)]
mod tests {
    use super::repeated_tail;

    #[test]
    fn repeated_tail_finds_loops_only() {
        assert_eq!(repeated_tail(&[1, 2, 3, 4, 1, 2, 3], 3), Some(4));
        assert_eq!(repeated_tail(&[1, 2, 3, 4, 5, 6, 7], 3), None);
        // A period shorter than the span still counts.
        assert_eq!(repeated_tail(&[9, 1, 1, 1, 1, 1], 2), Some(4));
        assert_eq!(repeated_tail(&[1, 2], 2), None);
        assert_eq!(repeated_tail(&[1, 2, 1, 2], 0), None);
    }
}

//! Command-line syntax: every flag and subcommand of `memctl`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// memagent: long-term memory for assistants and agents, at a fixed prompt size.
///
/// A language model reads any stream of text chunk by chunk and rewrites a bounded,
/// human-readable memory after each chunk; answers come from that memory beside the
/// passages a search over everything stored finds for the question, and cite them.
///
/// Exit codes: 0 success, 1 error, 2 usage error.
#[derive(Debug, Parser)]
#[command(name = "memctl", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// GGUF model file [default: $MEMAGENT_MODEL, then `model` in the config file, then
    /// models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(long, global = true, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Tokenizer to use instead of the model file's own: a tokenizer.json, or a GGUF file
    /// whose tokenizer is read (with a remote backend: the served model's tokenizer)
    #[arg(long, global = true, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,

    /// LoRA adapter loaded beside the model (`memctl train`'s adapter.safetensors, with its
    /// adapter.json beside it): memory steps run with it, and the answers it learned;
    /// other answers and chats run the base model. `none` for the base model alone; an
    /// adapter trained on another base model is refused. Unset: the model's default
    /// adapter, <model stem>.adapter.safetensors beside the model file, when it was
    /// trained on that exact file
    #[arg(
        long,
        global = true,
        env = "MEMAGENT_ADAPTER",
        value_name = "PATH|none"
    )]
    pub adapter: Option<String>,

    /// Second LoRA adapter loaded beside the model, for answers read from passages (the
    /// prompts `memctl query` asks each passage found): `memctl train --evidence-share 1
    /// --dialogue-share 1`'s adapter.safetensors. `none` for the base model's answers.
    /// Unset: the model's default reader, <model stem>.reader.safetensors beside the model
    /// file, when it was trained on that exact file
    #[arg(long, global = true, env = "MEMAGENT_READER", value_name = "PATH|none")]
    pub reader: Option<String>,

    /// Sentence embedder for searching passages by meaning: a folder with
    /// model.safetensors, tokenizer.json and config.json (all-MiniLM-L6-v2), or `none` to
    /// search by words alone [default: `embedder` in the config file, then
    /// models/all-MiniLM-L6-v2 beside the model]
    #[arg(
        long,
        global = true,
        env = "MEMAGENT_EMBEDDER",
        value_name = "DIR|none"
    )]
    pub embedder: Option<String>,

    /// Where the model runs: cpu, cuda[:N] or metal (GPUs need a build with that feature)
    #[arg(long, global = true, env = "MEMAGENT_DEVICE", default_value = "cpu")]
    pub device: String,

    /// Where streams and memories are stored [default: $MEMAGENT_DATA_DIR, then
    /// `data_dir` in the config file, then $XDG_DATA_HOME/memagent/data]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Keep streams in PostgreSQL instead of the data directory's embedded database:
    /// postgres://user@host:port/dbname, the password from $PGPASSWORD [default:
    /// `database` in the config file; unset: the embedded database]
    #[arg(long, global = true, env = "MEMAGENT_DATABASE", value_name = "URL")]
    pub database: Option<String>,

    /// Configuration file [default: $XDG_CONFIG_HOME/memagent/config.toml]
    #[arg(long, global = true, env = "MEMAGENT_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// More diagnostics on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Only errors on stderr
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Answer a question about a document of any length, reading it through the memory
    /// loop (MemAgent) at constant memory
    ///
    /// The document is cut into chunks of the model's tokens; after each chunk the model
    /// rewrites a bounded memory with what helps answer the question. The answer comes
    /// from the last memory beside the document's passages that a search finds for the
    /// question (--memory-only: from the memory alone, the MemAgent protocol). Reads
    /// --file, else standard input.
    #[command(
        after_help = "Examples:\n  memctl ask --file report.txt \"Who signed the contract?\"\n  \
        cat notes/*.md | memctl ask --show-memory \"What did we decide about pricing?\"\n  \
        memctl ask --backend openai --base-url http://gpu:8000/v1 \\\n      \
        --remote-model BytedTsinghua-SIA/RL-MemoryAgent-14B --file book.txt \"...\""
    )]
    Ask(AskArgs),
    /// Append text to a stream, then read what is pending into its memory
    ///
    /// The text is stored (and flushed) before any model work, so nothing acknowledged
    /// is lost; then each pending chunk is read into the stream's general memory and
    /// committed as a new memory version. Interrupted runs resume where they stopped.
    /// Ingesting the same file again appends only what is new.
    Ingest(IngestArgs),
    /// Answer a question from the passages a search finds for it and the stream's
    /// memory, citing the passages the answer comes from (in a chat log, the turn); the
    /// same cost however long the stream
    ///
    /// The best passages of everything the stream stored (BM25 and sentence embeddings,
    /// fused), within --evidence-tokens, are each asked the question in one batch, beside
    /// the memory's lines on it. Of the passages that answer, among those whose answering
    /// turn bears most on the question, a question of how things stand now ("Where does
    /// Ana live?") gets the newest one's answer, any other ("What did Ana bake?") the
    /// answer of the one the search ranked first; a question asking for every value
    /// ("What pets does Ana have?") searches and reads three times as much and gets
    /// every passage's answer; then the memory's, then "not known". A question asking
    /// when ("When did Ana fly to Porto?") searches five times as much and is answered
    /// without the model, whatever the budget: the date of the turn among all the
    /// passages found that bears on it most, its "yesterday" resolved.
    /// --memory-only answers from the memory alone; --deep reads the stored chunks again
    /// with the question.
    Query(QueryArgs),
    /// Search everything a stream stored: passages ranked by words (BM25) and by meaning
    /// (sentence embeddings), fused by their scaled scores, the best 20 ranked again by
    /// late interaction (each telling word of the text against the passage's words)
    #[command(
        after_help = "Examples:\n  memctl search chat \"Ingrid's birthday\"\n  \
        memctl search --all \"wifi password\" -k 3 --json"
    )]
    Search(SearchArgs),
    /// The passage index: rebuild it from the stored logs, or show how far it has read
    #[command(subcommand)]
    Index(IndexCommand),
    /// Show, list, compare, edit or roll back a stream's memory versions
    #[command(subcommand)]
    Memory(MemoryCommand),
    /// List or remove streams
    #[command(subcommand)]
    Streams(StreamsCommand),
    /// Run the daemon that watches files and chat logs and keeps their memories, or ask
    /// whether it runs
    #[command(subcommand)]
    Daemon(DaemonCommand),
    /// Add, list or remove the files and folders the daemon watches (`[[watch]]` in the
    /// configuration file; comments and other keys are kept)
    #[command(subcommand)]
    Watch(WatchCommand),
    /// Write a stream (log, chunks, every memory version) as JSON Lines to stdout
    Export { stream: String },
    /// Recreate a stream from `memctl export` output (a file, or - for standard input)
    Import {
        /// The export [default: -]
        file: Option<PathBuf>,
        /// Import under this name instead of the exported one
        #[arg(long, value_name = "NAME")]
        stream: Option<String>,
    },
    /// One chat turn with the model: prints its reply
    Generate(GenerateArgs),
    /// Facts about the model file
    #[command(subcommand)]
    Model(ModelCommand),
    /// Token ids of a text, as the model's tokenizer splits it
    Tokenize(TokenizeArgs),
    /// Benchmarks that print numbers
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Train the memory agent: LoRA adapters learned from generated trajectories whose
    /// ideal memories are known
    ///
    /// Examples come from a seed (`memctl train data` prints them); every update is
    /// logged to OUT/train.jsonl with a loss plot OUT/loss.svg; OUT/checkpoint.safetensors
    /// is written every --checkpoint-every updates and on SIGINT/SIGTERM, and --resume
    /// continues exactly. At the end, and at a stop, OUT/adapter.safetensors (f16) and
    /// OUT/adapter.json (base model sha256, data seed, command, metrics) are written.
    #[command(
        args_conflicts_with_subcommands = true,
        after_help = "Examples:\n  memctl train --out runs/tuned --steps 300\n  \
        memctl train --out runs/tuned --steps 300 --resume   # after a stop\n  \
        memctl train data --count 3 --split validation"
    )]
    Train(Box<TrainArgs>),
    /// The answers to a stream's standing questions (`ask` in its watch), one per memory
    /// version, oldest first
    #[command(
        after_help = "Examples:\n  memctl watch add ~/notes --ask \"What tasks are still open?\"\n  \
        memctl answers notes\n  memctl answers notes --json"
    )]
    Answers {
        /// The stream whose answers to list (see `memctl streams list`)
        stream: String,
        /// Print the answers as JSON (question, version, answer, created, seconds)
        #[arg(long)]
        json: bool,
    },
    /// Serve memory to assistants over the Model Context Protocol (stdio)
    ///
    /// Tools: `remember` (append text or chat turns to a stream and read them into its
    /// memory), `recall` (answer a question from a stream's memory; `deep` reads the
    /// stored chunks again), `memory` (a stream's memory text, at a version if given),
    /// `history` (its versions) and `streams`. Each stream's latest memory is also a
    /// resource, memagent://streams/NAME/memory. While a daemon holds the data directory,
    /// every call goes through it (the daemon reads remembered text on its own schedule);
    /// otherwise each call opens the database for its own length and the model is loaded
    /// on first need. The server exits when its standard input closes.
    #[command(
        after_help = "Register with a desktop assistant (mcpServers in its JSON \
        configuration):\n  \"memagent\": {\"command\": \"memctl\", \"args\": [\"mcp\"]}\n\n\
        Try it by hand with the MCP Inspector:\n  npx @modelcontextprotocol/inspector memctl mcp"
    )]
    Mcp(McpArgs),
}

#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(subcommand)]
    pub command: Option<TrainCommand>,
    #[command(flatten)]
    pub run: TrainRunArgs,
}

#[derive(Debug, Subcommand)]
pub enum TrainCommand {
    /// Print generated training examples as JSON Lines (message, target, family)
    Data(TrainDataArgs),
    /// Rejection sampling: read training documents several times with sampling, score
    /// each reading by its outcome, keep the best that earned the reward
    ///
    /// Each document of the training split is read --samples times by the model (with
    /// --adapter's adapter), every memory step its own conversation as at inference:
    /// question mode with the MemAgent templates, scored 1 when the final answer holds
    /// every planted value; general mode with --writer, scored by the share of planted
    /// facts the final memory keeps (fewer noise lines win a tie). The best reading
    /// scoring at least --min-reward is kept. One JSON line per document is appended to
    /// --out (every sample's reward, the kept reading's conversations); documents already
    /// there are skipped, so a stopped run continues. Train on the kept conversations with
    /// `memctl train --examples FILE`, then sample again with the new adapter.
    #[command(after_help = "Examples:\n  \
        memctl train sample --out runs/rs/round1.jsonl --count 64 --writer lines\n  \
        memctl train --out runs/rs --examples runs/rs/round1.jsonl --steps 60\n  \
        memctl --adapter runs/rs/adapter.safetensors train sample --out runs/rs/round2.jsonl \\\n      \
        --start 64 --count 64 --writer lines")]
    Sample(TrainSampleArgs),
}

#[derive(Debug, Args)]
pub struct TrainSampleArgs {
    #[command(flatten)]
    pub data: TrainDataOptions,
    /// Samples file (JSON Lines, appended; documents already in it are skipped)
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Documents of the training split to read
    #[arg(long, default_value_t = 16)]
    pub count: u64,
    /// First document index
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Readings sampled per document
    #[arg(long, default_value_t = 4)]
    pub samples: usize,
    /// Sampling temperature of every step
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Nucleus sampling threshold
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Seed of the sampling: the same seed, model and documents give the same readings
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Least reward a kept reading has (1: a right answer; every planted fact kept)
    #[arg(long, default_value_t = 1.0, value_parser = share)]
    pub min_reward: f64,
    /// Documents read together, their steps decoded as one batch
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// General mode with the line writer: keep every document's best reading, corrected
    /// where it fell short (the model's fact lines kept, its other lines dropped, the
    /// line of each fact it missed added at the step that states it), so documents whose
    /// wordings the model does not yet know still teach it; --min-reward then applies to
    /// question mode only
    #[arg(long)]
    pub correct: bool,
    /// Print the summary as JSON
    #[arg(long)]
    pub json: bool,
}

/// Options of the generated data, shared by training and `train data`.
#[derive(Debug, Clone, Args)]
pub struct TrainDataOptions {
    /// Seed of the generated trajectories
    #[arg(long, default_value_t = 1)]
    pub data_seed: u64,
    /// Smallest chunk of a trajectory, in tokens
    #[arg(long, default_value_t = 256)]
    pub chunk_min: usize,
    /// Largest chunk of a trajectory, in tokens (the profile's C)
    #[arg(long, default_value_t = 1024)]
    pub chunk_max: usize,
    /// Memory cap M; oracle memories stay within it
    #[arg(long, default_value_t = 256)]
    pub memory_tokens: usize,
    /// Share of general-mode (question-free) trajectories
    #[arg(long, default_value_t = 0.35)]
    pub general_share: f64,
    /// Share of examples that answer from one passage (the prompts `memctl query` gives
    /// the model, one per passage found: the question and the passage; its answer, or
    /// "not known") in place of a trajectory's steps, drawn from facts said once,
    /// changed later, never said, and lists of values
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    pub evidence_share: f64,
    /// Share of those answers read from chat exchanges: a few dated turns of two people,
    /// the fact said in a reply that shares few of the question's words, as answers read
    /// a chat log's passages
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    pub dialogue_share: f64,
    /// Share of those chat exchanges answered "not known" (the exchange left out, or the
    /// other speaker saying it of themselves), in twentieths; the shipped reader's is 0.2
    #[arg(long, default_value_t = memagent_tasks::training::DIALOGUE_UNKNOWN_SHARE, value_parser = share)]
    pub dialogue_unknown_share: f64,
    /// How general-mode update steps write the memory: `rewrite` (the whole memory) or
    /// `lines` (only the chunk's new facts, or NONE; what `memctl ingest --writer lines`
    /// asks the model)
    #[arg(long, default_value = "rewrite", value_name = "WRITER")]
    pub writer: memagent_agent::Writer,
    /// Loss weight of the lines an update step adds to its memory (new facts, changed
    /// values) and of its reply's end; lines copied from the memory weigh 1
    #[arg(long, default_value_t = 3.0)]
    pub new_fact_weight: f32,
    /// Filler folder of the training split [default: the shared essays when present]
    #[arg(long, value_name = "DIR")]
    pub haystack: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TrainDataArgs {
    #[command(flatten)]
    pub data: TrainDataOptions,
    /// Examples to print
    #[arg(long, default_value_t = 5)]
    pub count: u64,
    /// First example index
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// train or validation
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Print whole trajectories (every step's chunk and oracle memory) instead of examples
    #[arg(long)]
    pub trajectories: bool,
    /// Print every memory-update step of the trajectories as the model reads it: the
    /// message, its prompt's token ids (chat template applied, as the engine prompts), the
    /// oracle reply, and the values of each fact the chunk states and of each stated
    /// before (a reply keeps a fact when it holds all its values). The input of a
    /// reinforcement-learning trainer outside this one, e.g. GRPO on a GPU
    #[arg(long, conflicts_with = "trajectories")]
    pub steps: bool,
}

#[derive(Debug, Args)]
pub struct TrainRunArgs {
    /// Run directory: config, checkpoint, log, plot and the adapter
    #[arg(long, value_name = "DIR", default_value = "runs/memagent-lora")]
    pub out: PathBuf,
    /// Continue the run in --out from its last checkpoint (same options)
    #[arg(long)]
    pub resume: bool,
    /// Optimizer updates
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Stop after this update (checkpoint and adapter written) and leave the rest for
    /// --resume: stages of one run with the whole --steps schedule
    #[arg(long, value_name = "UPDATE")]
    pub until: Option<u64>,
    /// Examples per update (gradients accumulated; the loss is averaged over tokens)
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Peak learning rate
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Warm-up updates before the cosine decay
    #[arg(long, default_value_t = 20)]
    pub warmup: u64,
    /// Gradient clipping by global norm (0: off)
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// AdamW weight decay
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// LoRA rank
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    /// LoRA alpha (the update is scaled by alpha / rank)
    #[arg(long, default_value_t = 16.0)]
    pub alpha: f64,
    /// Projections that get adapters: q, k, v, o, gate, up, down
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    pub targets: Vec<String>,
    /// Adapt only the top N blocks: the backward pass stops at the lowest adapted
    /// block, so each update costs less (unset: every block)
    #[arg(long, value_name = "N")]
    pub top_layers: Option<usize>,
    /// Measure instead of training: run this many updates (default 6, the first one a
    /// warm-up) in a temporary directory, then print training tokens/s and useful
    /// GFLOP/s beside the prefill projections' GFLOP/s of the same model on this machine
    /// in the same run. Nothing is written to --out. Both run their products in 8-bit
    /// integers where the CPU has AVX-512 VNNI or AVX2; MEMAGENT_PREFILL_WEIGHTS=tiles
    /// measures both in f32
    #[arg(long, value_name = "UPDATES", num_args = 0..=1, default_missing_value = "6")]
    pub bench: Option<u64>,
    /// Seed of the adapters' initial values
    #[arg(long, default_value_t = 7)]
    pub init_seed: u64,
    /// Start from the adapter of an earlier run (its checkpoint.safetensors or
    /// adapter.safetensors; same rank and targets) instead of fresh values
    #[arg(long, value_name = "FILE")]
    pub init_from: Option<PathBuf>,
    /// Checkpoint every this many updates
    #[arg(long, default_value_t = 10)]
    pub checkpoint_every: u64,
    /// Score validation examples every this many updates (0: only at the end)
    #[arg(long, default_value_t = 50)]
    pub eval_every: u64,
    /// Validation examples scored each time
    #[arg(long, default_value_t = 24)]
    pub eval_examples: u64,
    #[command(flatten)]
    pub data: TrainDataOptions,
    /// Train on the kept conversations of samples files (`memctl train sample`) instead
    /// of generated examples: general-mode ones with --general-share of probability,
    /// question-mode ones otherwise; validation stays generated
    #[arg(long, value_name = "FILE")]
    pub examples: Vec<PathBuf>,
    /// With --examples: the share of training examples drawn from the samples files;
    /// the rest are generated as without them
    #[arg(long, default_value_t = 1.0, value_parser = share)]
    pub examples_share: f64,
    /// With --examples: the share of general-mode trajectories among the generated
    /// examples (and the teacher-forced validation), apart from the kept conversations'
    /// draw. 0 fills in with question-mode oracle trajectories (and --evidence-share's
    /// answers) only, so that generated oracle memories never teach the general writer
    /// [default: --general-share]
    #[arg(long, value_name = "SHARE", value_parser = share)]
    pub generated_general_share: Option<f64>,
    /// Print each update as a JSON line instead of a progress bar
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The user message
    #[arg(long, short)]
    pub prompt: String,

    /// A system message (without one, the model's chat template may insert its own)
    #[arg(long)]
    pub system: Option<String>,

    /// Most tokens to generate
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// Print the reply with token counts and timings as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchSessionsArgs {
    /// `validation` (prompts and settings may be chosen on it) or `test` (reported only)
    #[arg(long, default_value = "validation")]
    pub split: memagent_tasks::EvalSplit,

    /// Chats to generate (seeds 1.. of the split)
    #[arg(long, default_value_t = 8)]
    pub samples: u64,

    /// Sessions per chat
    #[arg(long, default_value_t = 6)]
    pub sessions: usize,

    /// Answer modes: `evidence` (memory and passages, as `memctl query`), `memory`
    /// (the memory alone, `--memory-only`)
    #[arg(long, value_delimiter = ',', default_value = "evidence,memory")]
    pub modes: Vec<String>,

    /// Leave the general memory empty (skip the memory steps): evidence alone. Search
    /// alone (`--modes search`) never runs them
    #[arg(long)]
    pub no_memory: bool,

    /// Append each question's result as a JSON line to this file
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Write each generated chat to DIR/chat-SEED.jsonl (a chat log `memctl ingest
    /// --format chat-jsonl` and the daemon read), to try it by hand
    #[arg(long, value_name = "DIR")]
    pub save_chats: Option<PathBuf>,

    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Args)]
pub struct BenchRecallArgs {
    /// Stream sizes to index and search, in millions of (approximately) tokens
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub millions: Vec<f64>,

    /// Index the large streams by words alone, as `--embedder none` does
    #[arg(long, conflicts_with = "random_vectors")]
    pub words_only: bool,

    /// Index the large streams with random vectors in place of the embedder's (embedding
    /// 10M tokens takes hours on two cores): each search scans as many vectors as it
    /// would, and the time the embedder takes for the question is measured apart and
    /// added to each search's
    #[arg(long)]
    pub random_vectors: bool,

    /// Searches timed per stream size
    #[arg(long, default_value_t = 50)]
    pub searches: usize,

    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// The stream to search (see `memctl streams list`), then what to look for: words,
    /// or a question or phrase with the same meaning. With --all, only the text
    #[arg(value_name = "STREAM] [TEXT", required = true, num_args = 1..=2)]
    pub args: Vec<String>,

    /// Passages to return
    #[arg(short = 'k', long, default_value_t = 5)]
    pub k: usize,

    /// Rank the best N passages found again by how likely the model finds the text as a
    /// question after each (query likelihood: one prefill of each passage, about 0.3 s
    /// a passage on 2 cores; loads the local model), then return the best -k. 0 keeps
    /// the search's order
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = rerank_depth)]
    pub rerank: usize,

    /// Search every stream
    #[arg(long)]
    pub all: bool,

    /// Print the passages as JSON: text, stream, byte range, source file and line, time,
    /// the memory version that read it, fused score and each ranking's rank
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Rebuild the passage index of one stream, or of all, from the stored logs
    Rebuild {
        /// The stream [default: every stream]
        stream: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Per stream: bytes of the log, bytes indexed, passages
    Status {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// The stream to append to (created when new)
    pub stream: String,

    /// File to append, or - for standard input [default: -]
    pub file: Option<PathBuf>,

    /// Append the whole file even if it was ingested before
    #[arg(long)]
    pub force: bool,

    /// Only append; leave the pending text for a later ingest
    #[arg(long)]
    pub no_process: bool,

    /// How to read the input: `chat-jsonl` renders one OpenAI-style message per line as
    /// chat turns (as watched chat logs are); `auto` takes .jsonl files as chat logs and
    /// anything else as text
    #[arg(long, value_enum, default_value = "auto")]
    pub format: IngestFormat,

    /// Print what was done as JSON
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    pub stream: String,

    /// The question; several questions are answered together (decoded as one batch),
    /// each printed after its question
    #[arg(value_name = "QUESTION", required = true, num_args = 1..)]
    pub questions: Vec<String>,

    /// Answer from this memory version instead of the latest
    #[arg(long, value_name = "VERSION", conflicts_with = "deep")]
    pub at: Option<u64>,

    /// Read the stored chunks again with this question (the exact MemAgent protocol,
    /// linear in the stream's length); the question keeps its own memory, so asking again
    /// later reads only chunks that arrived since. Several questions read the chunks side
    /// by side, each step of all of them decoded as one batch
    #[arg(long)]
    pub deep: bool,

    /// Answer from the memory alone (the MemAgent final step, without searching the
    /// stored text)
    #[arg(long, conflicts_with = "deep")]
    pub memory_only: bool,

    /// Tokens of passages the answer may read, shared out among its prompts (one per
    /// passage); a question asking for every value of a kind ("What pets does Ana
    /// have?") reads three times as many, from three times -k passages; a question
    /// asking when is dated from five times -k passages by code, outside this budget
    #[arg(long, value_name = "TOKENS", default_value_t = memagent_memory::EVIDENCE_TOKENS)]
    pub evidence_tokens: usize,

    /// Passages searched for each question (those that fit the budget go in the prompt)
    #[arg(short = 'k', long, default_value_t = memagent_memory::PASSAGES_K)]
    pub passages: usize,

    /// Rank the best N passages found for each question again, before the answer reads
    /// them, by how likely the model finds the question after each (query likelihood:
    /// one prefill of each passage, about 0.3 s a passage on 2 cores; needs the local
    /// model; the daemon keeps what it read, so a passage ranked again later costs only
    /// the question's tokens, and with `[daemon] read_ahead` reads new passages while
    /// idle). 0 keeps the search's order [default: `rerank` in the config file's
    /// `[query]`, else 0]
    #[arg(long, value_name = "N", value_parser = rerank_depth)]
    pub rerank: Option<usize>,

    /// Print the answer with the version it came from (and the passages, with their
    /// provenance and scores) as JSON
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IngestFormat {
    Auto,
    Text,
    Markdown,
    ChatJsonl,
}

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Print a memory version (the latest by default)
    #[command(after_help = "Examples:\n  memctl memory show notes\n  \
        memctl memory show notes --sources          # each line with the passage it came from\n  \
        memctl memory show notes --at 3 --json")]
    Show {
        stream: String,
        #[arg(long, value_name = "VERSION")]
        at: Option<u64>,
        /// After each line, where it came from: the version that wrote it, the chunk that
        /// version read (bytes of the stream's log) and the passage of that chunk most like
        /// the line, with its file and line
        #[arg(long)]
        sources: bool,
        #[arg(long)]
        json: bool,
    },
    /// List every memory version with its chunk, size, author and template
    History {
        stream: String,
        #[arg(long)]
        json: bool,
    },
    /// Line differences between two versions [default: the latest and its parent]
    Diff {
        stream: String,
        from: Option<u64>,
        to: Option<u64>,
    },
    /// Store a new version written by a person: opens $EDITOR on a terminal, else reads
    /// the new text from standard input
    Edit { stream: String },
    /// Add a new version equal to an old one (history is never rewritten)
    Rollback { stream: String, version: u64 },
}

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Run in the foreground until SIGTERM or SIGINT (exit 0 after a clean stop); logs
    /// go to stderr
    ///
    /// Follows every `[[watch]]` of the configuration file (a start-up scan catches what
    /// changed while it was down, notify events and periodic rescans what changes after),
    /// appends new content to its stream at once, and reads a stream into memory when a
    /// chunk's worth is pending or it has been idle for a while. Serves `memctl query`,
    /// `memory`, `streams` and `ingest` on a Unix socket in the data directory (mode
    /// 0600); with `--listen`, also on TCP with a bearer token.
    #[command(
        after_help = "Examples:\n  memctl watch add ~/notes --stream notes\n  memctl daemon run\n  \
        memctl query notes \"What did I promise Ada?\"\n\n\
        A systemd user unit is in contrib/systemd/memagent.service."
    )]
    Run(Box<DaemonRunArgs>),
    /// Whether a daemon runs for the data directory, with each stream's pending work,
    /// lag and throughput, and the passages its model read ahead (`[daemon] read_ahead`)
    /// (exit 1 when none runs)
    Status {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct DaemonRunArgs {
    /// Seconds without new content after which a stream's partial chunk is read
    /// [default: `daemon.idle_seconds` in the config file, else 30]
    #[arg(long, value_name = "SECS")]
    pub idle_seconds: Option<f64>,
    /// Seconds between full rescans of the watches, a safety net for lost events
    /// [default: `daemon.rescan_seconds`, else 60]
    #[arg(long, value_name = "SECS")]
    pub rescan_seconds: Option<f64>,
    /// Seconds a write through the API or the proxy may take before it is answered as
    /// failed (not acknowledged) and the store reported degraded, as on a failing disk
    /// [default: `daemon.write_timeout_seconds`, else 30]
    #[arg(long, value_name = "SECS")]
    pub write_timeout_seconds: Option<f64>,
    /// Seconds the daemon takes at most to stop after SIGTERM or SIGINT, whatever the
    /// store is doing; a second signal stops it at once [default:
    /// `daemon.stop_timeout_seconds`, else 10]
    #[arg(long, value_name = "SECS")]
    pub stop_timeout_seconds: Option<f64>,
    /// This daemon's name in the leases of a database shared with other daemons
    /// (`--database`) [default: `daemon.name`, else HOST:PID]
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Seconds a stream's lease lasts unless renewed, in a shared database: a daemon that
    /// dies leaves its streams to the others after this long [default:
    /// `daemon.lease_seconds`, else 30]
    #[arg(long, value_name = "SECS")]
    pub lease_seconds: Option<f64>,
    /// Also serve the API on TCP: PORT (on 127.0.0.1) or HOST:PORT; requests need
    /// `Authorization: Bearer $MEMAGENT_API_TOKEN` [default: `daemon.listen`, off]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Subcommand)]
pub enum WatchCommand {
    /// Watch a file or folder
    Add {
        /// The file or folder (stored as an absolute path)
        path: PathBuf,
        /// Put everything into this stream [default: one stream per file]
        #[arg(long)]
        stream: Option<String>,
        /// auto, text, markdown or chat-jsonl
        #[arg(long, default_value = "auto")]
        format: String,
        /// Only files matching this glob (repeatable)
        #[arg(long)]
        include: Vec<String>,
        /// Leave out files matching this glob (repeatable)
        #[arg(long)]
        exclude: Vec<String>,
        /// Do not descend into subfolders
        #[arg(long)]
        no_recursive: bool,
        /// A standing question (repeatable): answered from each new memory version of the
        /// watch's streams and stored with it (`memctl answers STREAM` lists them)
        #[arg(long, value_name = "QUESTION")]
        ask: Vec<String>,
    },
    /// The watched files and folders
    List {
        #[arg(long)]
        json: bool,
    },
    /// Stop watching a path (given as added, or by its number in `watch list`)
    Rm { path: String },
}

#[derive(Debug, Subcommand)]
pub enum StreamsCommand {
    /// Streams with their size, chunks and latest memory version
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete a stream: its content log and every memory version
    Rm { stream: String },
}

#[derive(Debug, Args)]
pub struct AskArgs {
    /// The question to answer from the document
    pub question: String,

    /// The document [default: standard input]
    #[arg(long, short, value_name = "PATH")]
    pub file: Option<PathBuf>,

    /// Put the whole document in one prompt instead (a baseline; only when it fits the
    /// model's context)
    #[arg(long)]
    pub direct: bool,

    /// Print the memory after every chunk (on stdout, before the answer)
    #[arg(long)]
    pub show_memory: bool,

    /// Print the answer, the extracted answer and per-step statistics as JSON
    #[arg(long)]
    pub json: bool,

    /// Answer from the final memory alone (the MemAgent protocol), without searching
    /// the document's passages
    #[arg(long, conflicts_with = "direct")]
    pub memory_only: bool,

    /// Tokens of passages the answer may read, shared out among its prompts (one per
    /// passage); a question asking for every value of a kind ("What pets does Ana
    /// have?") reads three times as many, from three times -k passages; a question
    /// asking when is dated from five times -k passages by code, outside this budget
    #[arg(long, value_name = "TOKENS", default_value_t = memagent_memory::EVIDENCE_TOKENS)]
    pub evidence_tokens: usize,

    /// Passages searched for the question
    #[arg(short = 'k', long, default_value_t = memagent_memory::PASSAGES_K)]
    pub passages: usize,

    #[command(flatten)]
    pub run: LoopArgs,
}

/// How the memory loop runs: profile, backend and sampling.
#[derive(Debug, Clone, Args)]
pub struct LoopArgs {
    #[command(flatten)]
    pub profile: ProfileArgs,

    #[command(flatten)]
    pub backend: BackendArgs,

    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Overrides of the model's profile (chunk size, memory cap, answer cap).
#[derive(Debug, Clone, Args)]
pub struct ProfileArgs {
    /// Chunk size, memory cap and answer cap together: `small` (C = 1024, M = 256,
    /// answers 256) or `paper` (C = 5000, M = 1024, answers 1024) [default: from the
    /// model's size: small under 1B parameters. A remote model's size comes from the
    /// server (llama.cpp reports it) or from --tokenizer MODEL.gguf; when neither tells
    /// it, --profile is required]
    #[arg(long, value_enum, value_name = "NAME")]
    pub profile: Option<ProfileKind>,

    /// Tokens per chunk C [default: the profile's: 1024 for models under 1B
    /// parameters, else the paper's 5000]
    #[arg(long, value_name = "N")]
    pub chunk_tokens: Option<usize>,

    /// Memory cap M in tokens [default: 256 for models under 1B parameters, else 1024]
    #[arg(long, value_name = "N")]
    pub memory_tokens: Option<usize>,

    /// Most tokens of the final answer [default: 256 for models under 1B parameters,
    /// else 1024]
    #[arg(long, value_name = "N")]
    pub answer_tokens: Option<usize>,

    /// Final prompt: `boxed` (answer in \boxed{}, the RL checkpoints' form) or `eval`
    /// ("Therefore, the answer is ...")
    #[arg(long, default_value = "boxed", value_name = "FORM")]
    pub final_template: memagent_agent::FinalForm,

    /// How the general memory is written after each chunk: `rewrite` (the model rewrites
    /// the whole memory, the MemAgent protocol) or `lines` (the model writes only the
    /// chunk's new facts; they are merged in by code, duplicates skipped, a newer line
    /// about the same thing replacing the older, and the model rewrites only to compact
    /// past M) [default: `writer` under [profile] in the config file, then the writer
    /// the model's adapter was trained for (the default model's: lines), then rewrite]
    #[arg(long, value_name = "WRITER")]
    pub writer: Option<memagent_agent::Writer>,

    /// How the loop reads each chunk when it has a question: `focused` (only the
    /// sentences bearing on the question, by its names, numbers and codes or else two of
    /// its words, following the names and numbers of the sentences kept; a chunk with none
    /// leaves the memory as it was) or `whole` (the whole chunk, the MemAgent protocol)
    /// [default: `reading` under [profile] in the config file, then focused for models
    /// of the small profile (under 1B parameters) and whole for larger ones, which the
    /// RL-trained checkpoints are]
    #[arg(long, value_name = "READING")]
    pub reading: Option<memagent_agent::Reading>,
}

/// Named loop profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileKind {
    /// Models under a billion parameters: C = 1024, M = 256, answers up to 256 tokens
    Small,
    /// The MemAgent paper's: C = 5000, M = 1024, answers up to 1024 tokens
    Paper,
}

impl ProfileKind {
    pub fn profile(self) -> memagent_agent::Profile {
        match self {
            Self::Small => memagent_agent::Profile::SMALL,
            Self::Paper => memagent_agent::Profile::PAPER,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Small => "small",
            Self::Paper => "paper",
        }
    }
}

/// Which backend runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The GGUF model, in this process
    Local,
    /// An OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, Ollama)
    Openai,
}

#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Where the model runs [default: `kind` in the config file's [backend], else local]
    #[arg(long, value_enum, env = "MEMAGENT_BACKEND")]
    pub backend: Option<BackendKind>,

    /// Base URL of the OpenAI-compatible API, e.g. http://localhost:8000/v1
    #[arg(long, env = "MEMAGENT_BASE_URL", value_name = "URL")]
    pub base_url: Option<String>,

    /// The served model's name, as the server knows it
    #[arg(long, env = "MEMAGENT_REMOTE_MODEL", value_name = "NAME")]
    pub remote_model: Option<String>,

    /// Environment variable that holds the API key (sent as a bearer token when set)
    #[arg(long, default_value = "OPENAI_API_KEY", value_name = "VAR")]
    pub api_key_env: String,

    /// Seconds one request may take before it is abandoned (and retried)
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub timeout: u64,

    /// Retries of a request answered 429 or 5xx, or lost in transport
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub retries: u32,

    /// The remote model's context in tokens [default: asked from the server's /models]
    #[arg(long, value_name = "N")]
    pub context_tokens: Option<usize>,
}

#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy (deterministic)
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,

    /// Nucleus sampling: keep the most likely tokens up to this probability mass
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,

    /// Seed of the sampler (used when temperature > 0)
    #[arg(long, default_value_t = 299_792_458)]
    pub seed: u64,

    /// Speculative decoding of greedy local replies: up to N tokens drafted per forward
    /// pass from earlier text that ends like the reply so far (memory rewrites copy much
    /// of their prompt); 0 decodes one token per pass. The output is identical either way
    #[arg(long, value_name = "N", default_value_t = memagent_engine::DEFAULT_DRAFT_TOKENS)]
    pub draft_tokens: usize,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Architecture, size, quantization, context, vocabulary, chat template and sha256
    Info {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
    /// Write the model with its adapter merged in as a GGUF file, for llama.cpp, vLLM or
    /// any server that loads GGUF (then used with --backend openai)
    #[command(
        after_help = "Example:\n  memctl --adapter runs/my-run/adapter.safetensors model export --out tuned.gguf"
    )]
    Export(ModelExportArgs),
}

#[derive(Debug, Args)]
pub struct ModelExportArgs {
    /// The GGUF file to write
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Storage type of the adapted projections (the others keep theirs): q8_0 keeps the
    /// update that a 4-bit type would round away
    #[arg(long = "type", value_enum, default_value_t = ExportType::Q8_0)]
    pub dtype: ExportType,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ExportType {
    #[value(name = "q8_0")]
    Q8_0,
    F16,
    F32,
}

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// The text; special-token texts such as <|im_start|> become their ids
    pub text: String,

    /// Print ids and token strings as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode speed of the local engine, with peak memory
    Engine(BenchEngineArgs),
    /// Multi-session chats: facts stated once and asked sessions later, facts changed
    /// later (the newest value is right), and questions about things never said (the
    /// answer must say so); accuracy of each kind per answer mode
    Sessions(BenchSessionsArgs),
    /// Question answering over real conversations (LoCoMo's schema, or JSON Lines of
    /// turns and questions): each conversation ingested as a chat log, each question
    /// asked as `memctl query` asks; token F1 per category as published, evidence recall
    /// of the turns read (and of the sentences of them the model was shown), abstentions,
    /// seconds and model calls per question. Resumable:
    /// results are saved as each question is answered
    #[command(after_help = "The JSON Lines format, one object per line:\n  \
        {\"conversation\": \"trip\", \"id\": \"t1\", \"name\": \"Ana\", \"content\": \"I flew to Rome yesterday.\", \"timestamp\": \"2023-05-11 14:02\"}\n  \
        {\"conversation\": \"trip\", \"question\": \"When did Ana fly to Rome?\", \"answer\": \"10 May 2023\", \"evidence\": [\"t1\"], \"category\": \"temporal\"}\n\n\
        Categories: single-hop, multi-hop, temporal, open-domain, adversarial (no answer: the right \
        answer says it is not mentioned).\n\n\
        Evidence: the ids of the turns that hold the answer (an entry may list several between \
        semicolons); an id naming no turn is warned about and left out, and a question without \
        an evidence turn is left out of the evidence measures.\n\n\
        Example:\n  memctl bench qa --data ../shared/data/locomo-dev/locomo-dev.json --every 4 --no-memory --out qa-run")]
    Qa(Box<BenchQaArgs>),
    /// Recall's speed: embedding throughput, indexing cost per chunk, search latency on
    /// large streams, index size
    Recall(BenchRecallArgs),
    /// Single-needle retrieval against document length: the memory loop vs the whole
    /// document in one prompt (--direct), with accuracy and seconds per 1K input tokens
    Needle(Box<BenchNeedleArgs>),
    /// The store alone (memory text supplied, no model): append and step-commit latency,
    /// a query's store reads, and database size against content size; with
    /// `--database`, the same run through PostgreSQL beside the embedded database
    Store(BenchStoreArgs),
    /// The daemon as a user runs it (a child process watching files): lag from an append
    /// to the memory updated, and input tokens per second with 1, 4 and 16 watched
    /// streams
    Daemon(BenchDaemonArgs),
    /// RULER-style tasks against length, the memory loop vs the whole document in one
    /// prompt: accuracy and seconds per 1K tokens, with a results JSON, a Markdown report
    /// and plots. Resumable: results are saved as each sample finishes
    #[command(
        after_help = "Tasks: niah_single, niah_single_word, niah_single_uuid, niah_multikey, \
        niah_multivalue, niah_multiquery, vt, cwe, fwe, qa (needs --qa FILE).\n\n\
        Example:\n  memctl bench ruler --tasks niah_single,niah_multikey,vt --samples 5 --out ruler-run"
    )]
    Ruler(Box<BenchRulerArgs>),
    /// The local loop against the same loop driven through llama.cpp's server on the same
    /// model file, in one run: input tokens/s of each and their ratio, generated tokens,
    /// prefill and decode seconds, end to end and at a fixed generation length
    #[command(
        after_help = "Example:\n  memctl bench loop --llama-server ~/llama.cpp/build/bin/llama-server\n\n\
        The server is started on the model file for each profile with -c fitting the \
        profile's largest step and -t the threads this machine has, and stopped after."
    )]
    Loop(BenchLoopArgs),
    /// The OpenAI-compatible proxy in a real daemon, in front of a loopback echo
    /// upstream: each request's time direct and through the proxy (p50/p99 and the
    /// difference), and the lag from a turn through the proxy to the memory version that
    /// holds it
    Proxy(BenchProxyArgs),
    /// Many daemons sharing one PostgreSQL database (`--database`): memory steps per
    /// second of 1, 2 and 3 daemons (child processes) reading the same streams under
    /// leases, each run on a fresh database. The model is a loopback stand-in that
    /// answers at once (so the figure is the store's and the leases'), or a served one
    #[command(after_help = "Examples:\n  \
        memctl --database postgres://memagent@127.0.0.1:5432/postgres bench shared\n  \
        memctl --database postgres://… bench shared --daemons 1,2 --streams 40 \\\n    \
        --upstream http://127.0.0.1:8080/v1   # llama-server -np 4\n\n\
        Each run creates a database on the server (the URL's user needs CREATEDB) and drops \
        it after.")]
    Shared(BenchSharedArgs),
    /// The daemon killed with SIGKILL at random moments and restarted, N times, while a
    /// watched chat log grows by a line every 50 ms and the API and the proxy are used:
    /// then every chat line is in its stream's log byte for byte, every acknowledged
    /// append is stored, each memory chain is continuous and the passage index equals a
    /// rebuild; restart-to-ready and memory-lag percentiles. Fails (exit 1) on any loss
    #[command(after_help = "Example:\n  memctl bench soak --kills 100\n\n\
        The proxy relays to a loopback server that echoes each request (a stand-in for a \
        served model). Memory lag is the time from a chat line written to the first memory \
        version that read it, restarts included.")]
    Soak(BenchSoakArgs),
}

#[derive(Debug, Args)]
pub struct BenchSoakArgs {
    /// SIGKILLs, each followed by a restart
    #[arg(long, default_value_t = 100)]
    pub kills: usize,
    /// Milliseconds between chat-log lines
    #[arg(long, default_value_t = 50)]
    pub interval_ms: u64,
    /// The daemon runs a random time between these (milliseconds) after it is ready,
    /// then is killed
    #[arg(long, default_value_t = 1000)]
    pub min_up_ms: u64,
    #[arg(long, default_value_t = 4000)]
    pub max_up_ms: u64,
    /// Seed of the kill moments and the writes' cut points
    #[arg(long, default_value_t = 20261127)]
    pub seed: u64,
    /// The daemon's idle interval (a partial chunk is read this long after the last
    /// append)
    #[arg(long, default_value_t = 0.5)]
    pub idle_seconds: f64,
    /// The daemon's chunk size [default: the model's profile]
    #[arg(long)]
    pub chunk_tokens: Option<usize>,
    /// The daemon's memory size [default: the model's profile]
    #[arg(long)]
    pub memory_tokens: Option<usize>,
    /// After the last restart, how long memory may take to read what is left (the log
    /// and the index must be complete regardless)
    #[arg(long, default_value_t = 600.0)]
    pub drain_seconds: f64,
    /// Where the data directory, chat log and daemon log go [default: a temporary
    /// folder, removed after]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Keep the folder after the run
    #[arg(long)]
    pub keep: bool,
    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchLoopArgs {
    /// llama.cpp's `llama-server` binary, started on the model file for each profile
    #[arg(long, value_name = "PATH")]
    pub llama_server: Option<PathBuf>,
    /// Instead of --llama-server: an OpenAI-compatible server already serving the same
    /// model with a context that fits every profile run
    #[arg(long, value_name = "URL")]
    pub server_url: Option<String>,
    /// The model name sent to the server
    #[arg(long, default_value = "memagent-bench", value_name = "NAME")]
    pub remote_model: String,
    /// Profiles to run (comma-separated)
    #[arg(long, value_enum, value_delimiter = ',', default_value = "small,paper")]
    pub profiles: Vec<ProfileKind>,
    /// `end-to-end` (the loop as users run it, each engine stopping where it stops) and
    /// `fixed` (every reply runs to its cap: end of turn ignored, no loop stops, so both
    /// generate the same number of tokens)
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "end-to-end,fixed"
    )]
    pub modes: Vec<LoopMode>,
    /// Document length in tokens (a needle in filler)
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub tokens: usize,
    /// Documents per profile and mode (needles at spread depths), summed in the table. The
    /// engines' greedy memories differ in length from one document to the next, so compare
    /// end to end over several (4 or more)
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub documents: usize,
    /// Seed of the first document
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads of llama-server [default: this machine's, as the local engine uses]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Folder of .txt files for filler [default: ../shared/data/haystack/paul-graham-essays
    /// when it exists, else RULER's noise]
    #[arg(long, value_name = "DIR")]
    pub haystack: Option<PathBuf>,
    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

/// How `memctl bench loop` runs the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoopMode {
    /// As users run it
    EndToEnd,
    /// Every reply exactly at its cap
    Fixed,
}

impl LoopMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::EndToEnd => "end-to-end",
            Self::Fixed => "fixed",
        }
    }
}

#[derive(Debug, Args)]
pub struct BenchRulerArgs {
    /// Tasks to run (comma-separated)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "niah_single,niah_multikey,vt"
    )]
    pub tasks: Vec<String>,
    /// Document lengths in model tokens (any list; millions work, at linear cost)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "2048,4096,8192,16384,32768"
    )]
    pub lengths: Vec<usize>,
    /// Samples per task and length
    #[arg(long, default_value_t = 5)]
    pub samples: usize,
    /// Seed of the first sample (sample i uses this + i, the same at every length)
    #[arg(long, default_value_t = 1)]
    pub task_seed: u64,
    /// Modes: `memory` (the loop, asked with the question: `memctl ask --memory-only`),
    /// `evidence` (the loop's final memory beside the document's passages found for the
    /// question: `memctl ask`), `passages` (the passages alone, no loop), `direct` (one
    /// prompt; n/a where it does not fit) and, with --stream, `general` (the question-free
    /// memory that `memctl ingest` keeps, asked as `memctl query --memory-only` asks).
    /// `memory` and `evidence` share one loop per sample
    #[arg(long, value_delimiter = ',', default_value = "memory,direct")]
    pub modes: Vec<String>,
    /// `test`: RULER's own sentences and keys (the benchmark); `validation`: other
    /// sentences, keys, seeds and filler (generated field reports unless --haystack),
    /// on which settings are chosen
    #[arg(long, default_value = "test")]
    pub split: memagent_tasks::EvalSplit,
    /// Passages searched for the question (evidence and passages modes)
    #[arg(short = 'k', long, default_value_t = memagent_memory::PASSAGES_K)]
    pub passages: usize,
    /// Tokens of passages the answer may read, shared out among its prompts (evidence
    /// and passages modes); a question asking for every value reads three times as many
    #[arg(long, value_name = "TOKENS", default_value_t = memagent_memory::EVIDENCE_TOKENS)]
    pub evidence_tokens: usize,
    /// Read each sample through the store: its document becomes the stream
    /// NAME/TASK/LENGTH/seedN/C…-M… of the database, read into its general memory as
    /// `memctl ingest` reads; `memory` then asks with a question chain (as `memctl query
    /// --deep`) and `general` from the general memory. Every step is committed, so a
    /// stopped run resumes at the chunk it reached
    #[arg(long, value_name = "NAME")]
    pub stream: Option<String>,
    /// Folder of .txt files for filler [default: ../shared/data/haystack/paul-graham-essays
    /// when it exists, else RULER's noise]
    #[arg(long, value_name = "DIR")]
    pub haystack: Option<PathBuf>,
    /// QA items for the `qa` task: JSON Lines of {question, answers, gold, distractors}
    #[arg(long, value_name = "FILE")]
    pub qa: Option<PathBuf>,
    /// Folder for results.jsonl (appended as samples finish), results.json, report.md,
    /// accuracy.svg and seconds.svg
    #[arg(long, value_name = "DIR", default_value = "ruler-results")]
    pub out: PathBuf,
    /// Forget saved results and start over
    #[arg(long)]
    pub fresh: bool,
    /// Samples of one task, length and mode read side by side, each step of all of them
    /// decoded as one batch (the same answers as one at a time; 1 reads them one by one)
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub batch: u16,
    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Args)]
pub struct BenchQaArgs {
    /// Conversations with questions: LoCoMo's JSON, or JSON Lines (see below)
    #[arg(long, value_name = "FILE")]
    pub data: PathBuf,
    /// Only these conversations (their ids, comma-separated)
    #[arg(long, value_delimiter = ',')]
    pub conversations: Vec<String>,
    /// Only questions of these categories (single-hop, multi-hop, temporal, open-domain,
    /// adversarial)
    #[arg(long, value_delimiter = ',')]
    pub categories: Vec<String>,
    /// Ask every Nth question of each conversation (1: all)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub every: u64,
    /// Answer modes: `evidence` (memory and passages, as `memctl query`), `memory` (the
    /// memory alone, `--memory-only`), `search` (no answer: the search alone, for its
    /// evidence recall at 1, 5 and 10 passages; results.jsonl lists each question's
    /// passages found, 10 or -k when more, with their turns, scores and likelihoods),
    /// `direct` (the baseline: as much of the conversation's end as fits the model's
    /// context, in one prompt)
    #[arg(long, value_delimiter = ',', default_value = "evidence")]
    pub modes: Vec<String>,
    /// Leave the general memory empty (skip the memory steps): passages alone
    #[arg(long)]
    pub no_memory: bool,
    /// Passages searched per question (the search mode lists 10, or this many when
    /// more)
    #[arg(short = 'k', long, default_value_t = memagent_memory::PASSAGES_K)]
    pub passages: usize,
    /// Tokens of passages an answer may read (a question asking for every value: three
    /// times as many, from three times -k passages)
    #[arg(long, value_name = "TOKENS", default_value_t = memagent_memory::EVIDENCE_TOKENS)]
    pub evidence_tokens: usize,
    /// Rank the best N passages found again by the model's likelihood of the question
    /// (`memctl query --rerank`; in the search mode too). 0 keeps the search's order
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = rerank_depth)]
    pub rerank: usize,
    /// With --rerank: before a conversation's questions, read its passages ahead as the
    /// daemon does while idle (`[daemon] read_ahead`), timed apart from the questions
    #[arg(long, requires = "rerank")]
    pub read_ahead: bool,
    /// Folder for the conversations' databases, results.jsonl (appended as questions are
    /// answered), results.json, report.md and f1.svg
    #[arg(long, value_name = "DIR", default_value = "qa-results")]
    pub out: PathBuf,
    /// Forget saved results and start over (the databases are kept)
    #[arg(long)]
    pub fresh: bool,
    /// Ablations: `dates` shows the passages without their resolved dates
    #[arg(long, value_delimiter = ',')]
    pub without: Vec<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Args)]
pub struct BenchSharedArgs {
    /// Numbers of daemons, one run each
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub daemons: Vec<usize>,
    /// Streams appended to at the start of each run
    #[arg(long, default_value_t = 300)]
    pub streams: usize,
    /// Chunks of text each stream gets: enough that a run measures the daemons' steady
    /// rate rather than their start (a daemon looks for text appended elsewhere once a
    /// second, so the first steps wait up to a second)
    #[arg(long, default_value_t = 12)]
    pub chunks: usize,
    /// Tokens per chunk
    #[arg(long, default_value_t = 64)]
    pub chunk_tokens: usize,
    /// The daemons' lease time
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub lease_seconds: f64,
    /// An OpenAI-compatible server the daemons step with, in place of the stand-in
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// With --upstream: the served model's name (llama-server takes any)
    #[arg(long, value_name = "NAME")]
    pub remote_model: Option<String>,
    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchProxyArgs {
    /// Requests timed each way (direct and through the proxy), after 10 of warm-up
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Turns whose memory lag is timed
    #[arg(long, default_value_t = 3)]
    pub turns: usize,
    /// The daemon's idle interval: a turn shorter than a chunk is read this long after it
    #[arg(long, default_value_t = 1.0)]
    pub idle_seconds: f64,
    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchDaemonArgs {
    /// Numbers of watched files (one stream each) for the throughput runs
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub streams: Vec<usize>,
    /// Tokens each stream reads in a throughput run, in whole chunks (rounded down to a
    /// multiple of the chunk size); each file holds a quarter chunk more, left unread
    #[arg(long, default_value_t = 2048)]
    pub tokens: usize,
    /// Chunk-sized appends timed for the lag
    #[arg(long, default_value_t = 5)]
    pub chunk_appends: usize,
    /// One-line appends timed for the lag (each waits for the idle interval)
    #[arg(long, default_value_t = 3)]
    pub line_appends: usize,
    /// The daemon's idle interval for the one-line appends (its default is 30)
    #[arg(long, default_value_t = 30.0)]
    pub idle_seconds: f64,
    /// Watched files kept busy (several chunks each to read) while chunk-sized appends to
    /// one more file are timed; 0 skips the lag under load
    #[arg(long, default_value_t = 16)]
    pub busy_streams: usize,
    /// Chunk-sized appends timed while the busy streams read
    #[arg(long, default_value_t = 3)]
    pub busy_appends: usize,
    /// Folder of .txt files for the content [default: the shared essays, else noise]
    #[arg(long, value_name = "DIR")]
    pub haystack: Option<PathBuf>,
    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchStoreArgs {
    /// Content to append, in MB
    #[arg(long, default_value_t = 10)]
    pub megabytes: usize,

    /// Tokens per chunk (converted to bytes with the model's tokenizer on the content)
    #[arg(long, default_value_t = 1024)]
    pub chunk_tokens: usize,

    /// Bytes per append (commit 1)
    #[arg(long, default_value_t = 65536)]
    pub append_bytes: usize,

    /// Folder of .txt files for the content [default: the shared essays, else noise]
    #[arg(long, value_name = "DIR")]
    pub haystack: Option<PathBuf>,

    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchNeedleArgs {
    /// Document lengths in tokens
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "2048,4096,8192,16384,32768"
    )]
    pub lengths: Vec<usize>,

    /// Needles (documents) per length, at depths spread evenly through the document
    #[arg(long, default_value_t = 5)]
    pub samples: usize,

    /// Seed of the first needle (sample i uses this + i, the same at every length; the
    /// seed draws the city, the number and where the filler starts)
    #[arg(long, default_value_t = 1)]
    pub task_seed: u64,

    /// Folder of .txt files to cut filler from [default:
    /// ../shared/data/haystack/paul-graham-essays when it exists, else RULER's noise]
    #[arg(long, value_name = "DIR")]
    pub haystack: Option<PathBuf>,

    /// Modes to run: `memory` (the loop) and/or `direct` (one prompt, where it fits)
    #[arg(long, value_delimiter = ',', default_value = "memory,direct")]
    pub modes: Vec<String>,

    /// Append every sample's result as a JSON line to this file as it finishes
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Print the results as JSON instead of a table
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Args)]
pub struct BenchEngineArgs {
    /// Prompt sizes to prefill, in tokens (0: none)
    #[arg(long, value_delimiter = ',', default_value = "512,2048,5000")]
    pub prefill: Vec<usize>,

    /// Short prompts prefilled one at a time and together, as `N`x`T` (N prompts of T
    /// tokens each, as an answer's passages are): `ppTxN-alone` against `ppTxN`, the
    /// prompts' rows multiplied as one matrix where the model's prefill is row-exact
    /// (prompts of 16 to 512 tokens; longer ones prefill alone either way); checks both
    /// give each prompt the same token. 0: none
    #[arg(long, value_name = "NxT", default_value = "24x96", value_parser = parse_stacked)]
    pub stacked: Stacked,

    /// Tokens to decode
    #[arg(long, default_value_t = 256)]
    pub decode: usize,

    /// Prefill's matrix products alone (`mmN`), by rows: every projection of every layer
    /// on N rows, without attention and element-wise work; reports their GFLOP/s and the
    /// tok/s they would allow prefill (which runs in blocks of 512 rows). `--projections`
    /// with no value: none
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "512")]
    pub projections: Vec<usize>,

    /// Memory rewrites to decode, by previous-memory size in tokens: the loop's update
    /// prompt, up to 256 new tokens, with one token per pass and with speculative
    /// drafting (--draft-tokens); reports decode tok/s of each, their ratio, acceptance
    /// and tokens per pass, and checks that both give the same tokens. `--rewrite` with
    /// no value: none
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "128,256")]
    pub rewrite: Vec<usize>,

    /// Most tokens drafted per pass in the rewrite and batch cases
    #[arg(long, value_name = "N", default_value_t = memagent_engine::DEFAULT_DRAFT_TOKENS)]
    pub draft_tokens: usize,

    /// Sequences decoded as one batch, in two cases: `tg{decode}x{N}`, N sequences of
    /// --decode tokens each (end-of-turn ignored), against one sequence's tg{decode}; and
    /// `bw{N}`, memory rewrites of N different streams (128-token memories, up to 256 new
    /// tokens, each stopping where it ends), decoded one after another and then as one
    /// batch. Reports decode tok/s of all sequences and the ratio, and checks that the
    /// tokens agree. 0 or 1: none. On a GPU, where batched rows are not exact and
    /// sequences decode one at a time, tg{decode}x{N} is skipped
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub batch: usize,

    /// Repetitions of each case (the median is reported)
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,

    /// Print results as JSON
    #[arg(long)]
    pub json: bool,
}

/// A share: a number from 0 to 1.
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} is not between 0 and 1")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

/// `bench engine --stacked`: N prompts of T tokens, or none.
#[derive(Debug, Clone, Copy)]
pub struct Stacked(pub Option<(usize, usize)>);

/// `--stacked`: `NxT` (N prompts of T tokens), or `0` for none.
fn parse_stacked(text: &str) -> Result<Stacked, String> {
    if text == "0" {
        return Ok(Stacked(None));
    }
    let parsed = text
        .split_once('x')
        .and_then(|(n, t)| Some((n.parse::<usize>().ok()?, t.parse::<usize>().ok()?)));
    match parsed {
        Some((n, t)) if n > 0 && t > 0 => Ok(Stacked(Some((n, t)))),
        _ => Err(format!(
            "`{text}` is not NxT (prompts x tokens, both above 0, e.g. 24x96) or 0"
        )),
    }
}

/// A `--rerank` depth: 0 (off) up to [`memagent_memory::RERANK_MAX`].
fn rerank_depth(value: &str) -> Result<usize, String> {
    let max = memagent_memory::RERANK_MAX;
    match value.parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("expected a number of passages from 0 to {max}")),
    }
}

//! The memagent engine: local inference on GGUF models with candle.
//!
//! It owns model loading (weights, the tokenizer from the file's own metadata, the chat
//! template), the architectures (one file each) and their kernels, sampling, batched and
//! speculative generation and its timings, and LoRA adapters with their manifests as
//! plain facts. It knows nothing of the memory agent's protocol and speaks no HTTP. It
//! never prints and never reads configuration or the environment: callers pass paths
//! and options (and [`prefer_integer_kernel`] for measurements), and get typed errors
//! back.
//!
//! ```no_run
//! use memagent_engine::{GenerateOptions, LoadOptions, LocalModel, Message};
//!
//! let model = LocalModel::load("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), &LoadOptions::default())?;
//! let reply = model.generate_chat(&[Message::user("What is the capital of France?")], &GenerateOptions::default())?;
//! println!("{}", reply.text);
//! # Ok::<(), memagent_engine::Error>(())
//! ```

mod adapter;
pub mod bench;
mod chat;
mod device;
mod error;
mod gguf;
mod kernels;
mod model;
mod models;
pub mod prefix;
mod sampling;
#[doc(hidden)]
pub mod testing;
mod tokenizer;
pub mod tuning;
pub mod words;

pub use adapter::{
    default_adapter_path, default_reader_path, export_merged, resolve as resolve_adapter, Adapter,
    AdapterChoice, AdapterManifest, ExportReport, Weights,
};
pub use candle_core::quantized::GgmlDType;
pub use chat::{builtin_template, ChatTemplate, Message};
pub use device::open_device;
pub use error::{Error, Result};
pub use gguf::{sha256_file, GgufFile};
pub use kernels::prefetch;
pub use kernels::{
    for_chunks, gemm_n, gemm_t, integer_prefill_kernel, integer_prefill_types,
    integer_products_fast, matmul_t, prefer_integer_kernel, IntegerWeight,
};
pub use model::{
    repeated_tail, DecodeStats, GenerateOptions, Generation, LoadOptions, LocalModel, ModelInfo,
    PrefillWeights, StopReason, WeightPlan, DEFAULT_DRAFT_TOKENS,
};
pub use models::{rope_tables, Architecture, Config, KvCache, Transformer};
pub use sampling::{argmax, log_probability, SamplingParams};
pub use tokenizer::Tokenizer;

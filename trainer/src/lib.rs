//! Training of the memory agent: LoRA adapters over a GGUF model's weights dequantized to
//! f32, on candle's autograd, from trajectories whose ideal memories are known
//! (`memagent-tasks`), or from the model's own sampled trajectories that earned their
//! reward ([`rejection`]). It owns the differentiable forward pass, the loss, the
//! optimizer, checkpoints and the adapter files the engine loads; it never prints (the
//! caller gets events) and never installs signal handlers (the caller passes a stop flag).
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use memagent_trainer::{Examples, LoraConfig, Run, TrainConfig, TrainModel};
//!
//! // `data`: a `TaskData` (generated trajectories), or any other source of examples.
//! fn train(data: &dyn Examples) -> memagent_trainer::Result<()> {
//!     let model = TrainModel::load("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), LoraConfig::default(), 7)?;
//!     let mut run = Run::open("runs/first".as_ref(), TrainConfig::default(), model, false)?;
//!     run.train(data, &AtomicBool::new(false), &mut |_| {})
//! }
//! ```

mod attention;
mod data;
mod error;
mod lora;
mod loss;
mod model;
pub mod ops;
mod optim;
mod plot;
pub mod rejection;
mod run;

pub use attention::{causal_attention, reference_attention};
pub use data::TaskData;
pub use error::{Error, Result};
pub use lora::{Adapters, Lora, LoraConfig, Target, ALL_TARGETS};
pub use loss::{correct_tokens, weighted_nll, weighted_nll_composed};
pub use model::TrainModel;
pub use optim::{clip_grad_norm, learning_rate, AdamW, AdamWConfig};
pub use plot::loss_curve;
pub use rejection::{Group, SampleConfig, SampledExamples};
pub use run::{read_log, EvalScores, Event, Examples, LogLine, Run, Sequence, TrainConfig};

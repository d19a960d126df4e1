//! The training run: examples in a fixed order from the data seed, gradient
//! accumulation over a batch with token-level loss averaging, clipping, AdamW under a
//! warm-up + cosine schedule, checkpoints that resume bit-exactly, a JSON Lines log with
//! validation scores, and the shipped adapter with a manifest of how it was made.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};
use memagent_tasks::training::Split;
use serde::{Deserialize, Serialize};

use crate::error::{io, Error, Result};
use crate::lora::LoraConfig;
use crate::loss::{correct_tokens, weighted_nll, weighted_nll_composed};
use crate::model::TrainModel;
use crate::optim::{clip_grad_norm, learning_rate, AdamW, AdamWConfig};

/// A tokenized conversation: the loss is taken on `ids[target_start..]`, each token
/// weighted by `weights` (one per target token).
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub ids: Vec<u32>,
    pub target_start: usize,
    pub weights: Vec<f32>,
}

impl Sequence {
    pub fn target_tokens(&self) -> usize {
        self.ids.len() - self.target_start
    }
}

/// Where examples come from: example `index` of a split, always the same.
pub trait Examples {
    fn sequence(&self, split: Split, index: u64) -> Result<Sequence>;
}

/// Everything that determines a run (saved as `config.json`; a resumed run must match).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub lora: LoraConfig,
    pub optim: AdamWConfig,
    /// Optimizer updates.
    pub steps: u64,
    /// Examples per update.
    pub batch: usize,
    pub learning_rate: f64,
    pub warmup: u64,
    pub min_lr_ratio: f64,
    pub clip_norm: f64,
    pub checkpoint_every: u64,
    pub eval_every: u64,
    /// Validation examples scored at each evaluation (indices 0..n of the split).
    pub eval_examples: u64,
    /// Seed of the adapters' initial values.
    pub init_seed: u64,
    /// Free-form description of the data (seed, sizes), recorded with the adapter.
    pub data: serde_json::Value,
    /// Start from the adapter values of an earlier run (its checkpoint.safetensors or
    /// adapter.safetensors; same rank and targets) instead of fresh ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            lora: LoraConfig::default(),
            optim: AdamWConfig::default(),
            steps: 300,
            batch: 4,
            learning_rate: 1e-3,
            warmup: 20,
            min_lr_ratio: 0.1,
            clip_norm: 1.0,
            checkpoint_every: 10,
            eval_every: 50,
            eval_examples: 24,
            init_seed: 7,
            data: serde_json::Value::Null,
            init_from: None,
        }
    }
}

/// One line of `train.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogLine {
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens: usize,
    pub target_tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// Useful floating-point operations per second, in billions
    /// ([`TrainModel::useful_flops`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub gflop_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub eval: Option<EvalScores>,
}

/// Teacher-forced scores on validation examples.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct EvalScores {
    pub loss: f64,
    /// Target tokens the model ranks first.
    pub token_accuracy: f64,
    /// Examples whose every target token is ranked first.
    pub exact: f64,
    pub examples: u64,
}

/// What a run reports as it goes.
pub enum Event<'a> {
    Started {
        step: u64,
        total: u64,
        parameters: usize,
    },
    Step(&'a LogLine),
    Checkpoint {
        step: u64,
    },
}

/// A run in a directory: `config.json`, `checkpoint.safetensors`, `train.jsonl`.
pub struct Run {
    pub dir: PathBuf,
    pub config: TrainConfig,
    /// Stop (with a checkpoint) after this update, short of `config.steps`: a run
    /// trained in stages keeps its whole schedule.
    pub until: Option<u64>,
    pub model: TrainModel,
    vars: Vec<(String, Var)>,
    optimizer: AdamW,
}

const CHECKPOINT: &str = "checkpoint.safetensors";
const LOG: &str = "train.jsonl";

impl Run {
    /// Starts a run in `dir`, or resumes the one there when `resume` (the configuration
    /// must be the same). A fresh start refuses a directory that already holds a run.
    pub fn open(dir: &Path, config: TrainConfig, model: TrainModel, resume: bool) -> Result<Self> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let config_path = dir.join("config.json");
        let vars = model.adapters.vars();
        let var_list: Vec<Var> = vars.iter().map(|(_, v)| v.clone()).collect();
        let mut optimizer = AdamW::new(config.optim, &var_list)?;
        let checkpoint = dir.join(CHECKPOINT);
        if resume && checkpoint.is_file() {
            let saved: TrainConfig =
                serde_json::from_slice(&fs::read(&config_path).map_err(io(&config_path))?)
                    .map_err(|e| Error::Checkpoint {
                        path: config_path.clone(),
                        message: e.to_string(),
                    })?;
            if saved != config {
                return Err(Error::Config(format!(
                    "{} was made with another configuration; resume with the same options or start a new directory\nsaved: {}\ngiven: {}",
                    config_path.display(),
                    serde_json::to_string(&saved).unwrap_or_default(),
                    serde_json::to_string(&config).unwrap_or_default()
                )));
            }
            let tensors = candle_core::safetensors::load(&checkpoint, &Device::Cpu)?;
            let get = |name: &str| {
                tensors.get(name).cloned().ok_or_else(|| Error::Checkpoint {
                    path: checkpoint.clone(),
                    message: format!("tensor `{name}` is missing"),
                })
            };
            for (i, (name, var)) in vars.iter().enumerate() {
                var.set(&get(name)?)?;
                optimizer.m[i] = get(&format!("adam.m.{name}"))?;
                optimizer.v[i] = get(&format!("adam.v.{name}"))?;
            }
            optimizer.step = u64::from(get("adam.step")?.to_vec1::<u32>()?[0]);
            truncate_log(&dir.join(LOG), optimizer.step)?;
        } else {
            if !resume && (checkpoint.is_file() || dir.join(LOG).is_file()) {
                return Err(Error::Config(format!(
                    "{} already holds a training run; pass --resume to continue it, or choose another --out",
                    dir.display()
                )));
            }
            let _ = fs::remove_file(dir.join(LOG));
            if let Some(from) = &config.init_from {
                warm_start(from, &vars, config.lora.scale())?;
            }
            write_atomic(
                &config_path,
                &serde_json::to_vec_pretty(&config).expect("serializable"),
            )?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            until: None,
            model,
            vars,
            optimizer,
        })
    }

    /// Updates done so far.
    pub fn step(&self) -> u64 {
        self.optimizer.step
    }

    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// Saves parameters and optimizer state in one file, replaced atomically.
    pub fn checkpoint(&self) -> Result<()> {
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (i, (name, var)) in self.vars.iter().enumerate() {
            tensors.insert(name.clone(), var.as_tensor().clone());
            tensors.insert(format!("adam.m.{name}"), self.optimizer.m[i].clone());
            tensors.insert(format!("adam.v.{name}"), self.optimizer.v[i].clone());
        }
        let step = u32::try_from(self.optimizer.step).unwrap_or(u32::MAX);
        tensors.insert("adam.step".into(), Tensor::new(&[step], &Device::Cpu)?);
        let path = self.dir.join(CHECKPOINT);
        let tmp = self.dir.join(format!("{CHECKPOINT}.tmp"));
        candle_core::safetensors::save(&tensors, &tmp)?;
        fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))?;
        Ok(())
    }

    /// Trains until `config.steps` updates are done or `stop` is set (then checkpoints).
    pub fn train(
        &mut self,
        data: &dyn Examples,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<()> {
        on_event(Event::Started {
            step: self.step(),
            total: self.config.steps,
            parameters: self.model.adapters.parameter_count(),
        });
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG))
            .map_err(io(&self.dir.join(LOG)))?;
        let last = self.until.unwrap_or(u64::MAX).min(self.config.steps);
        while self.step() < last {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let mut line = self.update(data)?;
            let step = self.step();
            if self.config.eval_every > 0
                && (step.is_multiple_of(self.config.eval_every) || step == self.config.steps)
            {
                line.eval = Some(self.evaluate(data)?);
            }
            writeln!(
                log,
                "{}",
                serde_json::to_string(&line).expect("serializable")
            )
            .map_err(io(&self.dir.join(LOG)))?;
            on_event(Event::Step(&line));
            if step.is_multiple_of(self.config.checkpoint_every.max(1)) || step == self.config.steps
            {
                self.checkpoint()?;
                on_event(Event::Checkpoint { step });
            }
        }
        if !self
            .step()
            .is_multiple_of(self.config.checkpoint_every.max(1))
        {
            self.checkpoint()?;
            on_event(Event::Checkpoint { step: self.step() });
        }
        Ok(())
    }

    /// Loss and gradients of one example, scaled by `normalizer`.
    pub fn loss(&self, seq: &Sequence, normalizer: f64) -> Result<Tensor> {
        let positions: Vec<usize> = (seq.target_start - 1..seq.ids.len() - 1).collect();
        let logits = self.model.forward(&seq.ids, &positions)?;
        let targets = &seq.ids[seq.target_start..];
        if self.model.reference {
            weighted_nll_composed(&logits, targets, &seq.weights, normalizer)
        } else {
            weighted_nll(&logits, targets, &seq.weights, normalizer)
        }
    }

    /// One optimizer update over the batch of examples `step·batch ..`.
    pub fn update(&mut self, data: &dyn Examples) -> Result<LogLine> {
        let start = Instant::now();
        let step = self.step();
        let batch = self.config.batch.max(1) as u64;
        let seqs = (0..batch)
            .map(|j| data.sequence(Split::Train, step * batch + j))
            .collect::<Result<Vec<_>>>()?;
        for s in &seqs {
            if s.target_start == 0 || s.target_start >= s.ids.len() {
                return Err(Error::Config(
                    "an example has no prompt or no target tokens".into(),
                ));
            }
            if s.weights.len() != s.target_tokens() {
                return Err(Error::Config(format!(
                    "an example has {} target tokens but {} weights",
                    s.target_tokens(),
                    s.weights.len()
                )));
            }
        }
        let target_tokens: usize = seqs.iter().map(Sequence::target_tokens).sum();
        // The loss is a weighted mean over the batch's target tokens.
        let weight_sum: f64 = seqs
            .iter()
            .flat_map(|s| &s.weights)
            .map(|&w| f64::from(w))
            .sum();
        let mut sums: Vec<Option<Tensor>> = vec![None; self.vars.len()];
        let mut loss_sum = 0f64;
        for seq in &seqs {
            let loss = self.loss(seq, weight_sum.max(1e-9))?;
            loss_sum += f64::from(loss.to_scalar::<f32>()?);
            let grads = loss.backward()?;
            for (i, (_, var)) in self.vars.iter().enumerate() {
                if let Some(g) = grads.get(var) {
                    sums[i] = Some(match sums[i].take() {
                        Some(s) => (s + g)?,
                        None => g.clone(),
                    });
                }
            }
        }
        let mut grads = sums
            .into_iter()
            .zip(&self.vars)
            .map(|(g, (_, v))| g.map_or_else(|| v.zeros_like(), Ok))
            .collect::<Result<Vec<_>, _>>()?;
        let grad_norm = clip_grad_norm(&mut grads, self.config.clip_norm)?;
        let lr = learning_rate(
            step,
            self.config.learning_rate,
            self.config.warmup,
            self.config.steps,
            self.config.min_lr_ratio,
        );
        let vars: Vec<Var> = self.vars.iter().map(|(_, v)| v.clone()).collect();
        self.optimizer.update(&vars, &grads, lr)?;
        let tokens: usize = seqs.iter().map(|s| s.ids.len()).sum();
        let flops: f64 = seqs
            .iter()
            .map(|s| self.model.useful_flops(s.ids.len(), s.target_tokens()))
            .sum();
        let seconds = start.elapsed().as_secs_f64();
        Ok(LogLine {
            step: self.step(),
            loss: loss_sum,
            lr,
            grad_norm,
            tokens,
            target_tokens,
            seconds,
            tokens_per_second: tokens as f64 / seconds.max(1e-9),
            gflop_per_second: Some(flops / seconds.max(1e-9) / 1e9),
            eval: None,
        })
    }

    /// Teacher-forced loss, token accuracy and exact targets on validation examples.
    pub fn evaluate(&self, data: &dyn Examples) -> Result<EvalScores> {
        let (mut nll, mut tokens, mut correct, mut exact) = (0f64, 0usize, 0usize, 0u64);
        for i in 0..self.config.eval_examples {
            let seq = data.sequence(Split::Validation, i)?;
            let positions: Vec<usize> = (seq.target_start - 1..seq.ids.len() - 1).collect();
            let logits = self.model.forward(&seq.ids, &positions)?.detach();
            let targets = &seq.ids[seq.target_start..];
            let n = targets.len();
            nll +=
                f64::from(weighted_nll(&logits, targets, &vec![1.0; n], 1.0)?.to_scalar::<f32>()?);
            let c = correct_tokens(&logits, targets)?;
            correct += c;
            tokens += n;
            exact += u64::from(c == n);
        }
        let n = self.config.eval_examples.max(1);
        Ok(EvalScores {
            loss: nll / tokens.max(1) as f64,
            token_accuracy: correct as f64 / tokens.max(1) as f64,
            exact: exact as f64 / n as f64,
            examples: self.config.eval_examples,
        })
    }

    /// The adapters in shipping form (f16, scale folded into B).
    pub fn export_adapter(&self, path: &Path) -> Result<()> {
        let tensors: HashMap<String, Tensor> = self
            .model
            .adapters
            .export(DType::F16)?
            .into_iter()
            .collect();
        candle_core::safetensors::save(&tensors, path)?;
        Ok(())
    }
}

/// Sets `vars` from an earlier run's checkpoint (raw values) or shipped adapter (B holds
/// the scale, which is divided out again).
fn warm_start(from: &Path, vars: &[(String, Var)], scale: f64) -> Result<()> {
    let tensors = candle_core::safetensors::load(from, &Device::Cpu)?;
    let shipped = !tensors.contains_key("adam.step");
    for (name, var) in vars {
        let t = tensors.get(name).ok_or_else(|| Error::Checkpoint {
            path: from.to_path_buf(),
            message: format!(
                "tensor `{name}` is missing: start from a run with the same rank and targets"
            ),
        })?;
        if t.dims() != var.dims() {
            return Err(Error::Checkpoint {
                path: from.to_path_buf(),
                message: format!(
                    "tensor `{name}` is {:?} where this run needs {:?}: start from a run with the same rank",
                    t.dims(),
                    var.dims()
                ),
            });
        }
        let t = t.to_dtype(DType::F32)?;
        let t = if shipped && name.ends_with(".lora_b") {
            (t / scale)?
        } else {
            t
        };
        var.set(&t)?;
    }
    Ok(())
}

/// Drops log lines past `step` (written after the checkpoint a resumed run starts from).
fn truncate_log(path: &Path, step: u64) -> Result<()> {
    let Ok(text) = fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| serde_json::from_str::<LogLine>(l).is_ok_and(|x| x.step <= step))
        .collect();
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    write_atomic(path, out.as_bytes())
}

pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes).map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// Reads `train.jsonl`.
pub fn read_log(path: &Path) -> Result<Vec<LogLine>> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

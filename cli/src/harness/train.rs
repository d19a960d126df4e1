//! `memctl train`: LoRA training of the memory agent, and `memctl train data`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Result};
use memagent_engine::{sha256_file, PrefillWeights};
use memagent_tasks::training::{trajectory, DataConfig, Split};
use memagent_trainer::{
    loss_curve, read_log, AdamWConfig, Event, LoraConfig, Run, SampledExamples, Target, TaskData,
    TrainConfig, TrainModel,
};

use crate::cli::{TrainArgs, TrainDataArgs, TrainDataOptions};
use crate::settings::Settings;

fn data_config(o: &TrainDataOptions) -> DataConfig {
    DataConfig {
        seed: o.data_seed,
        chunk_min: o.chunk_min,
        chunk_max: o.chunk_max,
        memory_tokens: o.memory_tokens,
        general_share: o.general_share,
        evidence_share: o.evidence_share,
        dialogue_share: o.dialogue_share,
        dialogue_unknown_share: o.dialogue_unknown_share,
        writer: o.writer,
    }
}

pub(super) fn task_data(model: &Path, o: &TrainDataOptions) -> Result<TaskData> {
    let essays = super::bench::haystack(o.haystack.as_deref())?;
    let essays = (essays.source() != memagent_tasks::Haystack::noise().source()).then_some(essays);
    Ok(TaskData::from_gguf(
        model,
        data_config(o),
        essays,
        o.new_fact_weight,
    )?)
}

fn split_of(name: &str) -> Result<Split> {
    Ok(match name {
        "train" => Split::Train,
        "validation" | "val" => Split::Validation,
        other => bail!("unknown split `{other}`; use train or validation"),
    })
}

pub fn print_data(global: &Settings, args: &TrainDataArgs) -> Result<()> {
    let model = global.model_path()?;
    let data = task_data(&model, &args.data)?;
    let split = split_of(&args.split)?;
    let fillers = match split {
        Split::Train => &data.train,
        Split::Validation => &data.validation,
    };
    let mut out = std::io::stdout().lock();
    for i in args.start..args.start + args.count {
        if args.steps {
            let t = trajectory(&data.tokenizer, fillers, &data.config, split, i)?;
            let mut before: Vec<Vec<String>> = Vec::new();
            let updates = t.examples(data.config.writer);
            for (n, (s, e)) in t.steps.iter().zip(&updates).enumerate() {
                let row = serde_json::json!({
                    "index": i, "step": n, "split": split, "family": t.family, "mode": t.mode,
                    "template": e.template, "message": e.message,
                    "prompt_ids": data.prompt_ids(&e.message)?,
                    "target": e.target, "values": s.values, "earlier_values": before,
                });
                writeln!(out, "{}", serde_json::to_string(&row)?)?;
                before.extend(s.values.iter().cloned());
            }
            continue;
        }
        let line = if args.trajectories {
            serde_json::to_string(&trajectory(
                &data.tokenizer,
                fillers,
                &data.config,
                split,
                i,
            )?)?
        } else {
            let e = data.example(split, i)?;
            let seq = data.tokenize(&e.message, &e.target, e.memory_before.as_deref())?;
            let weight: f32 = seq.weights.iter().sum();
            let mut row = serde_json::json!({
                "index": i, "split": split, "family": e.family, "mode": e.mode, "kind": e.kind,
                "template": e.template, "tokens": seq.ids.len(), "target_tokens": seq.target_tokens(),
                "target_weight": weight,
                "message": e.message, "target": e.target,
            });
            if !e.values.is_empty() || !e.stale.is_empty() {
                row["values"] = serde_json::json!(e.values);
                row["stale"] = serde_json::json!(e.stale);
            }
            serde_json::to_string(&row)?
        };
        writeln!(out, "{line}")?;
    }
    Ok(())
}

pub fn train(global: &Settings, args: &TrainArgs) -> Result<()> {
    let a = &args.run;
    let model_path = global.model_path()?;
    let mut data = task_data(&model_path, &a.data)?;
    if let Some(share) = a.generated_general_share {
        if a.examples.is_empty() {
            bail!("--generated-general-share mixes generated examples with --examples; give a samples file or use --general-share");
        }
        data.config.general_share = share;
    }
    let config = train_config(a, &data)?;
    keep_freed_memory();
    if let Some(updates) = a.bench {
        return bench(global, &model_path, config, &data, updates, a.json);
    }
    eprintln!("hashing {} ...", model_path.display());
    let base_sha256 = sha256_file(&model_path)?;
    let model = load_train_model(&model_path, &config)?;
    if !global.quiet {
        eprintln!("frozen products: {}", products_line(&model)?);
    }
    let mut run = Run::open(&a.out, config, model, a.resume)?;
    run.until = a.until;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    let show = !a.json && !global.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = crate::commands::progress_bar(
        show,
        "{bar:30} {pos}/{len} updates  {msg}  [{elapsed_precise} < {eta_precise}]",
    );
    let json = a.json;
    let mut on_event = |event: Event<'_>| match event {
        Event::Started {
            step,
            total,
            parameters,
        } => {
            if let Some(bar) = &bar {
                bar.set_length(total);
                bar.set_position(step);
            }
            tracing::info!(
                "training {parameters} adapter parameters from update {step} of {total}"
            );
            if !json && bar.is_none() && !global.quiet {
                eprintln!("training {parameters} adapter parameters from update {step} of {total}");
            }
        }
        Event::Step(line) => {
            let eval = line.eval.map_or(String::new(), |e| {
                format!(
                    "  val loss {:.3} acc {:.3} exact {:.2}",
                    e.loss, e.token_accuracy, e.exact
                )
            });
            let msg = format!(
                "loss {:.4}  {:.0} tok/s{eval}",
                line.loss, line.tokens_per_second
            );
            if json {
                println!("{}", serde_json::to_string(line).unwrap_or_default());
            } else if let Some(bar) = &bar {
                bar.set_position(line.step);
                bar.set_message(msg);
            } else if !global.quiet {
                eprintln!("update {}  lr {:.2e}  {msg}", line.step, line.lr);
            }
        }
        Event::Checkpoint { step } => tracing::info!("checkpoint at update {step}"),
    };
    if a.examples.is_empty() {
        run.train(&data, &stop, &mut on_event)?;
    } else {
        let files: Vec<&Path> = a.examples.iter().map(PathBuf::as_path).collect();
        let sampled = SampledExamples::open(data, &files, a.examples_share, a.data.general_share)?;
        if !global.quiet {
            eprintln!(
                "training on {} kept conversations ({} general, {} question mode; drawn \
                 at --general-share {}) from {} samples file(s), share {}",
                sampled.len(),
                sampled.general.len(),
                sampled.question.len(),
                a.data.general_share,
                files.len(),
                a.examples_share
            );
        }
        run.train(&sampled, &stop, &mut on_event)?;
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let log = read_log(&a.out.join("train.jsonl"))?;
    if !log.is_empty() {
        loss_curve(&log, &a.out.join("loss.svg"))?;
    }
    let finished = run.step() >= run.config.steps;
    if !finished {
        eprintln!(
            "stopped at update {} of {}; checkpoint saved, continue with --resume",
            run.step(),
            run.config.steps
        );
        if run.step() == 0 {
            return Ok(());
        }
    }
    // A stopped run's adapter is written too: what was learned so far is usable.
    write_adapter(&run, &a.out, &model_path, &base_sha256, &log, finished)
}

/// The run's configuration from the command line, with the data it trains on recorded.
fn train_config(a: &crate::cli::TrainRunArgs, data: &TaskData) -> Result<TrainConfig> {
    let targets = a
        .targets
        .iter()
        .map(|t| t.parse::<Target>())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TrainConfig {
        lora: LoraConfig {
            rank: a.rank,
            alpha: a.alpha,
            targets,
            top_layers: a.top_layers,
        },
        optim: AdamWConfig {
            weight_decay: a.weight_decay,
            ..AdamWConfig::default()
        },
        steps: a.steps,
        batch: a.batch,
        learning_rate: a.lr,
        warmup: a.warmup,
        min_lr_ratio: 0.1,
        clip_norm: a.clip,
        checkpoint_every: a.checkpoint_every,
        eval_every: a.eval_every,
        eval_examples: a.eval_examples,
        init_seed: a.init_seed,
        init_from: a.init_from.clone(),
        data: {
            let mut d = serde_json::to_value(data.config)?;
            d["new_fact_weight"] = data.new_fact_weight.into();
            if !a.examples.is_empty() {
                d["examples"] = serde_json::json!(a.examples);
                d["examples_share"] = a.examples_share.into();
                d["examples_general_share"] = a.data.general_share.into();
            }
            d
        },
    })
}

/// Writes the run's adapter and its manifest (how it was made: base model, data,
/// command, configuration, metrics) into `out`.
fn write_adapter(
    run: &Run,
    out: &Path,
    model_path: &Path,
    base_sha256: &str,
    log: &[memagent_trainer::LogLine],
    finished: bool,
) -> Result<()> {
    let adapter = out.join("adapter.safetensors");
    run.export_adapter(&adapter)?;
    let seconds: f64 = log.iter().map(|l| l.seconds).sum();
    let tokens: usize = log.iter().map(|l| l.tokens).sum();
    let last_eval = log.iter().rev().find_map(|l| l.eval);
    let manifest = serde_json::json!({
        "format": "memagent-lora-v1",
        "base_model": model_path.file_name().map(|f| f.to_string_lossy().into_owned()),
        "base_sha256": base_sha256,
        "rank": run.config.lora.rank,
        "alpha": run.config.lora.alpha,
        "targets": run.config.lora.targets,
        "scale_folded_into_b": true,
        "data": run.config.data,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "config": run.config,
        "metrics": {
            "updates": run.step(),
            "finished": finished,
            "training_seconds": seconds,
            "tokens": tokens,
            "tokens_per_second": tokens as f64 / seconds.max(1e-9),
            "final_train_loss": log.last().map(|l| l.loss),
            "validation": last_eval,
        },
    });
    std::fs::write(
        out.join("adapter.json"),
        serde_json::to_vec_pretty(&manifest)?,
    )?;
    println!(
        "adapter: {} ({} of {} updates, {:.0} s, {:.0} tokens/s)",
        adapter.display(),
        run.step(),
        run.config.steps,
        seconds,
        tokens as f64 / seconds.max(1e-9)
    );
    Ok(())
}

/// Keeps freed memory in the process for the next update. Every update allocates and
/// frees the same activations, hundreds of megabytes; glibc hands blocks over 32 MB back
/// to the kernel, which then zeroes fresh pages for the next update: a fifth of the
/// training time went to that.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator thresholds; called before the training threads
    // allocate.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// The model to train: its frozen products in 8-bit integers where prefill's are
/// (`MEMAGENT_PREFILL_WEIGHTS`, and a CPU with AVX-512 VNNI or AVX2), in f32 otherwise.
fn load_train_model(path: &Path, config: &TrainConfig) -> Result<TrainModel> {
    let integer = matches!(crate::commands::prefill_weights()?, PrefillWeights::Integer)
        && memagent_engine::integer_products_fast();
    Ok(TrainModel::load_with(
        path,
        config.lora.clone(),
        config.init_seed,
        integer,
    )?)
}

/// How the model's frozen products run, and why, for the log.
fn products_line(model: &TrainModel) -> Result<&'static str> {
    Ok(
        if !matches!(crate::commands::prefill_weights()?, PrefillWeights::Integer) {
            "f32 (MEMAGENT_PREFILL_WEIGHTS asks for f32 prefill)"
        } else if !memagent_engine::integer_products_fast() {
            "f32 (this CPU has neither AVX-512 VNNI nor AVX2 for 8-bit integer products)"
        } else if model.integer_products() {
            "8-bit integers, as prefill's"
        } else {
            "8-bit integers where the weight's type has them, f32 for the others"
        },
    )
}

/// `memctl train --bench`: updates in a temporary run, then the engine's prefill
/// projections on the same file, both in this process.
fn bench(
    global: &Settings,
    model_path: &Path,
    mut config: TrainConfig,
    data: &TaskData,
    updates: u64,
    json: bool,
) -> Result<()> {
    if updates < 2 {
        bail!("--bench needs at least 2 updates (the first one is a warm-up)");
    }
    config.steps = updates;
    config.checkpoint_every = updates;
    config.eval_every = 0;
    let dir = std::env::temp_dir().join(format!("memctl-train-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let model = load_train_model(model_path, &config)?;
    let integer = model.integer_products();
    let mut run = Run::open(&dir, config, model, false)?;
    let mut lines = Vec::new();
    let stop = AtomicBool::new(false);
    let result = run.train(data, &stop, &mut |event| {
        if let Event::Step(line) = event {
            if !json && !global.quiet {
                eprintln!(
                    "update {}: {} tokens in {:.1} s, {:.0} tokens/s, {:.1} GFLOP/s",
                    line.step,
                    line.tokens,
                    line.seconds,
                    line.tokens_per_second,
                    line.gflop_per_second.unwrap_or(0.0)
                );
            }
            lines.push(line.clone());
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    drop(run);
    // The first update pays for first touches of memory: left out.
    let measured = &lines[1..];
    let seconds: f64 = measured.iter().map(|l| l.seconds).sum();
    let tokens: usize = measured.iter().map(|l| l.tokens).sum();
    let gflop: f64 = measured
        .iter()
        .map(|l| l.gflop_per_second.unwrap_or(0.0) * l.seconds)
        .sum();
    let train_rate = gflop / seconds.max(1e-9);
    let engine = crate::commands::load_model(global)?;
    let projections = memagent_engine::bench::bench_projections(&engine, 512, 3)?;
    let prefill_rate = projections.gflop_per_second.unwrap_or(0.0);
    let ratio = train_rate / prefill_rate.max(1e-9);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "updates": measured.len(),
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_second": tokens as f64 / seconds.max(1e-9),
                "useful_gflop_per_second": train_rate,
                "prefill_projections_gflop_per_second": prefill_rate,
                "ratio": ratio,
                "products": if integer { "integer" } else { "f32" },
                "cpu": memagent_engine::bench::cpu_name(),
            })
        );
    } else {
        println!(
            "training ({} frozen products): {tokens} tokens in {seconds:.1} s over {} updates: {:.0} tokens/s, {train_rate:.1} useful GFLOP/s",
            if integer { "8-bit integer" } else { "f32" },
            measured.len(),
            tokens as f64 / seconds.max(1e-9)
        );
        println!(
            "prefill projections (mm512), same model and run: {prefill_rate:.1} GFLOP/s; training runs at {:.0}% of it",
            ratio * 100.0
        );
    }
    Ok(())
}

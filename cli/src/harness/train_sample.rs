//! `memctl train sample`: rejection sampling of the model's own readings of training
//! documents, the kept ones appended to a samples file for `memctl train --examples`.

use std::collections::HashSet;
use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use memagent_agent::{Profile, Writer};
use memagent_tasks::training::{trajectory, Mode, Split};
use memagent_trainer::rejection::{read_groups, sample_once, Group, SampleConfig, Sampled};

use crate::cli::TrainSampleArgs;
use crate::settings::Settings;

pub fn run(global: &Settings, args: &TrainSampleArgs) -> Result<()> {
    if args.samples == 0 || args.batch == 0 {
        bail!("--samples and --batch must be at least 1");
    }
    let config = SampleConfig {
        samples: args.samples,
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        writer: args.data.writer,
        min_reward: args.min_reward,
        correct: args.correct,
    };
    if config.correct && config.writer != Writer::Lines {
        bail!("--correct corrects line-writer readings: use it with --writer lines");
    }
    if config.temperature <= 0.0 {
        bail!("--temperature must be above 0: greedy readings of one document are all the same");
    }
    let done: HashSet<u64> = if args.out.exists() {
        read_groups(&args.out)?.iter().map(|g| g.index).collect()
    } else {
        HashSet::new()
    };
    let todo: Vec<u64> = (args.start..args.start + args.count)
        .filter(|i| !done.contains(i))
        .collect();
    if !global.quiet && !done.is_empty() {
        eprintln!(
            "{} of these documents are already in {}; sampling the other {}",
            args.count as usize - todo.len(),
            args.out.display(),
            todo.len()
        );
    }
    let model_path = global.model_path()?;
    let data = super::train::task_data(&model_path, &args.data)?;
    let model = crate::commands::load_model(global)?;
    let profile = Profile {
        chunk_tokens: args.data.chunk_max,
        memory_tokens: args.data.memory_tokens,
        answer_tokens: Profile::SMALL.answer_tokens,
    };
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .with_context(|| format!("opening {}", args.out.display()))?;
    let start = Instant::now();
    let mut groups = Vec::new();
    for batch in todo.chunks(args.batch) {
        let trajectories = batch
            .iter()
            .map(|&i| trajectory(&data.tokenizer, &data.train, &data.config, Split::Train, i))
            .collect::<Result<Vec<_>, _>>()?;
        let mut samples: Vec<Vec<Sampled>> = vec![Vec::new(); batch.len()];
        for k in 0..config.samples {
            let read = sample_once(
                &model,
                model.tokenizer(),
                profile,
                &trajectories,
                k,
                &config,
            )?;
            for (group, s) in samples.iter_mut().zip(read) {
                group.push(s);
            }
        }
        for ((&i, t), samples) in batch.iter().zip(&trajectories).zip(samples) {
            let group = Group::of(i, t, samples, config.min_reward, config.correct);
            writeln!(out, "{}", serde_json::to_string(&group)?)?;
            if !global.quiet {
                let rewards: Vec<String> = group
                    .samples
                    .iter()
                    .map(|s| format!("{:.2}", s.reward.score))
                    .collect();
                eprintln!(
                    "document {i} ({:?} {}): rewards [{}], {} ({:.0} s so far)",
                    group.mode,
                    group.family,
                    rewards.join(" "),
                    match (group.selected, group.corrected) {
                        (None, _) => "none kept".to_string(),
                        (Some(s), false) => format!("kept sample {s}"),
                        (Some(s), true) => format!("kept sample {s}, corrected"),
                    },
                    start.elapsed().as_secs_f64()
                );
            }
            groups.push(group);
        }
        out.flush()?;
    }
    summary(&groups, start.elapsed().as_secs_f64(), args)
}

fn summary(groups: &[Group], seconds: f64, args: &TrainSampleArgs) -> Result<()> {
    let by_mode = |mode: Mode| {
        let g: Vec<&Group> = groups.iter().filter(|g| g.mode == mode).collect();
        let rewards: Vec<f64> = g
            .iter()
            .flat_map(|g| g.samples.iter().map(|s| s.reward.score))
            .collect();
        let kept = g.iter().filter(|g| g.selected.is_some()).count();
        serde_json::json!({
            "documents": g.len(),
            "mean_reward": rewards.iter().sum::<f64>() / rewards.len().max(1) as f64,
            "kept": kept,
            "conversations": g.iter().map(|g| g.conversations.len()).sum::<usize>(),
        })
    };
    let s = serde_json::json!({
        "out": args.out,
        "documents": groups.len(),
        "samples": args.samples,
        "seconds": seconds,
        "question": by_mode(Mode::Question),
        "general": by_mode(Mode::General),
    });
    if args.json {
        println!("{s}");
        return Ok(());
    }
    for mode in ["question", "general"] {
        let m = &s[mode];
        if m["documents"].as_u64() == Some(0) {
            continue;
        }
        println!(
            "{mode}: {} documents, mean reward {:.2} over {} samples each, {} kept ({} conversations)",
            m["documents"],
            m["mean_reward"].as_f64().unwrap_or(0.0),
            args.samples,
            m["kept"],
            m["conversations"]
        );
    }
    println!(
        "{} documents sampled in {seconds:.0} s; appended to {}",
        groups.len(),
        args.out.display()
    );
    Ok(())
}

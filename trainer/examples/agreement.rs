//! Does the engine, with an adapter merged, predict what the trainer's model predicts?
//! Compares the next-token logits of the trainer (adapters live) and the engine (merged at
//! load, as inference runs) at every target position of one training example.
//!
//! `cargo run --release -p memagent-trainer --example agreement -- MODEL.gguf ADAPTER PROMPT TARGET`
//! (PROMPT and TARGET: files with one example's message and reply, e.g. from `memctl train data`).
//! Prints the first positions and how many argmaxes agree.
use std::path::Path;

use memagent_engine::{AdapterChoice, LoadOptions, LocalModel};
use memagent_tasks::training::DataConfig;
use memagent_trainer::{LoraConfig, Run, TaskData, TrainConfig, TrainModel};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, adapter, prompt, target] = &args[..] else {
        return Err(
            "usage: agreement MODEL.gguf ADAPTER.safetensors PROMPT_FILE TARGET_FILE".into(),
        );
    };
    let data = TaskData::from_gguf(Path::new(model), DataConfig::default(), None, 1.0)?;
    let tok = &data.tokenizer;
    let message = std::fs::read_to_string(prompt)?;
    let reply = std::fs::read_to_string(target)?;
    let seq = data.tokenize(&message, &reply, None)?;
    let (ids, start) = (seq.ids, seq.target_start);

    let config = TrainConfig {
        init_from: Some(adapter.into()),
        steps: 0,
        ..TrainConfig::default()
    };
    let dir = std::env::temp_dir().join(format!("agreement-{}", std::process::id()));
    let run = Run::open(
        &dir,
        config,
        TrainModel::load(model.as_ref(), LoraConfig::default(), 7)?,
        false,
    )?;
    let positions: Vec<usize> = (start - 1..ids.len() - 1).collect();
    let trainer: Vec<Vec<f32>> = run.model.forward(&ids, &positions)?.to_vec2()?;
    let _ = std::fs::remove_dir_all(&dir);

    let options = LoadOptions {
        adapter: AdapterChoice::File(adapter.into()),
        ..LoadOptions::default()
    };
    let m = LocalModel::load(model.as_ref(), &options)?;
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0
    };
    let mut agree = 0;
    for (k, &p) in positions.iter().enumerate() {
        let mut cache = m.transformer().new_cache(1, p + 1);
        let logits: Vec<f32> = m
            .transformer()
            .forward(&[ids[..=p].to_vec()], &mut cache)?
            .flatten_all()?
            .to_vec1()?;
        let (a, b) = (argmax(&trainer[k]), argmax(&logits));
        let diff = trainer[k]
            .iter()
            .zip(&logits)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        agree += usize::from(a == b);
        println!(
            "pos {p}: target {:?} trainer {:?} engine {:?} max|diff| {diff:.3}",
            tok.decode(&[ids[p + 1]])?,
            tok.decode(&[a as u32])?,
            tok.decode(&[b as u32])?
        );
        if k >= 12 {
            break;
        }
    }
    println!("argmax agree {agree}");
    Ok(())
}

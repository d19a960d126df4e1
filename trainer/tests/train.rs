//! The trainer on a tiny random-weight model (the engine's test loader): the loss falls
//! on a fixed batch, LoRA gradients match finite differences, and a run killed with
//! SIGKILL in a real child process resumes to the same parameters as a run that was
//! never stopped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use memagent_tasks::training::Split;
use memagent_trainer::{Examples, LoraConfig, Result, Run, Sequence, TrainConfig, TrainModel};

/// The same few sequences whatever the index: a fixed batch.
struct Fixed;

impl Examples for Fixed {
    fn sequence(&self, split: Split, index: u64) -> Result<Sequence> {
        let k = (index % 2) as u32 + if split == Split::Validation { 7 } else { 0 };
        let ids: Vec<u32> = (0..40).map(|i| (i * 7 + k * 13) % 250).collect();
        Ok(Sequence {
            ids,
            target_start: 24,
        })
    }
}

fn tiny(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    memagent_engine::testing::write_tiny_model(dir, "llama")
}

fn config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch: 2,
        learning_rate: 1e-2,
        warmup: 2,
        checkpoint_every: 1,
        eval_every: 0,
        eval_examples: 2,
        ..TrainConfig::default()
    }
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memagent-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn params(run: &Run) -> Vec<f32> {
    run.vars()
        .iter()
        .flat_map(|(_, v)| v.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

#[test]
fn loss_falls_on_a_fixed_batch() {
    let dir = temp("falls");
    let model = TrainModel::load(&tiny(&dir), LoraConfig::default(), 1).unwrap();
    let mut run = Run::open(&dir.join("run"), config(40), model, false).unwrap();
    let first = run.update(&Fixed).unwrap().loss;
    let mut last = first;
    for _ in 1..40 {
        last = run.update(&Fixed).unwrap().loss;
    }
    assert!(last < 0.5 * first, "loss went from {first} to {last}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lora_gradients_match_finite_differences() {
    let dir = temp("grad");
    let model = TrainModel::load(&tiny(&dir), LoraConfig::default(), 3).unwrap();
    // B starts at zero; give it values so A's gradients are not zero too.
    for (name, var) in model.adapters.vars() {
        if name.ends_with("lora_b") {
            var.set(&Tensor::randn(0f32, 0.05, var.shape(), var.device()).unwrap())
                .unwrap();
        }
    }
    let run = Run::open(&dir.join("run"), config(1), model, false).unwrap();
    let seq = Fixed.sequence(Split::Train, 0).unwrap();
    let loss = |run: &Run| f64::from(run.loss(&seq, 1.0).unwrap().to_scalar::<f32>().unwrap());
    let grads = run.loss(&seq, 1.0).unwrap().backward().unwrap();
    let vars = run.vars().to_vec();
    let mut checked = 0;
    for (name, var) in vars
        .iter()
        .filter(|(n, _)| n.starts_with("blk.1."))
        .step_by(3)
    {
        let g: Vec<f32> = grads
            .get(var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base: Vec<f32> = var.flatten_all().unwrap().to_vec1().unwrap();
        for i in [0, base.len() / 2] {
            let eps = 1e-3f32;
            let at = |d: f32| {
                let mut v = base.clone();
                v[i] += d;
                var.set(&Tensor::from_vec(v, var.shape(), var.device()).unwrap())
                    .unwrap();
                loss(&run)
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
            var.set(&Tensor::from_vec(base.clone(), var.shape(), var.device()).unwrap())
                .unwrap();
            let analytic = f64::from(g[i]);
            assert!(
                (numeric - analytic).abs() < 2e-2 * (1.0 + numeric.abs()),
                "{name}[{i}]: analytic {analytic}, numeric {numeric}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 4);
    let _ = std::fs::remove_dir_all(&dir);
}

const CHILD: &str = "MEMAGENT_TRAIN_CHILD_DIR";

/// Runs only as the child of `a_run_killed_with_sigkill_resumes_to_the_same_parameters`.
#[test]
fn child_trains_until_killed() {
    let Some(dir) = std::env::var_os(CHILD) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let model = TrainModel::load(&dir.join("tiny-llama.gguf"), LoraConfig::default(), 5).unwrap();
    let mut run = Run::open(&dir.join("run"), config(1000), model, false).unwrap();
    run.train(&Fixed, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
}

fn checkpoint_step(dir: &Path) -> u64 {
    let Ok(t) = candle_core::safetensors::load(
        dir.join("checkpoint.safetensors"),
        &candle_core::Device::Cpu,
    ) else {
        return 0;
    };
    t.get("adam.step")
        .map_or(0, |s| u64::from(s.to_vec1::<u32>().unwrap()[0]))
}

#[test]
fn a_run_killed_with_sigkill_resumes_to_the_same_parameters() {
    let dir = temp("kill");
    let model_path = tiny(&dir);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_trains_until_killed", "--nocapture"])
        .env(CHILD, &dir)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while checkpoint_step(&dir.join("run")) < 3 {
        assert!(
            Instant::now() < deadline,
            "the child never checkpointed 3 updates"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let reached = checkpoint_step(&dir.join("run"));
    let target = reached + 3;

    // Resume to `target` updates (the configuration must match: same steps value).
    let model = TrainModel::load(&model_path, LoraConfig::default(), 5).unwrap();
    let mut resumed = Run::open(&dir.join("run"), config(1000), model, true).unwrap();
    assert_eq!(resumed.step(), reached);
    while resumed.step() < target {
        resumed.update(&Fixed).unwrap();
    }
    // The same updates without a stop.
    let model = TrainModel::load(&model_path, LoraConfig::default(), 5).unwrap();
    let mut straight = Run::open(&dir.join("straight"), config(1000), model, false).unwrap();
    while straight.step() < target {
        straight.update(&Fixed).unwrap();
    }
    let (a, b) = (params(&resumed), params(&straight));
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-6,
        "resumed and uninterrupted runs differ by {worst}"
    );
    // A fresh start refuses a directory that holds a run.
    let model = TrainModel::load(&model_path, LoraConfig::default(), 5).unwrap();
    let err = Run::open(&dir.join("run"), config(1000), model, false)
        .err()
        .unwrap();
    assert!(err.to_string().contains("--resume"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

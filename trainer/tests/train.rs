//! The trainer on a tiny random-weight model (the engine's test loader): the loss falls
//! on a fixed batch, LoRA gradients match finite differences, and a run killed with
//! SIGKILL in a real child process resumes to the same parameters as a run that was
//! never stopped; a trained adapter gives the trainer's logits in the engine, exports as
//! GGUF and applies by default beside its base model. On the real tokenizer: update
//! targets weigh what the memory did not hold, and kept conversations mix with generated
//! examples of the modes asked for.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::Value;
use candle_core::Tensor;
use memagent_engine::{
    default_adapter_path, export_merged, sha256_file, Adapter, AdapterChoice, GgmlDType, GgufFile,
    LoadOptions, LocalModel, PrefillWeights, WeightPlan,
};
use memagent_tasks::training::{DataConfig, Mode, Split};
use memagent_trainer::{
    Examples, LoraConfig, Result, Run, SampledExamples, Sequence, TaskData, TrainConfig, TrainModel,
};

#[allow(dead_code)]
#[path = "../../engine/tests/model/support.rs"]
mod support;

/// The same few sequences whatever the index: a fixed batch.
struct Fixed;

impl Examples for Fixed {
    fn sequence(&self, split: Split, index: u64) -> Result<Sequence> {
        let k = (index % 2) as u32 + if split == Split::Validation { 7 } else { 0 };
        let ids: Vec<u32> = (0..40).map(|i| (i * 7 + k * 13) % 250).collect();
        Ok(Sequence {
            ids,
            target_start: 24,
            weights: vec![1.0; 16],
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

/// A run trained in stages (`until`, then resumed) ends with the parameters of one
/// trained straight through, on the same schedule.
#[test]
fn a_run_in_stages_equals_one_run() {
    let dir = temp("stages");
    let model_path = tiny(&dir);
    let stop = AtomicBool::new(false);
    let load = || TrainModel::load(&model_path, LoraConfig::default(), 1).unwrap();
    let mut straight = Run::open(&dir.join("straight"), config(5), load(), false).unwrap();
    straight.train(&Fixed, &stop, &mut |_| {}).unwrap();
    let mut staged = Run::open(&dir.join("staged"), config(5), load(), false).unwrap();
    staged.until = Some(2);
    staged.train(&Fixed, &stop, &mut |_| {}).unwrap();
    assert_eq!(staged.step(), 2);
    drop(staged);
    let mut resumed = Run::open(&dir.join("staged"), config(5), load(), true).unwrap();
    assert_eq!(resumed.step(), 2);
    resumed.train(&Fixed, &stop, &mut |_| {}).unwrap();
    assert_eq!(resumed.step(), 5);
    assert_eq!(params(&resumed), params(&straight));
    let _ = std::fs::remove_dir_all(&dir);
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
    // f32 products: rounding activations to 8 bits would put steps in the loss.
    let model = TrainModel::load_with(&tiny(&dir), LoraConfig::default(), 3, false).unwrap();
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
    let grads: std::collections::HashMap<String, Vec<f32>> =
        gradients(&run, &seq).into_iter().collect();
    let vars = run.vars().to_vec();
    let mut checked = 0;
    for (name, var) in vars
        .iter()
        .filter(|(n, _)| n.starts_with("blk.1."))
        .step_by(3)
    {
        let g = &grads[name];
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

/// Every adapter gradient of `run`'s loss on `seq`, by name.
fn gradients(run: &Run, seq: &Sequence) -> Vec<(String, Vec<f32>)> {
    let grads = run.loss(seq, 1.0).unwrap().backward().unwrap();
    run.vars()
        .iter()
        .map(|(name, var)| {
            let g = grads
                .get(var)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            (name.clone(), g)
        })
        .collect()
}

fn assert_close(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)], tolerance: f32) {
    assert_eq!(a.len(), b.len());
    for ((name, x), (other, y)) in a.iter().zip(b) {
        assert_eq!(name, other);
        let scale = y.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        let worst = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(
            worst <= tolerance * scale,
            "{name}: differs by {worst}, largest entry {scale}"
        );
    }
}

/// The fused pass (engine GEMM, fused attention, norm and gate) gives the gradients of
/// the pass composed from candle's own ops, on a sequence longer than one attention
/// block; adapting only the top block gives that block's gradients unchanged.
#[test]
fn the_fused_pass_gives_the_composed_passs_gradients() {
    let dir = temp("fused");
    let model_path = tiny(&dir);
    let model = TrainModel::load_with(&model_path, LoraConfig::default(), 3, false).unwrap();
    // Values for the top block's B only: the blocks below stay the base model, as they
    // are with `top_layers: 1`.
    let top_block = format!("blk.{}.", model.config.n_layer - 1);
    for (name, var) in model.adapters.vars() {
        if name.ends_with("lora_b") && name.starts_with(&top_block) {
            var.set(&Tensor::randn(0f32, 0.05, var.shape(), var.device()).unwrap())
                .unwrap();
        }
    }
    let values: std::collections::HashMap<String, Tensor> = model
        .adapters
        .vars()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let mut run = Run::open(&dir.join("run"), config(1), model, false).unwrap();
    let ids: Vec<u32> = (0..150).map(|i| (i * 11 + 5) % 250).collect();
    let seq = Sequence {
        ids,
        target_start: 100,
        weights: vec![1.0; 50],
    };
    let fused = gradients(&run, &seq);
    run.model.reference = true;
    let composed = gradients(&run, &seq);
    assert!(fused.iter().any(|(_, g)| g.iter().any(|v| v.abs() > 1e-6)));
    assert_close(&fused, &composed, 1e-5);

    let top = LoraConfig {
        top_layers: Some(1),
        ..LoraConfig::default()
    };
    let model = TrainModel::load_with(&model_path, top, 3, false).unwrap();
    for (name, var) in model.adapters.vars() {
        var.set(&values[&name]).unwrap();
    }
    let mut config = config(1);
    config.lora.top_layers = Some(1);
    let run = Run::open(&dir.join("top"), config, model, false).unwrap();
    let top_only = gradients(&run, &seq);
    assert!(!top_only.is_empty() && top_only.iter().all(|(n, _)| n.starts_with(&top_block)));
    let same: Vec<_> = fused
        .into_iter()
        .filter(|(n, _)| n.starts_with(&top_block))
        .collect();
    assert_close(&top_only, &same, 1e-5);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The frozen products in 8-bit integers (the file's own blocks forward, the transposed
/// weight rounded to Q8_0 back; portable loops where the CPU lacks AVX-512 VNNI) give the
/// f32 products' loss and adapter gradients to within their rounding, and not their bits.
#[test]
fn integer_products_give_the_f32_products_gradients_within_rounding() {
    let dir = temp("integer");
    let model_path = tiny(&dir);
    let load = |integer: bool| {
        let model = TrainModel::load_with(&model_path, LoraConfig::default(), 3, integer).unwrap();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for (name, var) in model.adapters.vars() {
            if name.ends_with("lora_b") {
                let v: Vec<f32> = (0..var.elem_count())
                    .map(|_| {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        (rng % 1000) as f32 / 10_000.0 - 0.05
                    })
                    .collect();
                var.set(&Tensor::from_vec(v, var.shape(), var.device()).unwrap())
                    .unwrap();
            }
        }
        Run::open(&dir.join(format!("run-{integer}")), config(1), model, false).unwrap()
    };
    let (integer, f32_run) = (load(true), load(false));
    let ids: Vec<u32> = (0..150).map(|i| (i * 11 + 5) % 250).collect();
    let seq = Sequence {
        ids,
        target_start: 100,
        weights: vec![1.0; 50],
    };
    let loss = |run: &Run| run.loss(&seq, 1.0).unwrap().to_scalar::<f32>().unwrap();
    let (a, b) = (loss(&integer), loss(&f32_run));
    assert!(
        (a - b).abs() < 1e-2 * b.abs(),
        "loss {a} in integers, {b} in f32"
    );
    let (gi, gf) = (gradients(&integer, &seq), gradients(&f32_run, &seq));
    assert!(gi != gf, "the integer products gave the f32 products' bits");
    // Relative to each adapter's whole gradient: 2.5-5.4% on this tiny model, whose rows
    // of 64 random weights round coarsely; a wrong product would be off by its size.
    for ((name, x), (_, y)) in gi.iter().zip(&gf) {
        let norm = y.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        let diff = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q) * (p - q))
            .sum::<f32>()
            .sqrt();
        assert!(
            diff <= 0.1 * norm,
            "{name}: differs by {diff}, gradient norm {norm}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn architectures_the_trainer_does_not_model_are_refused_by_name() {
    let dir = temp("train-refused");
    std::fs::create_dir_all(&dir).unwrap();
    for arch in ["qwen3", "phi3"] {
        let path = memagent_engine::testing::write_tiny_model(&dir, arch);
        let err = TrainModel::load(&path, LoraConfig::default(), 5)
            .err()
            .unwrap_or_else(|| panic!("{arch} loaded for training"));
        assert!(err.to_string().contains(&format!("`{arch}`")), "{err}");
    }
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

/// Logits of the last position of `ids` from a local model loaded with `adapter`.
/// The engine's logits for `ids`, its prefill on f32 weights as the trainer's forward is
/// (the default integer prefill rounds activations to 8 bits, which moves a tiny random
/// model's logits by tenths).
fn engine_logits(model: &Path, adapter: AdapterChoice, ids: &[u32]) -> (Option<PathBuf>, Vec<f32>) {
    let options = LoadOptions {
        adapter,
        weights: WeightPlan {
            dense_prefill: true,
            prefill: PrefillWeights::Tiles,
        },
        ..LoadOptions::default()
    };
    let m = LocalModel::load(model, &options).unwrap();
    let mut cache = m.transformer().new_cache(1, ids.len());
    let logits = m
        .transformer()
        .forward(&[ids.to_vec()], &mut cache)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    (m.adapter().map(Path::to_path_buf), logits)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn a_trained_adapter_merges_exports_and_applies_by_default() {
    let dir = temp("adapter");
    let model_path = tiny(&dir);
    let sha = sha256_file(&model_path).unwrap();
    // f32 products, as the engine's f32 prefill below.
    let model = TrainModel::load_with(&model_path, LoraConfig::default(), 5, false).unwrap();
    let mut run = Run::open(&dir.join("run"), config(4), model, false).unwrap();
    for _ in 0..4 {
        run.update(&Fixed).unwrap();
    }
    let adapter = dir.join("adapter.safetensors");
    run.export_adapter(&adapter).unwrap();
    let manifest = |sha: &str| serde_json::json!({ "base_sha256": sha, "rank": 8 }).to_string();
    std::fs::write(dir.join("adapter.json"), manifest(&sha)).unwrap();

    let ids: Vec<u32> = (0..30).map(|i| (i * 11 + 3) % 250).collect();
    let trained = run
        .model
        .forward(&ids, &[ids.len() - 1])
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let (none, base) = engine_logits(&model_path, AdapterChoice::None, &ids);
    assert_eq!(none, None);
    let (applied, merged) = engine_logits(&model_path, AdapterChoice::File(adapter.clone()), &ids);
    assert_eq!(applied.as_deref(), Some(adapter.as_path()));
    // The engine's merged weights give the trainer's logits (f16 adapter, f32 merge),
    // and training moved them well away from the base model's.
    let (err, moved) = (max_diff(&merged, &trained), max_diff(&merged, &base));
    assert!(
        err < 0.05 && moved > 10.0 * err,
        "merged vs trained {err}, merged vs base {moved}"
    );

    // Exported as GGUF: a plain model file with the same behaviour. Stored as f32 the
    // merged weights are the engine's, added in another order (x (W + B A)ᵀ against
    // x Wᵀ + (x Aᵀ) Bᵀ); the output head rounds the last hidden state to 8 bits, so a
    // last-bit difference can move one value a rounding step (0.3% of the update was
    // seen). As Q8_0 (the tiny model's random weights round coarsely) the update must
    // still dominate the rounding.
    let a = Adapter::load(&adapter).unwrap();
    for (dtype, bound) in [
        (GgmlDType::F32, 1e-2 * moved),
        (GgmlDType::Q8_0, 0.5 * moved),
    ] {
        let out = dir.join(format!("tuned-{dtype:?}.gguf"));
        let report = export_merged(&model_path, &a, &out, dtype).unwrap();
        assert_eq!(report.merged, a.len());
        let gguf = GgufFile::open(&out).unwrap();
        assert!(
            matches!(gguf.get("memagent.adapter.base_sha256"), Some(Value::String(s)) if *s == sha)
        );
        let (_, exported) = engine_logits(&out, AdapterChoice::None, &ids);
        let err = max_diff(&exported, &merged);
        assert!(
            err <= bound,
            "{dtype:?}: exported vs merged {err} (adapter moved {moved})"
        );
    }

    // The default adapter beside the model applies when it names this model file ...
    let default = default_adapter_path(&model_path);
    std::fs::copy(&adapter, &default).unwrap();
    std::fs::write(default.with_extension("json"), manifest(&sha)).unwrap();
    let (applied, by_default) = engine_logits(&model_path, AdapterChoice::Default, &ids);
    assert_eq!(applied.as_deref(), Some(default.as_path()));
    assert_eq!(by_default, merged);
    // ... and is skipped for another base model, where an explicit one is refused.
    let other = "0".repeat(64);
    std::fs::write(default.with_extension("json"), manifest(&other)).unwrap();
    let (applied, skipped) = engine_logits(&model_path, AdapterChoice::Default, &ids);
    assert_eq!(applied, None);
    assert_eq!(skipped, base);
    let refused = LocalModel::load(
        &model_path,
        &LoadOptions {
            adapter: AdapterChoice::File(default.clone()),
            ..LoadOptions::default()
        },
    )
    .err()
    .expect("an adapter for another base model is refused")
    .to_string();
    assert!(
        refused.contains(&other) && refused.contains(&sha),
        "{refused}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn task_data(new_fact_weight: f32) -> TaskData {
    TaskData::from_gguf(
        &support::model_path(),
        DataConfig::default(),
        None,
        new_fact_weight,
    )
    .unwrap()
}

#[test]
fn update_targets_weigh_what_the_memory_did_not_hold() {
    let before = "The user's name is Ada.\nThe user lives in Porto.";
    let target = "The user's name is Ada.\nThe user lives in Porto.\nThe user's sister is Lucia.";
    let plain = task_data(1.0)
        .tokenize("msg", target, Some(before))
        .unwrap();
    let data = task_data(3.0);
    let weighted = data.tokenize("msg", target, Some(before)).unwrap();
    assert_eq!(plain.ids, weighted.ids, "weights never change the tokens");
    assert!(plain.weights.iter().all(|&w| w == 1.0));
    assert_eq!(weighted.weights.len(), weighted.target_tokens());
    let reply = &weighted.ids[weighted.target_start..];
    let heavy: Vec<u32> = reply
        .iter()
        .zip(&weighted.weights)
        .filter(|(_, &w)| w == 3.0)
        .map(|(&t, _)| t)
        .collect();
    // The new line with its line break, and the end of the reply (a special token).
    assert_eq!(
        data.tokenizer.decode(&heavy).unwrap(),
        "\nThe user's sister is Lucia."
    );
    assert_eq!(weighted.weights.last(), Some(&3.0), "stopping is weighed");
    let light = weighted.weights.iter().filter(|&&w| w == 1.0).count();
    assert_eq!(
        light,
        data.tokenizer.encode(before, false).unwrap().len(),
        "copied lines weigh 1"
    );
    // A final answer has no memory to copy: every token weighs 1.
    let answer = data.tokenize("msg", "Lucia.", None).unwrap();
    assert!(answer.weights.iter().all(|&w| w == 1.0));
}

#[test]
fn kept_conversations_mix_with_generated_examples_of_the_modes_asked() {
    let dir = temp("sampled");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("samples.jsonl");
    let group = serde_json::json!({
        "index": 0, "family": "chat", "mode": "general",
        "samples": [{"score": 1.0, "noise_lines": 0, "memory": "Ada lives in Graz."}],
        "selected": 0,
        "conversations": [{"kind": "update", "message": "Text: Ada lives in Graz.",
            "target": "Ada lives in Graz.", "memory_before": "No previous memory"}],
    });
    std::fs::write(&file, format!("{group}\n")).unwrap();
    // Generated examples question mode only; kept conversations always general.
    let mut data = task_data(3.0);
    data.config.general_share = 0.0;
    let generator = task_data(3.0);
    let kept = generator
        .tokenize(
            "Text: Ada lives in Graz.",
            "Ada lives in Graz.",
            Some("No previous memory"),
        )
        .unwrap();
    let sampled = SampledExamples::open(data, &[file.as_path()], 0.5, 1.0).unwrap();
    let (mut from_file, mut generated) = (0, 0);
    for index in 0..40 {
        let seq = sampled.sequence(Split::Train, index).unwrap();
        if seq.ids == kept.ids {
            from_file += 1;
            continue;
        }
        generated += 1;
        let example = sampled.data.example(Split::Train, index).unwrap();
        assert_eq!(example.mode, Mode::Question, "generated example {index}");
        assert_eq!(
            seq.ids,
            sampled.data.sequence(Split::Train, index).unwrap().ids
        );
    }
    assert!(
        from_file >= 10 && generated >= 10,
        "{from_file} kept, {generated} generated"
    );
    // Validation stays generated.
    let v = sampled.sequence(Split::Validation, 0).unwrap();
    assert_ne!(v.ids, kept.ids);
    let _ = std::fs::remove_dir_all(&dir);
}

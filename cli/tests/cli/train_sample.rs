//! Rejection sampling (`memctl train sample`) on the real default model, and training on
//! its samples files (`memctl train --examples`).

use std::path::Path;

use super::{stderr, tempdir, with_model};

/// `memctl train sample` of two small documents of the base model into `out`, with
/// `extra` options.
fn sample_run(out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "--adapter",
        "none",
        "-q",
        "train",
        "sample",
        "--out",
        out.to_str().unwrap(),
        "--count",
        "2",
        "--chunk-min",
        "96",
        "--chunk-max",
        "160",
        "--json",
    ];
    args.extend_from_slice(extra);
    with_model(&args)
}

fn sample(out: &Path, seed: &str) -> String {
    let o = sample_run(
        out,
        &[
            "--samples",
            "3",
            "--seed",
            seed,
            "--general-share",
            "0.5",
            "--min-reward",
            "0",
            "--writer",
            "lines",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn rejection_sampling_with_a_fixed_seed_selects_the_same_trajectories() {
    let dir = tempdir();
    let a = sample(&dir.as_path().join("a.jsonl"), "5");
    let b = sample(&dir.as_path().join("b.jsonl"), "5");
    assert_eq!(a, b, "the same seed read the documents differently");
    let groups: Vec<serde_json::Value> = a
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(groups.len(), 2);
    for g in &groups {
        assert_eq!(g["samples"].as_array().unwrap().len(), 3, "{g}");
        match g["selected"].as_u64() {
            Some(s) => {
                let best = &g["samples"][s as usize];
                let top = g["samples"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["score"].as_f64().unwrap())
                    .fold(0.0, f64::max);
                assert_eq!(best["score"].as_f64(), Some(top), "{g}");
                assert!(!g["conversations"].as_array().unwrap().is_empty(), "{g}");
            }
            None => assert!(g["conversations"].as_array().unwrap().is_empty(), "{g}"),
        }
    }
    // Sampling is on: the readings of a document differ, and another seed reads others.
    let memories: Vec<&str> = groups
        .iter()
        .flat_map(|g| g["samples"].as_array().unwrap())
        .map(|s| s["memory"].as_str().unwrap())
        .collect();
    assert!(
        memories.windows(2).any(|w| w[0] != w[1]),
        "every reading wrote the same memory: {memories:?}"
    );
    let c = sample(&dir.as_path().join("c.jsonl"), "6");
    assert_ne!(a, c, "another seed read the documents the same way");
    // Documents already in the file are skipped: sampling again appends nothing.
    let again = sample(&dir.as_path().join("a.jsonl"), "5");
    assert_eq!(again, a);
}

#[test]
fn corrected_sampling_keeps_every_general_document() {
    let dir = tempdir();
    let out = dir.as_path().join("c.jsonl");
    let args = |writer| {
        [
            "--samples",
            "1",
            "--general-share",
            "1",
            "--correct",
            "--writer",
            writer,
        ]
    };
    let o = sample_run(&out, &args("rewrite"));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--writer lines"), "{}", stderr(&o));
    let o = sample_run(&out, &args("lines"));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let groups: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(groups.len(), 2);
    for g in &groups {
        // The base model seldom keeps every fact; corrected, each document still teaches.
        assert_eq!(g["mode"], "general", "{g}");
        assert_eq!(g["selected"], 0, "{g}");
        assert_eq!(g["corrected"], true, "{g}");
        let targets: Vec<&str> = g["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["target"].as_str().unwrap())
            .collect();
        assert!(!targets.is_empty(), "{g}");
        assert!(
            targets.iter().any(|t| *t != "NONE"),
            "no fact was taught: {g}"
        );
    }
}

#[test]
fn training_reads_the_kept_conversations_of_a_samples_file() {
    let dir = tempdir();
    let file = dir.as_path().join("samples.jsonl");
    let group = serde_json::json!({
        "index": 0, "family": "chat", "mode": "general",
        "samples": [{"score": 1.0, "noise_lines": 0, "memory": "Ada lives in Graz."}],
        "selected": 0,
        "conversations": [{"kind": "update",
            "message": "Read the text and write its new facts.\nText: Ada lives in Graz.",
            "target": "Ada lives in Graz.", "memory_before": "No previous memory"}],
    });
    std::fs::write(&file, format!("{group}\n")).unwrap();
    let out = dir.as_path().join("run");
    let train = |examples: &Path| {
        with_model(&[
            "--adapter",
            "none",
            "train",
            "--out",
            out.to_str().unwrap(),
            "--examples",
            examples.to_str().unwrap(),
            "--steps",
            "1",
            "--batch",
            "1",
            "--warmup",
            "0",
            "--eval-every",
            "0",
            "--top-layers",
            "1",
            "--json",
        ])
    };
    let o = train(&file);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 kept conversations"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("frozen products: "), "{}", stderr(&o));

    // `--bench`: training and prefill rates side by side, in the products prefill uses
    // (8-bit integers where the CPU has them), or in f32 when prefill is asked for f32.
    let model = super::model_path();
    let bench = |prefill: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_memctl"))
            .args([
                "--model",
                model.to_str().unwrap(),
                "--adapter",
                "none",
                "-q",
            ])
            .args([
                "train",
                "--examples",
                file.to_str().unwrap(),
                "--batch",
                "1",
            ])
            .args(["--top-layers", "1", "--bench", "2", "--json"])
            .env_remove("MEMAGENT_MODEL")
            .env_remove("MEMAGENT_CONFIG")
            .env("MEMAGENT_PREFILL_WEIGHTS", prefill)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for key in [
            "tokens_per_second",
            "useful_gflop_per_second",
            "prefill_projections_gflop_per_second",
            "ratio",
        ] {
            assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
        }
        v["products"].as_str().unwrap().to_string()
    };
    // MEMAGENT_INTEGER_KERNEL=portable stands in for a CPU without either kernel.
    let forced = std::env::var("MEMAGENT_INTEGER_KERNEL").as_deref() == Ok("portable");
    #[cfg(target_arch = "x86_64")]
    let vnni = !forced
        && (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
            || is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = {
        let _ = forced;
        false
    };
    assert_eq!(bench("integer"), if vnni { "integer" } else { "f32" });
    assert_eq!(bench("tiles"), "f32");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("adapter.json")).unwrap()).unwrap();
    assert_eq!(manifest["data"]["examples"][0], file.to_str().unwrap());
    assert_eq!(manifest["metrics"]["updates"], 1);

    let bad = dir.as_path().join("bad.jsonl");
    std::fs::write(&bad, format!("{group}\nnot json\n")).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
    let o = train(&bad);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad.jsonl:2"), "{}", stderr(&o));
}

/// `train data --steps`: each update step as the model reads it, with the values of the
/// facts its chunk states (each found in the chunk) and of the facts stated before.
#[test]
fn data_steps_give_each_prompt_with_its_facts() {
    let o = with_model(&[
        "-q",
        "train",
        "data",
        "--steps",
        "--writer",
        "lines",
        "--general-share",
        "1",
        "--chunk-max",
        "256",
        "--count",
        "6",
        "--data-seed",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(rows.len() >= 6, "{} steps", rows.len());
    let mut earlier: Vec<serde_json::Value> = Vec::new();
    let mut facts = 0;
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["mode"], "general");
        if r["step"] == 0 {
            earlier.clear();
        } else {
            assert_eq!(r["index"], rows[i - 1]["index"]);
            assert_eq!(
                r["step"].as_u64(),
                rows[i - 1]["step"].as_u64().map(|s| s + 1)
            );
        }
        assert_eq!(r["earlier_values"].as_array().unwrap(), &earlier, "{r}");
        let message = r["message"].as_str().unwrap();
        let chunk = message.split("New section:").nth(1).unwrap().to_lowercase();
        for fact in r["values"].as_array().unwrap() {
            facts += 1;
            for v in fact.as_array().unwrap() {
                let v = v.as_str().unwrap().to_lowercase();
                assert!(chunk.contains(&v), "{v} not in the chunk:\n{chunk}");
            }
            earlier.push(fact.clone());
        }
        // The prompt is the message in the model's chat template.
        let ids = r["prompt_ids"].as_array().unwrap().len();
        let t = with_model(&["-q", "tokenize", "--json", message]);
        let count: serde_json::Value = serde_json::from_slice(&t.stdout).unwrap();
        let n = count["count"].as_u64().unwrap() as usize;
        assert!(
            ids > n && ids < n + 64,
            "{ids} prompt tokens for a {n}-token message"
        );
    }
    assert!(facts > 0, "no step stated a fact");
    let empty = with_model(&["-q", "train", "data", "--steps", "--trajectories"]);
    assert!(
        !empty.status.success(),
        "--steps and --trajectories are exclusive"
    );
}

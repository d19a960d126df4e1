//! `memctl` run as a real process on the real default model.

mod ask;
mod bench_loop;
mod qa;
mod ruler;
mod train_sample;
mod watch;

use std::path::PathBuf;
use std::process::{Command, Output};

fn model_path() -> PathBuf {
    std::env::var_os("MEMAGENT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

fn memctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memctl"))
        .args(args)
        .env_remove("MEMAGENT_MODEL")
        .env_remove("MEMAGENT_CONFIG")
        // No configuration file: the default location is empty.
        .env("XDG_CONFIG_HOME", "/nonexistent/memagent-test-config")
        .output()
        .expect("run memctl")
}

fn with_model(args: &[&str]) -> Output {
    let model = model_path();
    let mut all = vec!["--model", model.to_str().unwrap()];
    all.extend_from_slice(args);
    // The explicit config path must not be needed when --model is given.
    Command::new(env!("CARGO_BIN_EXE_memctl"))
        .args(&all)
        .env_remove("MEMAGENT_MODEL")
        .env_remove("MEMAGENT_CONFIG")
        .output()
        .expect("run memctl")
}

/// A fresh folder of this test's own (the process and thread name it).
fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "memctl-cli-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bench_shared_refuses_a_run_with_nothing_to_step() {
    // Refused before any server is reached: the URL names a port nothing listens on.
    for (flag, value) in [
        ("--chunks", "0"),
        ("--streams", "0"),
        ("--chunk-tokens", "0"),
    ] {
        let o = memctl(&[
            "--database",
            "postgres://127.0.0.1:1/x",
            "bench",
            "shared",
            flag,
            value,
        ]);
        assert_eq!(o.status.code(), Some(1), "{flag}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("take one or more"),
            "{flag}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn help_lists_the_commands() {
    let o = memctl(&["--help"]);
    assert!(o.status.success());
    for cmd in ["ask", "generate", "model", "tokenize", "bench"] {
        assert!(
            stdout(&o).contains(cmd),
            "{cmd} missing from help:\n{}",
            stdout(&o)
        );
    }
    let o = memctl(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2), "usage errors exit 2");
}

#[test]
fn tokenize_prints_llama_cpp_ids() {
    let o = with_model(&["tokenize", "Hello world!"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "19556 905 17");
    let o = with_model(&["tokenize", "--json", "<|im_start|>user"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ids"], serde_json::json!([1, 4093]));
    assert_eq!(v["tokens"][0], "<|im_start|>");
}

#[test]
fn model_info_describes_the_default_model() {
    let o = with_model(&["model", "info", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["context_length"], 8192);
    assert_eq!(v["vocab_size"], 49152);
    assert_eq!(v["layers"], 30);
    assert_eq!(
        v["sha256"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert!(v["parameters"].as_u64().unwrap() > 100_000_000);
    assert!(v["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    // scripts/fetch-model installs the shipped adapter beside the model.
    assert_eq!(v["adapter"]["default"], true, "{v:#}");
    assert_eq!(v["adapter"]["applied"], true, "{v:#}");
    assert_eq!(v["adapter"]["writer"], "lines", "{v:#}");
    let text = stdout(&with_model(&["model", "info"]));
    assert!(text.contains("Q4_1"), "{text}");
    // Prefill's path on this CPU: the file's Q4_1 projections in 8-bit integers where
    // the CPU has AVX-512 VNNI, f32 otherwise; the text says which.
    let integer = v["prefill_integer_types"].as_array().unwrap();
    let prefill = v["prefill"].as_str().unwrap();
    if integer.is_empty() {
        assert!(prefill.starts_with("f32 GEMM"), "{prefill}");
    } else {
        assert!(integer.contains(&"Q4_1".into()), "{v:#}");
        assert!(prefill.starts_with("8-bit integer products"), "{prefill}");
    }
    assert!(
        text.contains(&format!("prefill:        {prefill}")),
        "{text}"
    );
    assert!(text.contains("writer lines, base matches"), "{text}");
    // The shipped adapter learned memory steps and memory-only final answers, not
    // answers from passages: those run the base model.
    assert_eq!(
        v["adapter"]["answers"],
        serde_json::json!(["memagent-final-boxed", "memagent-general-answer"]),
        "{v:#}"
    );
    assert!(
        text.contains("adapter runs:   memory steps, answers with memagent-final-boxed"),
        "{text}"
    );
    // Its reader, installed beside it too, answers from passages.
    assert_default_reader(&v);
    assert!(
        text.contains("base matches): answers from passages run with it"),
        "{text}"
    );
    // Without it, the text says what answers from passages run with.
    let text = stdout(&with_model(&["--reader", "none", "model", "info"]));
    assert!(text.contains("reader:         none"), "{text}");
}

/// `model info --json`'s reader: the default one beside the model file, trained on it,
/// applied to answers from passages and to nothing else.
fn assert_default_reader(v: &serde_json::Value) {
    assert_eq!(v["reader"]["default"], true, "{v:#}");
    assert_eq!(v["reader"]["applied"], true, "{v:#}");
    assert_eq!(v["reader"]["base_matches"], true, "{v:#}");
    assert_eq!(
        v["reader"]["answers"],
        serde_json::json!(["memagent-passage-answer"]),
        "{v:#}"
    );
}

/// Qwen2.5-Coder-0.5B comes with a reader of its own, installed beside it by
/// `scripts/fetch-model qwen2.5-coder-0.5b-instruct`, trained on that exact file: it
/// reads answers from passages, and nothing else (there is no writer's adapter for it).
#[test]
fn the_second_model_s_reader_is_installed_beside_it_and_reads_passages() {
    let qwen = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/Qwen2.5-Coder-0.5B-Instruct.gguf");
    assert!(
        qwen.is_file(),
        "{} missing: run scripts/fetch-model qwen2.5-coder-0.5b-instruct (scripts/test does)",
        qwen.display()
    );
    let o = memctl(&["--model", qwen.to_str().unwrap(), "model", "info", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["architecture"], "qwen2", "{v:#}");
    assert_default_reader(&v);
    assert!(v["adapter"].is_null(), "{v:#}");
}

/// How decoding is set for this CPU: measured the first time (a fresh cache), read back
/// after, or set by `MEMAGENT_PREFETCH_AHEAD`; a bad value is an error naming it.
#[test]
fn model_info_says_how_decoding_was_set_for_this_cpu() {
    let cache = tempdir();
    let info = |env: &[(&str, &str)]| {
        let model = model_path();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memctl"));
        cmd.args(["--model", model.to_str().unwrap(), "model", "info"])
            .env_remove("MEMAGENT_PREFETCH_AHEAD")
            .env("XDG_CACHE_HOME", &cache);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let json = cmd.arg("--json").output().expect("run memctl");
        assert!(json.status.success(), "{}", stderr(&json));
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        v["decode_tuning"].clone()
    };
    let first = info(&[]);
    let second = info(&[]);
    if cfg!(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )) {
        assert_eq!(first["source"], "measured", "{first:#}");
        assert_eq!(
            first["candidates"].as_array().unwrap().len(),
            6,
            "{first:#}"
        );
        assert_eq!(second["source"], "cached", "{second:#}");
        assert_eq!(second["prefetch_ahead"], first["prefetch_ahead"]);
        assert!(cache.join("memagent/decode-tuning.json").is_file());
    }
    let set = info(&[("MEMAGENT_PREFETCH_AHEAD", "1024")]);
    assert_eq!(set["source"]["set"], "MEMAGENT_PREFETCH_AHEAD", "{set:#}");
    assert_eq!(set["prefetch_ahead"], 1024);
    let model = model_path();
    let text = Command::new(env!("CARGO_BIN_EXE_memctl"))
        .args(["--model", model.to_str().unwrap(), "model", "info"])
        .env("MEMAGENT_PREFETCH_AHEAD", "1024")
        .output()
        .unwrap();
    assert!(
        stdout(&text)
            .contains("decoding:       prefetch 1024 bytes ahead (set by MEMAGENT_PREFETCH_AHEAD)"),
        "{}",
        stdout(&text)
    );
    let bad = info(&[("MEMAGENT_PREFETCH_AHEAD", "far")]);
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("MEMAGENT_PREFETCH_AHEAD=far"),
        "{bad:#}"
    );
    let _ = std::fs::remove_dir_all(&cache);
}

/// The process's resident memory after a 2,048-token prefill stays within the model file,
/// its key/value cache and 300 MB of scratch: prefill dequantizes blocks of weight rows
/// inside its GEMM, and the default model's shipped adapter stays beside the weights
/// (its low-rank factors, 4.9 MB) instead of being merged into an f32 copy of them.
#[test]
fn a_prefill_of_2048_tokens_stays_within_its_memory_bound() {
    let info: serde_json::Value =
        serde_json::from_slice(&with_model(&["model", "info", "--json"]).stdout).unwrap();
    let o = with_model(&[
        "bench",
        "engine",
        "--prefill",
        "2048",
        "--decode",
        "0",
        "--rewrite",
        "--batch",
        "0",
        "--repeats",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let case = &v["results"][0];
    assert_eq!(case["test"], "pp2048", "{v:#}");
    let peak = case["peak_rss_bytes"]
        .as_u64()
        .expect("Linux reports VmHWM");
    let file = info["file_bytes"].as_u64().unwrap();
    let n = |k: &str| info[k].as_u64().unwrap();
    // f32 keys and values of every layer for 2,048 positions.
    let head_dim = n("embedding_length") / n("heads");
    let kv = n("layers") * 2 * n("kv_heads") * head_dim * 2048 * 4;
    let bound = file + kv + 300_000_000;
    eprintln!("peak RSS {peak} bytes; bound {bound} (file {file}, kv {kv})");
    assert!(
        peak <= bound,
        "peak RSS {peak} bytes over {bound} (file {file}, kv {kv})"
    );
}

/// `bench engine` with only the given cases, once each: prefill sizes (`0`: none),
/// projection rows (empty: none) and short prompts stacked (`0`: none).
fn bench_engine(prefill: &str, projections: &str, stacked: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "bench",
        "engine",
        "--prefill",
        prefill,
        "--decode",
        "0",
        "--rewrite",
        "--batch",
        "0",
        "--stacked",
        stacked,
        "--repeats",
        "1",
        "--projections",
    ];
    if !projections.is_empty() {
        args.push(projections);
    }
    args.extend_from_slice(extra);
    with_model(&args)
}

/// The cases a `bench engine --json` run reported, in order.
fn case_names(v: &serde_json::Value) -> Vec<&str> {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect()
}

/// The engine benchmark's small cases: a prefill, the projections alone (with their
/// GFLOP/s, which a prefill case does not carry) and none of the cases turned off.
#[test]
fn bench_engine_reports_prefill_and_the_projections_alone() {
    let o = bench_engine("32", "16", "0", &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(case_names(&v), ["pp32", "mm16"]);
    let results = v["results"].as_array().unwrap();
    assert!(results[0].get("gflop_per_second").is_none());
    assert_eq!(results[1]["tokens"], 16);
    assert!(results[1]["gflop_per_second"].as_f64().unwrap() > 0.0);
    assert!(results[1]["tokens_per_second"].as_f64().unwrap() > 0.0);
    let o = bench_engine("32", "16", "0", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("mm16: the projections' matrix products alone run at"),
        "{}",
        stdout(&o)
    );
}

/// Short prompts prefilled one at a time and together: both cases over the same
/// tokens, each prompt's first token checked to agree, the speedup printed beside the
/// second; a malformed size is refused with what it takes.
#[test]
fn bench_engine_prefills_short_prompts_alone_and_together() {
    let o = bench_engine("0", "", "4x40", &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tests = case_names(&v);
    if tests.is_empty() {
        // No integer kernel on this CPU: prompts prefill one at a time, and it says so.
        assert_eq!(v["machine"]["integer_kernel"], "portable", "{v:#}");
        assert!(stderr(&o).contains("skipped"), "{}", stderr(&o));
        return;
    }
    assert_eq!(tests, ["pp40x4-alone", "pp40x4"]);
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["tokens"], 160, "{r:#}");
        assert!(r["tokens_per_second"].as_f64().unwrap() > 0.0, "{r:#}");
    }
    let o = bench_engine("0", "", "4x40", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    let line = table
        .lines()
        .find(|l| l.starts_with("pp40x4 "))
        .unwrap_or_else(|| panic!("{table}"));
    let speedup = line.split_whitespace().nth(4).unwrap_or_default();
    assert!(
        speedup.ends_with('x') && speedup.trim_end_matches('x').parse::<f64>().is_ok(),
        "no speedup beside the batch: {line}"
    );
    let o = bench_engine("0", "", "4by40", &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is not NxT"), "{}", stderr(&o));
}

#[test]
fn generate_answers_a_prompt() {
    // The base model's greedy reply (the shipped memory-writer adapter aside).
    let o = with_model(&[
        "--adapter",
        "none",
        "generate",
        "--prompt",
        "What is the capital of France? Answer in one word.",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "The capital of France is Paris.");
    let o = with_model(&[
        "generate",
        "-p",
        "Write one sentence about the sea.",
        "--max-tokens",
        "5",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["completion_tokens"], 5);
    assert_eq!(v["stop_reason"], "max_tokens");
    assert!(v["prompt_tokens"].as_u64().unwrap() > 20);
}

#[test]
fn bad_input_gets_a_clear_error() {
    let o = memctl(&["--model", "/nonexistent/x.gguf", "generate", "-p", "hi"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("model not found at /nonexistent/x.gguf"),
        "{}",
        stderr(&o)
    );

    let o = with_model(&["--device", "cuda", "generate", "-p", "hi"]);
    assert_eq!(o.status.code(), Some(1));
    if !cfg!(feature = "cuda") {
        assert!(stderr(&o).contains("--features cuda"), "{}", stderr(&o));
    }

    let long = "word ".repeat(9000);
    let o = with_model(&["generate", "-p", &long, "--max-tokens", "10"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("does not fit the model's context"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

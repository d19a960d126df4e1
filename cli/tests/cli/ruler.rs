//! `memctl bench ruler` end to end on the default model: all outputs written, and a second
//! run resumes without repeating work.

use super::{stderr, stdout, with_model};

#[test]
fn a_tiny_ruler_run_writes_every_output_and_resumes() {
    let out = std::env::temp_dir().join(format!("memctl-ruler-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let args = [
        "bench",
        "ruler",
        "--tasks",
        "niah_single,vt",
        "--lengths",
        "256,512",
        "--samples",
        "1",
        "--chunk-tokens",
        "160",
        "--memory-tokens",
        "64",
        "--answer-tokens",
        "32",
        "--out",
        out.to_str().unwrap(),
    ];
    let first = with_model(&args);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stdout(&first).contains("8 samples run, 0 resumed"),
        "{}",
        stdout(&first)
    );
    for file in [
        "results.jsonl",
        "results.json",
        "report.md",
        "accuracy.svg",
        "seconds.svg",
    ] {
        let meta =
            std::fs::metadata(out.join(file)).unwrap_or_else(|_| panic!("{file} is written"));
        assert!(meta.len() > 100, "{file} is not empty");
    }
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let samples = results["results"].as_array().unwrap();
    assert_eq!(samples.len(), 8, "2 tasks × 2 lengths × 1 sample × 2 modes");
    for s in samples {
        for key in [
            "task", "length", "seed", "mode", "answer", "expected", "score", "tokens", "seconds",
        ] {
            assert!(s.get(key).is_some(), "{key} in {s}");
        }
        let tokens = s["tokens"].as_f64().unwrap();
        let length = s["length"].as_f64().unwrap();
        assert!((tokens - length).abs() / length <= 0.02, "{s}");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("| niah_single | memory |") && report.contains("| vt | direct |"),
        "{report}"
    );
    assert!(report.contains("R² ="), "{report}");
    // The machine it ran on goes with the figures: the CPU, what the build was made for,
    // the threads.
    let machine = &results["machine"];
    for key in [
        "cpu",
        "arch",
        "build_features",
        "integer_kernel",
        "threads",
        "build_profile",
        "build_flags",
    ] {
        assert!(!machine[key].is_null(), "{key} in {machine}");
    }
    assert!(machine["threads"].as_u64().unwrap() >= 1, "{machine}");
    assert!(report.contains("machine: "), "{report}");
    let svg = std::fs::read_to_string(out.join("seconds.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("per 1K tokens"),
        "the fit is labelled"
    );

    // Again: everything is done already; the report is rebuilt from the saved results.
    let lines = std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .count();
    let second = with_model(&args);
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stdout(&second).contains("0 samples run, 8 resumed"),
        "{}",
        stdout(&second)
    );
    let after = std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, after, "no sample ran twice");

    // Bad requests say what is wrong.
    let bad = with_model(&[
        "bench",
        "ruler",
        "--tasks",
        "niah",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("unknown task `niah`"),
        "{}",
        stderr(&bad)
    );
    let no_qa = with_model(&[
        "bench",
        "ruler",
        "--tasks",
        "qa",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(stderr(&no_qa).contains("--qa FILE"), "{}", stderr(&no_qa));
}

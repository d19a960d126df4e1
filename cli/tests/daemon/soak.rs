//! `memctl bench soak` as CI runs it: 20 SIGKILLs of a real daemon under a chat log
//! written every 50 ms, API appends and searches, and proxied chat requests. The bench
//! fails on any loss; here its report is read back as well.

use std::process::Command;

use serde_json::Value;

use crate::{model_path, test_root};

#[test]
fn twenty_sigkills_lose_nothing_and_leave_the_index_equal_to_a_rebuild() {
    let root = test_root("soak");
    let out = Command::new(env!("CARGO_BIN_EXE_memctl"))
        .arg("--model")
        .arg(model_path())
        .env_remove("MEMAGENT_DATA_DIR")
        .env_remove("RUST_LOG")
        .args([
            "bench",
            "soak",
            "--kills",
            "20",
            "--chunk-tokens",
            "64",
            "--memory-tokens",
            "24",
            "--min-up-ms",
            "300",
            "--max-up-ms",
            "2000",
            "--drain-seconds",
            "30",
            "--json",
            "--dir",
        ])
        .arg(root.join("soak"))
        .output()
        .expect("run memctl bench soak");
    assert!(
        out.status.success(),
        "the soak failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("the report is JSON");
    eprintln!("{r:#}");
    assert_eq!(r["kills"], 20);
    let written = r["chat"]["lines_written"].as_u64().unwrap();
    assert!(written > 100, "the writer kept writing: {written} lines");
    assert_eq!(r["chat"]["lines_logged"].as_u64(), Some(written));
    assert_eq!(r["chat"]["lines_lost"], 0);
    let acknowledged = r["api"]["acknowledged"].as_u64().unwrap();
    assert!(acknowledged > 0, "the API took appends between kills");
    assert!(r["api"]["stored"].as_u64().unwrap() >= acknowledged);
    assert!(r["proxy"]["turns_stored"].as_u64().unwrap() > 0);
    assert!(r["searches"]["answered"].as_u64().unwrap() > 0);
    let chains = r["chains"].as_array().unwrap();
    assert_eq!(chains.len(), 3, "a chain per stream: {chains:?}");
    for chain in chains {
        assert_eq!(chain["continuous"], true);
        assert!(chain["versions"].as_u64().unwrap() > 0, "{chain}");
    }
    assert_eq!(r["index"]["equal_to_rebuild"], true);
    let restarts = &r["restart_seconds"];
    assert!(restarts["p50"].as_f64().unwrap() > 0.0);
    assert!(restarts["p99"].as_f64().unwrap() >= restarts["p50"].as_f64().unwrap());
    assert!(r["memory_lag_seconds"]["lines"].as_u64().unwrap() > 0);
}

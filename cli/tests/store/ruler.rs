//! `memctl bench ruler --stream`: samples read through a real database on disk, a run
//! killed with SIGKILL mid-sample resumes at the chunk it reached.

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use memagent_store::{Store, GENERAL};

use crate::{data_dir, memctl, run, stderr};

#[test]
fn a_stream_run_resumes_at_its_chunk_after_sigkill() {
    let dir = data_dir("ruler");
    let out = dir.join("results");
    let args = [
        "-v",
        "bench",
        "ruler",
        "--tasks",
        "niah_single",
        "--lengths",
        "512",
        "--samples",
        "1",
        "--modes",
        "memory,general",
        "--stream",
        "bench",
        "--chunk-tokens",
        "96",
        "--memory-tokens",
        "32",
        "--answer-tokens",
        "32",
        "--out",
        out.to_str().unwrap(),
    ];
    let name = "bench/niah_single/512/seed1/C96-M32";

    kill_after_the_second_general_step(&dir, &args, &out, name);
    resume_at_the_cursor(&dir, &args, name);
    // The results name the stream, count its steps and are scored.
    let records: Vec<serde_json::Value> = std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2);
    let modes: Vec<&str> = records
        .iter()
        .map(|r| r["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["memory", "general"]);

    check_the_store(&dir, name, &records);

    // Done: nothing runs again, and the general mode needs a stream.
    let third = run(&dir, &args);
    assert!(third.status.success(), "{}", stderr(&third));
    assert!(
        String::from_utf8_lossy(&third.stdout).contains("0 samples run, 2 resumed"),
        "{}",
        String::from_utf8_lossy(&third.stdout)
    );
    let no_stream = run(
        &dir,
        &[
            "bench",
            "ruler",
            "--modes",
            "general",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(!no_stream.status.success());
    assert!(
        stderr(&no_stream).contains("--stream NAME"),
        "{}",
        stderr(&no_stream)
    );
}

/// Runs the bench and kills it (SIGKILL) once the general memory has committed its
/// second step, before any sample finished.
fn kill_after_the_second_general_step(
    dir: &std::path::Path,
    args: &[&str],
    out: &std::path::Path,
    name: &str,
) {
    let mut child = memctl(dir, args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let lines = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(&format!("{name} general: chunk 1 "));
                seen.push(line);
                if done {
                    break;
                }
            }
            Err(_) => panic!("no second general step in time:\n{}", seen.join("\n")),
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !out.join("results.jsonl").exists()
            || std::fs::read_to_string(out.join("results.jsonl"))
                .unwrap()
                .trim()
                .is_empty(),
        "no sample finished before the kill"
    );
}

/// Runs the bench again: the stream continues at its cursor instead of starting over.
fn resume_at_the_cursor(dir: &std::path::Path, args: &[&str], name: &str) {
    let second = run(dir, args);
    assert!(second.status.success(), "{}", stderr(&second));
    let log = stderr(&second);
    let resumed = log
        .lines()
        .find(|l| l.contains(&format!("stream `{name}` resumes at chunk ")))
        .unwrap_or_else(|| panic!("no resume message:\n{log}"));
    let at: u64 = resumed
        .split("resumes at chunk ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(at >= 2, "{resumed}");
    assert!(
        !log.contains(&format!("{name} general: chunk 0 ")),
        "chunk 0 was read again:\n{log}"
    );
    assert!(
        String::from_utf8_lossy(&second.stdout).contains("2 samples run, 0 resumed"),
        "{}",
        String::from_utf8_lossy(&second.stdout)
    );
}

/// Each chunk read once by the general memory and once by the question's chain, and
/// the records naming the stream with their steps and scores.
fn check_the_store(dir: &std::path::Path, name: &str, records: &[serde_json::Value]) {
    let store = Store::open(dir).unwrap();
    let stream = store.require(name).unwrap();
    let chunks = store.chunks(&stream).unwrap();
    assert!(chunks.len() >= 5, "{} chunks", chunks.len());
    assert_eq!(
        chunks.last().unwrap().end,
        stream.log_len,
        "the whole document was read"
    );
    let general = store.versions(&stream, GENERAL).unwrap();
    assert_eq!(general.len(), chunks.len(), "each chunk read once");
    for (i, v) in general.iter().enumerate() {
        assert_eq!(
            v.chunk,
            Some(i as u64),
            "version {} read chunk {i}",
            v.version
        );
    }
    let questions = store.questions(&stream).unwrap();
    assert_eq!(questions.len(), 1, "one question chain");
    let chain = store.versions(&stream, questions[0].chain).unwrap();
    assert_eq!(chain.len(), chunks.len(), "the question read every chunk");
    assert_eq!(
        questions[0].question,
        records[0]["question"].as_str().unwrap()
    );
    for (record, steps) in records.iter().zip([chain.len(), general.len()]) {
        assert_eq!(record["stream"], name, "{record}");
        assert_eq!(record["steps"], steps, "{record}");
        assert!(record["score"].is_number(), "{record}");
        assert!(record["seconds"].as_f64().unwrap() > 0.0, "{record}");
    }
}

#[test]
fn samples_read_side_by_side_score_as_one_at_a_time() {
    let common = [
        "bench",
        "ruler",
        "--tasks",
        "niah_single",
        "--lengths",
        "256",
        "--samples",
        "2",
        "--chunk-tokens",
        "96",
        "--memory-tokens",
        "32",
        "--answer-tokens",
        "32",
    ];
    // The same samples through the store (memory and general modes) and without it
    // (memory mode), two at a time and one at a time.
    let results = |name: &str, stream: bool, batch: &str| -> Vec<serde_json::Value> {
        let dir = data_dir(name);
        let out = dir.join("results");
        let mut args = common.to_vec();
        args.extend(["--batch", batch, "--out", out.to_str().unwrap()]);
        match stream {
            true => args.extend(["--modes", "memory,general", "--stream", "bench"]),
            false => args.extend(["--modes", "memory"]),
        }
        let o = run(&dir, &args);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut records: Vec<serde_json::Value> =
            std::fs::read_to_string(out.join("results.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        records.sort_by_key(|r| (r["mode"].to_string(), r["seed"].as_u64()));
        if stream {
            let store = Store::open(&dir).unwrap();
            for r in &mut records {
                let stream = store.require(r["stream"].as_str().unwrap()).unwrap();
                let mut chains = vec![GENERAL];
                chains.extend(store.questions(&stream).unwrap().iter().map(|q| q.chain));
                let texts: Vec<Vec<String>> = chains
                    .iter()
                    .map(|&c| {
                        let versions = store.versions(&stream, c).unwrap();
                        versions.into_iter().map(|v| v.text).collect()
                    })
                    .collect();
                r["memories"] = serde_json::json!(texts);
            }
        }
        records
    };
    let same = |a: &[serde_json::Value], b: &[serde_json::Value], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(b) {
            for key in ["mode", "seed", "steps", "answer", "score", "memories"] {
                assert_eq!(x[key], y[key], "{what}: {key} of {x} vs {y}");
            }
        }
    };
    let (batched, alone) = (
        results("ruler-batch2", false, "2"),
        results("ruler-batch1", false, "1"),
    );
    assert_eq!(batched.len(), 2);
    assert!(batched.iter().all(|r| r["steps"].as_u64() > Some(1)));
    same(&batched, &alone, "memory mode without the store");
    let (batched, alone) = (
        results("ruler-stream-batch2", true, "2"),
        results("ruler-stream-batch1", true, "1"),
    );
    assert_eq!(batched.len(), 4);
    assert!(batched
        .iter()
        .all(|r| r["memories"][0].as_array().unwrap().len() > 1));
    same(&batched, &alone, "through the store");
}

//! Crash safety: `memctl ingest` killed with SIGKILL at random moments, restarted each
//! time, never loses or repeats anything.

use std::time::{Duration, Instant};

use memagent_store::{Store, GENERAL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{data_dir, memctl, stderr};

/// A document of many small chunks (24 tokens each).
fn document() -> String {
    let mut text = String::new();
    for i in 0..60 {
        text.push_str(&format!(
            "Entry {i}: the ferry to the north island left on time and the harbour master \
             noted calm water. "
        ));
        if i % 7 == 0 {
            text.push_str("Ünïcode ✓ stays whole.\n");
        }
    }
    text
}

#[test]
fn ingest_survives_sigkill_at_random_moments() {
    let dir = data_dir("crash");
    let file = dir.join("input.txt");
    let doc = document();
    std::fs::write(&file, &doc).unwrap();
    let args = [
        "ingest",
        "log",
        file.to_str().unwrap(),
        "--chunk-tokens",
        "24",
        "--memory-tokens",
        "16",
    ];
    let mut rng = StdRng::seed_from_u64(20261122);
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        assert!(
            Instant::now() < deadline,
            "ingestion did not finish in time"
        );
        let mut child = memctl(&dir, &args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if kills < 24 {
            // Anywhere from during start-up and the first append to mid-step.
            let after = Duration::from_millis(rng.random_range(50..2500));
            let started = Instant::now();
            let mut exited = None;
            while started.elapsed() < after {
                if let Some(status) = child.try_wait().unwrap() {
                    exited = Some(status);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            match exited {
                Some(status) => {
                    assert!(status.success(), "memctl failed on its own: {status}");
                    break;
                }
                None => {
                    child.kill().unwrap(); // SIGKILL
                    child.wait().unwrap();
                    kills += 1;
                }
            }
        } else {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
            break;
        }
    }
    assert!(kills >= 20, "only {kills} kills before the run finished");

    let store = Store::open(&dir).unwrap();
    let stream = store.require("log").unwrap();
    let log = store.read_log(&stream, 0, stream.log_len).unwrap();
    assert_eq!(
        log,
        doc.as_bytes(),
        "the content log equals the input byte for byte"
    );
    let chunks = store.chunks(&stream).unwrap();
    let versions = store.versions(&stream, GENERAL).unwrap();
    assert!(chunks.len() > 30, "{} chunks", chunks.len());
    assert_eq!(versions.len(), chunks.len(), "one version per chunk");
    let mut offset = 0;
    for (i, (chunk, version)) in chunks.iter().zip(&versions).enumerate() {
        assert_eq!(chunk.index, i as u64, "chunk indexes are 0..n");
        assert_eq!(chunk.start, offset, "chunks are contiguous");
        offset = chunk.end;
        assert_eq!(version.version, i as u64 + 1, "versions are 1..n");
        assert_eq!(
            version.parent,
            (i > 0).then_some(i as u64),
            "parent is the previous"
        );
        assert_eq!(
            version.chunk,
            Some(i as u64),
            "version {} consumed chunk {i} once",
            i + 1
        );
    }
    assert_eq!(offset, stream.log_len, "every byte was consumed");
    let cursor = store.cursor(&stream, GENERAL).unwrap();
    assert_eq!(cursor.version, versions.len() as u64);
    assert_eq!(cursor.offset, stream.log_len);
    eprintln!("{kills} kills; {} chunks", chunks.len());
}

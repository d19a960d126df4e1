//! SIGKILL the daemon at random moments while writers keep appending to three watched
//! files (whose steps the daemon decodes in batches): after the last restart and
//! catch-up, each log equals its file and each memory chain is continuous.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memagent_store::{Store, GENERAL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{test_root, wait_for, Daemon, QUICK_STEPS};

/// Appends lines to `file` until `stop`, each line in two writes (a line may be cut
/// anywhere, even inside a character), about one line per `pace` milliseconds; returns
/// how many lines it wrote.
fn writer(
    file: std::path::PathBuf,
    seed: u64,
    pace: std::ops::Range<u64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut out = std::fs::File::options().append(true).open(&file).unwrap();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let line = format!(
                "Entry {i}: the ferry left at {}:{:02} — calm water ✓\n",
                6 + i % 12,
                i % 60
            );
            let cut = rng.random_range(0..line.len());
            out.write_all(&line.as_bytes()[..cut]).unwrap();
            out.write_all(&line.as_bytes()[cut..]).unwrap();
            i += 1;
            // The writer's pace (a workload, not a wait).
            std::thread::sleep(Duration::from_millis(rng.random_range(pace.clone())));
        }
        i
    })
}

#[test]
fn the_daemon_survives_sigkill_while_writers_append() {
    let root = test_root("crash");
    let watched = root.join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let streams = ["journal", "harbour", "ledger"];
    let mut config = String::new();
    for name in streams {
        let file = watched.join(format!("{name}.txt"));
        std::fs::write(&file, format!("Notes of the {name}.\n")).unwrap();
        config.push_str(&format!(
            "[[watch]]\npath = \"{}\"\nstream = \"{name}\"\n",
            file.display()
        ));
    }
    let mut daemon = Daemon::start(&root, &config, &QUICK_STEPS);

    // The writers: about six lines a second to the journal, three to each other file.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = streams
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let pace = if i == 0 { 100..250 } else { 200..450 };
            writer(
                watched.join(format!("{name}.txt")),
                7 + i as u64,
                pace,
                stop.clone(),
            )
        })
        .collect();

    let mut rng = StdRng::seed_from_u64(20261122);
    for kill in 0..10 {
        let after = Duration::from_millis(rng.random_range(300..1500));
        let started = std::time::Instant::now();
        wait_for("the kill moment", after + Duration::from_secs(5), || {
            (started.elapsed() >= after).then_some(())
        });
        assert!(
            daemon.is_running(),
            "the daemon died on its own before kill {kill}:\n{}",
            daemon.log_text()
        );
        daemon.kill();
        daemon.spawn();
    }
    stop.store(true, Ordering::Relaxed);
    let lines: Vec<usize> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let contents: Vec<Vec<u8>> = streams
        .iter()
        .map(|name| std::fs::read(watched.join(format!("{name}.txt"))).unwrap())
        .collect();
    for (name, content) in streams.iter().zip(&contents) {
        daemon.wait_caught_up(name, content.len() as u64, Duration::from_secs(600));
    }
    assert!(daemon.stop().success());

    let store = Store::open(&root.join("data")).unwrap();
    for (name, content) in streams.iter().zip(&contents) {
        let stream = store.require(name).unwrap();
        let log = store.read_log(&stream, 0, stream.log_len).unwrap();
        assert!(
            &log == content,
            "{name}: the content log equals the file byte for byte"
        );
        let chunks = store.chunks(&stream).unwrap();
        let versions = store.versions(&stream, GENERAL).unwrap();
        assert_eq!(
            versions.len(),
            chunks.len(),
            "{name}: one version per chunk"
        );
        let mut offset = 0;
        for (i, (chunk, version)) in chunks.iter().zip(&versions).enumerate() {
            assert_eq!(chunk.index, i as u64);
            assert_eq!(chunk.start, offset, "{name}: chunks are contiguous");
            offset = chunk.end;
            assert_eq!(version.version, i as u64 + 1);
            assert_eq!(
                version.parent,
                (i > 0).then_some(i as u64),
                "{name}: parents are consecutive"
            );
            assert_eq!(version.chunk, Some(i as u64), "{name}: no chunk read twice");
        }
        assert_eq!(
            offset, stream.log_len,
            "{name}: every byte was read into memory"
        );
        eprintln!("{name}: {} bytes, {} chunks", content.len(), chunks.len());
    }
    eprintln!("10 kills; {lines:?} lines");
}

//! SIGKILL the daemon at random moments while a writer keeps appending: after the last
//! restart and catch-up, the log equals the file and the memory chain is continuous.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memagent_store::{Store, GENERAL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{test_root, wait_for, Daemon};

#[test]
fn the_daemon_survives_sigkill_while_a_writer_appends() {
    let root = test_root("crash");
    let watched = root.join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let file = watched.join("journal.txt");
    std::fs::write(&file, "Journal of the north pier.\n").unwrap();
    let config = format!(
        "[[watch]]\npath = \"{}\"\nstream = \"journal\"\n",
        file.display()
    );
    let mut daemon = Daemon::start(
        &root,
        &config,
        &[
            "--idle-seconds",
            "0.5",
            "--chunk-tokens",
            "64",
            "--memory-tokens",
            "24",
        ],
    );

    // The writer: about six lines a second, each in two pieces (a line may be cut anywhere,
    // even inside a character).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, file) = (stop.clone(), file.clone());
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(7);
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
                // The writer's pace (a workload, not a wait): about six lines a second.
                std::thread::sleep(Duration::from_millis(rng.random_range(100..250)));
            }
            i
        })
    };

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
    let lines = writer.join().unwrap();
    let content = std::fs::read(&file).unwrap();
    daemon.wait_caught_up("journal", content.len() as u64, Duration::from_secs(600));
    assert!(daemon.stop().success());

    let store = Store::open(&root.join("data")).unwrap();
    let stream = store.require("journal").unwrap();
    let log = store.read_log(&stream, 0, stream.log_len).unwrap();
    assert!(
        log == content,
        "the content log equals the file byte for byte"
    );
    let chunks = store.chunks(&stream).unwrap();
    let versions = store.versions(&stream, GENERAL).unwrap();
    assert_eq!(versions.len(), chunks.len(), "one version per chunk");
    let mut offset = 0;
    for (i, (chunk, version)) in chunks.iter().zip(&versions).enumerate() {
        assert_eq!(chunk.index, i as u64);
        assert_eq!(chunk.start, offset, "chunks are contiguous");
        offset = chunk.end;
        assert_eq!(version.version, i as u64 + 1);
        assert_eq!(
            version.parent,
            (i > 0).then_some(i as u64),
            "parents are consecutive"
        );
        assert_eq!(version.chunk, Some(i as u64), "no chunk read twice");
    }
    assert_eq!(offset, stream.log_len, "every byte was read into memory");
    eprintln!(
        "10 kills; {lines} lines, {} bytes, {} chunks",
        content.len(),
        chunks.len()
    );
}

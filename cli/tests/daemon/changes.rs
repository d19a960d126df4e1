//! How files change: atomic saves, renames, rewrites, deletions, and changes made while
//! the daemon was down.

use std::time::Duration;

use memagent_store::Store;

use crate::{append, test_root, wait_for, Daemon};

#[test]
fn saves_renames_rewrites_and_deletions_keep_the_stream_right() {
    let root = test_root("changes");
    let dir = root.join("notes");
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "[[watch]]\npath = \"{}\"\nstream = \"notes\"\n",
        dir.display()
    );
    let mut daemon = Daemon::start(&root, &config, &["--idle-seconds", "1"]);
    let bytes = |daemon: &Daemon, n: u64| {
        wait_for(
            &format!("`notes` at {n} bytes"),
            Duration::from_secs(60),
            || {
                daemon
                    .stream_status("notes")
                    .filter(|s| s["log_bytes"].as_u64() == Some(n))
            },
        )
    };

    let a = dir.join("a.md");
    std::fs::write(&a, "alpha\n").unwrap();
    bytes(&daemon, 6);
    // An editor's atomic save: a hidden temporary file renamed over the original.
    let tmp = dir.join(".a.md.swp-123");
    std::fs::write(&tmp, "alpha\nbeta\n").unwrap();
    std::fs::rename(&tmp, &a).unwrap();
    bytes(&daemon, 11);
    // A rename keeps the file's place.
    let b = dir.join("b.md");
    std::fs::rename(&a, &b).unwrap();
    append(&b, "gamma\n");
    bytes(&daemon, 17);
    // A rewrite (shorter than what was read) is read whole as a revision.
    std::fs::write(&b, "new start\n").unwrap();
    let marker = "\n[b.md was rewritten; revision 1 follows]\n";
    bytes(&daemon, 17 + (marker.len() + 10) as u64);
    // Deleting the file keeps the memory.
    let before = daemon.wait_caught_up(
        "notes",
        17 + (marker.len() + 10) as u64,
        Duration::from_secs(120),
    );
    std::fs::remove_file(&b).unwrap();
    wait_for("the deletion in the log", Duration::from_secs(30), || {
        daemon
            .log_text()
            .contains("b.md: removed; what was read from it stays in memory")
            .then_some(())
    });
    let after = daemon.stream_status("notes").unwrap();
    assert_eq!(after["version"], before["version"], "{after}");
    assert!(daemon.stop().success());

    // While the daemon is down: a file grows, another appears; the start-up scan reads
    // exactly the new bytes.
    let c = dir.join("c.md");
    std::fs::write(&c, "delta\n").unwrap();
    daemon.spawn();
    let total = 17 + (marker.len() + 10) as u64 + 6;
    bytes(&daemon, total);
    assert!(daemon.stop().success());
    append(&c, "epsilon\n");
    daemon.spawn();
    bytes(&daemon, total + 8);
    daemon.wait_caught_up("notes", total + 8, Duration::from_secs(120));
    assert!(daemon.stop().success());

    let log = daemon.log_text();
    assert!(log.contains("b.md: renamed from"), "{log}");
    assert!(
        log.contains("b.md: truncated since it was read; reading it whole as revision 1"),
        "{log}"
    );
    let store = Store::open(&root.join("data")).unwrap();
    let stream = store.require("notes").unwrap();
    let text = String::from_utf8(store.read_log(&stream, 0, stream.log_len).unwrap()).unwrap();
    assert_eq!(
        text,
        format!("alpha\nbeta\ngamma\n{marker}new start\ndelta\nepsilon\n")
    );
}

#[test]
fn a_file_larger_than_one_read_goes_in_piece_by_piece_byte_for_byte() {
    let root = test_root("big-file");
    let dir = root.join("notes");
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "[[watch]]\npath = \"{}\"\nstream = \"big\"\n",
        dir.display()
    );
    // About 18 MB of lines, more than two reads' worth, with a three-byte character
    // across every 8 MiB boundary a read could end on.
    let mut content = Vec::new();
    let mut n = 0;
    while content.len() < 18_000_000 {
        let at = content.len();
        if (at + 40) >> 23 != at >> 23 {
            let boundary = (at + 40) >> 23 << 23;
            content.resize(boundary - 1, b'x');
            content.extend_from_slice("€ ".as_bytes());
        }
        content.extend_from_slice(format!("line {n}: the lighthouse keeps its light\n").as_bytes());
        n += 1;
    }
    let file = dir.join("big.txt");
    std::fs::write(&file, &content).unwrap();
    let mut daemon = Daemon::start(&root, &config, &["--idle-seconds", "3600"]);
    let bytes = |daemon: &Daemon, n: u64| {
        wait_for(
            &format!("`big` at {n} bytes"),
            Duration::from_secs(120),
            || {
                daemon
                    .stream_status("big")
                    .filter(|s| s["log_bytes"].as_u64() == Some(n))
            },
        )
    };
    bytes(&daemon, content.len() as u64);
    // Read on after it: the prefix is checked piece by piece too.
    let more = "the last line\n";
    append(&file, more);
    content.extend_from_slice(more.as_bytes());
    bytes(&daemon, content.len() as u64);
    assert!(daemon.stop().success());

    let store = Store::open(&root.join("data")).unwrap();
    let stream = store.require("big").unwrap();
    assert!(store.read_log(&stream, 0, stream.log_len).unwrap() == content);
    // Each read is its own append with where in the file it starts.
    let mut starts = Vec::new();
    let mut at = stream.log_len;
    while let Some((start, segment)) = store.segment_at(&stream, at - 1).unwrap() {
        let lines = content[..start as usize]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        assert_eq!(segment.first_line, lines + 1, "the piece at byte {start}");
        starts.push(start);
        if start == 0 {
            break;
        }
        at = start;
    }
    assert!(starts.len() >= 4, "pieces start at {starts:?}");
}

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

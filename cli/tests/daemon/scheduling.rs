//! New text goes ahead of a backlog: with a dozen streams working through several chunks
//! each, a chunk appended to a stream that had caught up is read in the next batch, not
//! after a whole round of the backlog.

use std::time::Duration;

use crate::{append, test_root, wait_for, Daemon, QUICK_STEPS};

const BACKLOG: usize = 12;
/// Steps one batch takes at most (the daemon's `MAX_BATCH`).
const BATCH: usize = 4;

fn lines(tag: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "Note {i} of {tag}: the ferry to the island leaves at {} am.\n",
                i % 12 + 1
            )
        })
        .collect()
}

/// Lines of the daemon's log that record a committed step of a backlog stream.
fn backlog_steps(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("backlog-") && l.contains(": chunk ") && l.contains("-> memory v"))
        .count()
}

#[test]
fn an_append_to_a_caught_up_stream_goes_ahead_of_the_backlog() {
    let root = test_root("scheduling");
    let watched = root.join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    // About five 64-token chunks per backlog stream; one short line for the chat.
    for i in 0..BACKLOG {
        let name = format!("backlog-{i:02}.txt");
        std::fs::write(watched.join(name), lines(&format!("stream {i}"), 24)).unwrap();
    }
    let chat = watched.join("chat.txt");
    std::fs::write(&chat, "Priya: my sister moved to Porto.\n").unwrap();
    let config = format!("[[watch]]\npath = \"{}\"\n", watched.display());
    let mut daemon = Daemon::start(&root, &config, &QUICK_STEPS);
    let row = |status: &serde_json::Value, stream: &str| {
        status["streams"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["stream"] == stream))
            .cloned()
            .unwrap_or_default()
    };
    let version = |status: &serde_json::Value, stream: &str| {
        row(status, stream)["version"].as_u64().unwrap_or(0)
    };
    // Every stream has taken a first step (new streams are served in turn), and the chat
    // has read everything it has: both read from one status, so that a step committed
    // between two reads cannot pair a caught-up chat with its version before.
    let chat_version = wait_for(
        "a first step of every stream",
        Duration::from_secs(600),
        || {
            let status = daemon.try_status()?;
            let all = (0..BACKLOG).all(|i| version(&status, &format!("backlog-{i:02}.txt")) >= 1);
            let caught_up = row(&status, "chat.txt")["pending_bytes"] == 0;
            (all && caught_up).then(|| version(&status, "chat.txt"))
        },
    );
    assert!(chat_version >= 1);
    append(&chat, &lines("the chat", 8));
    // Counted once the text is in the stream: the batch formed next sees it.
    let bytes = std::fs::metadata(&chat).unwrap().len();
    wait_for(
        "the appended text in the stream",
        Duration::from_secs(60),
        || {
            let row = daemon.stream_status("chat.txt")?;
            (row["log_bytes"].as_u64() == Some(bytes)).then_some(())
        },
    );
    let before = backlog_steps(&daemon.log_text());
    wait_for("the chat's next step", Duration::from_secs(600), || {
        let status = daemon.try_status()?;
        (version(&status, "chat.txt") > chat_version).then_some(())
    });
    let status = daemon.try_status().expect("status");
    // The step is logged just after its commit, which the status already shows.
    let logged = |l: &str| {
        l.contains("chat.txt: chunk ") && l.contains(&format!("-> memory v{}", chat_version + 1))
    };
    let log = wait_for(
        "the chat's step in the log",
        Duration::from_secs(60),
        || {
            let log = daemon.log_text();
            log.lines().any(logged).then_some(log)
        },
    );
    assert!(daemon.stop().success());
    // Backlog steps committed before the chat's: what was left of the batch under way
    // when the text came, and the others of the chat's own batch.
    let chat_step = log
        .lines()
        .position(logged)
        .unwrap_or_else(|| panic!("the chat's step is logged:\n{log}"));
    let ahead = backlog_steps(&log.lines().take(chat_step).collect::<Vec<_>>().join("\n")) - before;
    assert!(
        ahead < 2 * BATCH,
        "{ahead} backlog steps went ahead of the chat's new text:\n{log}"
    );
    // The backlog was still there to go ahead of: not every stream had caught up.
    let still = (0..BACKLOG)
        .filter(|i| {
            status["streams"].as_array().is_some_and(|rows| {
                rows.iter().any(|r| {
                    r["stream"] == format!("backlog-{i:02}.txt").as_str() && r["pending_bytes"] != 0
                })
            })
        })
        .count();
    assert!(
        still >= BACKLOG / 2,
        "only {still} backlog streams still reading"
    );
}

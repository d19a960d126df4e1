//! Standing questions: a watch's `ask` is answered from every new memory version of its
//! stream, the answers are stored with the version, listed, and kept across a restart.

use std::time::Duration;

use serde_json::Value;

use crate::{append, model_path, stderr, test_root, Daemon};

fn answers(daemon: &Daemon) -> Vec<Value> {
    let out = daemon.memctl(&["answers", "notes", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn standing_questions_are_answered_per_version_and_kept() {
    let root = test_root("answers");
    let notes = root.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let question = "Who is the harbour master?";
    // The configuration as `memctl watch add --ask` writes it.
    let config = root.join("written.toml");
    let add = std::process::Command::new(env!("CARGO_BIN_EXE_memctl"))
        .arg("--model")
        .arg(model_path())
        .arg("--config")
        .arg(&config)
        .args(["watch", "add"])
        .arg(&notes)
        .args(["--stream", "notes", "--ask", question])
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", stderr(&add));
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        text.contains("ask = [\"Who is the harbour master?\"]"),
        "{text}"
    );

    let file = notes.join("harbour.txt");
    // The default 135M model answers from this pair (as in the query test).
    append(&file, "Harbour notes for this week.\n");
    let mut daemon = Daemon::start(&root, &text, &["--idle-seconds", "1"]);
    daemon.wait_caught_up("notes", 29, Duration::from_secs(120));
    let fact = "The harbour master is called Ines Duarte.\n";
    append(&file, fact);
    let row = daemon.wait_caught_up("notes", 29 + fact.len() as u64, Duration::from_secs(120));
    assert_eq!(row["version"], 2, "{row}");
    // The answer to version 2 is stored right after its step.
    let listed = crate::wait_for("the answer to version 2", Duration::from_secs(60), || {
        let listed = answers(&daemon);
        (listed.len() == 2).then_some(listed)
    });
    for (answer, version) in listed.iter().zip([1, 2]) {
        assert_eq!(answer["version"], version, "{listed:#?}");
        assert_eq!(answer["question"], question, "{listed:#?}");
    }
    let latest = listed[1]["answer"].as_str().unwrap();
    assert!(
        latest.contains("Ines") || latest.contains("Duarte"),
        "{listed:#?}\n{}",
        daemon.log_text()
    );

    // Kept across a restart, through the daemon and without it.
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    assert_eq!(answers(&daemon), listed);
    daemon.spawn();
    assert_eq!(answers(&daemon), listed);
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

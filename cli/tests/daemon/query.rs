//! A fact appended to a watched file is answered through the socket; the API serves
//! several clients at once; the socket is its owner's alone; SIGTERM stops cleanly.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::{append, stderr, stdout, test_root, Daemon};

#[test]
fn an_appended_fact_is_answered_through_the_socket() {
    let root = test_root("query");
    let notes = root.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let file = notes.join("harbour.txt");
    // The default 135M model answers from this pair; after other first lines it loses the
    // fact (a limit of the model, measured with `memctl ingest`, not of the daemon).
    append(&file, "Harbour notes for this week.\n");
    let config = format!(
        "[[watch]]\npath = \"{}\"\nstream = \"notes\"\n",
        notes.display()
    );
    let mut daemon = Daemon::start(&root, &config, &["--idle-seconds", "1"]);

    // The start-up scan reads what was there before the daemon.
    let first = daemon.wait_caught_up("notes", 29, Duration::from_secs(120));
    assert_eq!(first["version"], 1, "{first}");

    let fact = "The harbour master is called Ines Duarte.\n";
    append(&file, fact);
    let total = 29 + fact.len() as u64;
    let row = daemon.wait_caught_up("notes", total, Duration::from_secs(120));
    assert_eq!(row["version"], 2, "a second memory version: {row}");
    assert!(row["lag_p50_seconds"].as_f64().is_some(), "{row}");

    // The database is the daemon's: these go through its socket.
    let socket = daemon.data.join("memagent.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {:o}", mode & 0o777);
    two_clients_at_once(&daemon);
    // Passages ranked again by the question's likelihood, on the daemon's model.
    let ranked = daemon.memctl(&[
        "query",
        "notes",
        "Who is the harbour master?",
        "--rerank",
        "3",
        "--json",
    ]);
    assert!(ranked.status.success(), "{}", stderr(&ranked));
    let ranked: serde_json::Value = serde_json::from_slice(&ranked.stdout).unwrap();
    let passages = ranked["passages"].as_array().unwrap();
    assert!(
        !passages.is_empty() && passages.iter().all(|p| p["likelihood"].as_f64().is_some()),
        "{ranked}"
    );
    let questions = ["Who is the harbour master?", "What are these notes for?"];
    let answers = two_deep_questions(&daemon, questions);
    let history = daemon.memctl(&["memory", "history", "notes", "--json"]);
    assert!(history.status.success(), "{}", stderr(&history));
    let versions: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!(versions.as_array().map(Vec::len), Some(2), "{versions}");
    let listed = daemon.memctl(&["streams", "list"]);
    assert!(stdout(&listed).contains("notes"), "{}", stderr(&listed));

    ingest_through_the_daemon(&daemon);
    daemon.wait_caught_up("inbox", 25, Duration::from_secs(120));
    // Each memory line's source, through the daemon: the same as read directly below.
    let sourced = daemon.memctl(&["memory", "show", "notes", "--sources", "--json"]);
    assert!(sourced.status.success(), "{}", stderr(&sourced));
    let sourced: serde_json::Value = serde_json::from_slice(&sourced.stdout).unwrap();
    assert!(
        !sourced["sources"].as_array().unwrap().is_empty(),
        "{sourced}"
    );

    // Commands that need the database to themselves say who holds it.
    let export = daemon.memctl(&["export", "notes"]);
    assert!(!export.status.success());
    assert!(
        stderr(&export).contains("stop the daemon"),
        "{}",
        stderr(&export)
    );

    let status = daemon.stop();
    assert!(status.success(), "SIGTERM: {status}\n{}", daemon.log_text());
    assert!(!socket.exists(), "the socket is removed at a clean stop");
    // Without a daemon the same commands open the database directly.
    let show = daemon.memctl(&["memory", "show", "notes"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let at = sourced["version"].to_string();
    let direct = daemon.memctl(&[
        "memory",
        "show",
        "notes",
        "--sources",
        "--json",
        "--at",
        &at,
    ]);
    assert!(direct.status.success(), "{}", stderr(&direct));
    let direct: serde_json::Value = serde_json::from_slice(&direct.stdout).unwrap();
    assert_eq!(direct["sources"], sourced["sources"]);
    // The first question's chain alone: nothing new to read, the same answer.
    let alone = daemon.memctl(&["query", "notes", questions[0], "--deep", "--json"]);
    assert!(alone.status.success(), "{}", stderr(&alone));
    let alone: serde_json::Value = serde_json::from_slice(&alone.stdout).unwrap();
    assert_eq!(alone["chunks_read"], 0, "{alone}");
    assert_eq!(alone["chain"], answers[0]["chain"], "{alone}");
    assert_eq!(alone["answer"], answers[0]["answer"], "{alone}");
    let status = daemon.memctl(&["daemon", "status"]);
    assert_eq!(status.status.code(), Some(1));
    assert!(
        stderr(&status).contains("no daemon is running"),
        "{}",
        stderr(&status)
    );
}

/// Two clients ask at once through the socket; both get the fact.
fn two_clients_at_once(daemon: &Daemon) {
    let ask = |daemon: &Daemon| {
        daemon
            .command()
            .args(["query", "notes", "Who is the harbour master?"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (ask(daemon), ask(daemon));
    for out in [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()] {
        assert!(out.status.success(), "{}", stderr(&out));
        let answer = stdout(&out);
        assert!(
            answer.contains("Ines") || answer.contains("Duarte"),
            "answer: {answer}\n{}",
            daemon.log_text()
        );
    }
}

/// Two deep questions at once: each keeps its own chain, read side by side.
fn two_deep_questions(daemon: &Daemon, questions: [&str; 2]) -> Vec<serde_json::Value> {
    let deep = daemon.memctl(&[
        "query",
        "notes",
        questions[0],
        questions[1],
        "--deep",
        "--json",
    ]);
    assert!(deep.status.success(), "{}", stderr(&deep));
    let deep: serde_json::Value = serde_json::from_slice(&deep.stdout).unwrap();
    let answers = deep["answers"]
        .as_array()
        .unwrap_or_else(|| panic!("{deep}"));
    assert_eq!(answers.len(), 2, "{deep}");
    for (answer, question) in answers.iter().zip(questions) {
        assert_eq!(answer["question"], question, "{deep}");
        assert_eq!(answer["chunks_read"], 2, "both chunks read: {deep}");
        assert_eq!(answer["version"], 2, "{deep}");
    }
    assert_ne!(answers[0]["chain"], answers[1]["chain"], "{deep}");
    answers.clone()
}

/// `memctl ingest` hands the text to the daemon, which reads it in.
fn ingest_through_the_daemon(daemon: &Daemon) {
    let ingest = daemon
        .command()
        .args(["ingest", "inbox", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut ingest = ingest;
        ingest
            .stdin
            .take()
            .unwrap()
            .write_all(b"Buy rope for the dinghy.\n")
            .unwrap();
        let out = ingest.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

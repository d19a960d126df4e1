//! `memctl ingest`, `query --at`, `memory show|history|diff|edit|rollback`, `streams`
//! and the lock, as real processes.

use std::io::Write;
use std::process::Stdio;

use serde_json::Value;

use crate::{data_dir, memctl, run, stderr};

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_writer_is_the_one_the_model_s_adapter_was_trained_for() {
    let dir = data_dir("writer");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "Ines runs the harbour office. It opens on Monday.\n").unwrap();
    let template = |stream: &str, extra: &[&str]| {
        let args = [
            &["ingest", stream, file.to_str().unwrap(), "--json"][..],
            extra,
        ]
        .concat();
        json(&run(&dir, &args));
        let history = json(&run(&dir, &["memory", "history", stream, "--json"]));
        history[0]["template_id"].as_str().unwrap().to_string()
    };
    // scripts/fetch-model installs the default model's adapter, trained for the line
    // writer, beside it.
    assert_eq!(template("shipped", &[]), "memagent-general-lines");
    assert_eq!(
        template("base", &["--adapter", "none"]),
        "memagent-general-update"
    );
    assert_eq!(
        template("chosen", &["--writer", "rewrite"]),
        "memagent-general-update"
    );
}

#[test]
fn memory_versions_can_be_queried_compared_edited_and_rolled_back() {
    let dir = data_dir("commands");
    let file = dir.join("notes.txt");
    std::fs::write(
        &file,
        "Ines runs the harbour office. It opens on Monday.\n".repeat(6),
    )
    .unwrap();
    let ingest = [
        "ingest",
        "notes",
        file.to_str().unwrap(),
        "--chunk-tokens",
        "48",
        "--memory-tokens",
        "32",
        "--writer",
        "rewrite",
        "--json",
    ];
    let first = json(&run(&dir, &ingest));
    let n = first["version"].as_u64().unwrap();
    assert!(n >= 2, "{first:#}");
    assert_eq!(first["pending_bytes"], 0);
    // The same file again appends nothing and reads nothing.
    let again = json(&run(&dir, &ingest));
    assert_eq!(again["appended_bytes"], 0);
    assert_eq!(again["version"], n);

    let history = json(&run(&dir, &["memory", "history", "notes", "--json"]));
    let versions = history.as_array().unwrap();
    assert_eq!(versions.len() as u64, n);
    assert_eq!(versions[1]["parent"], 1);
    assert_eq!(versions[0]["template_id"], "memagent-general-update");
    assert_eq!(versions[0]["author"], "model");

    // --at answers from an older memory.
    let q = json(&run(
        &dir,
        &[
            "query",
            "notes",
            "Who runs the harbour office?",
            "--at",
            "1",
            "--json",
            "--answer-tokens",
            "24",
        ],
    ));
    assert_eq!(q["version"], 1);
    assert!(!q["answer"].as_str().unwrap().is_empty());
    let o = run(&dir, &["query", "notes", "Who?", "--at", "99"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no memory version 99"),
        "{}",
        stderr(&o)
    );

    // Edit from stdin: a new version by a person.
    let mut child = memctl(&dir, &["memory", "edit", "notes"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("USER", "ada")
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Ines runs the office.\nOpens Monday.\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let edited = json(&run(&dir, &["memory", "show", "notes", "--json"]));
    assert_eq!(edited["version"], n + 1);
    assert_eq!(edited["parent"], n);
    assert_eq!(edited["text"], "Ines runs the office.\nOpens Monday.\n");
    assert_eq!(edited["author"]["person"]["name"], "ada");

    let diff = stdout(&run(&dir, &["memory", "diff", "notes"]));
    assert!(
        diff.contains(&format!("--- v{n}")) && diff.contains(&format!("+++ v{}", n + 1)),
        "{diff}"
    );
    assert!(diff.contains("+Opens Monday."), "{diff}");

    // Rollback adds a version equal to an old one; history is kept.
    let o = run(&dir, &["memory", "rollback", "notes", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let latest = json(&run(&dir, &["memory", "show", "notes", "--json"]));
    let v1 = json(&run(
        &dir,
        &["memory", "show", "notes", "--at", "1", "--json"],
    ));
    assert_eq!(latest["version"], n + 2);
    assert_eq!(latest["text"], v1["text"]);
    let history = json(&run(&dir, &["memory", "history", "notes", "--json"]));
    assert_eq!(history.as_array().unwrap().len() as u64, n + 2);

    let list = json(&run(&dir, &["streams", "list", "--json"]));
    assert_eq!(list[0]["stream"], "notes");
    assert_eq!(list[0]["version"], n + 2);
    let o = run(&dir, &["streams", "rm", "notes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&dir, &["memory", "show", "notes"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no stream named `notes`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_second_memctl_gets_the_lock_error_with_the_holders_pid() {
    let dir = data_dir("lock");
    let file = dir.join("big.txt");
    std::fs::write(&file, "The tide comes in and goes out again. ".repeat(400)).unwrap();
    // A long ingest holds the database while the second command runs.
    let mut holder = memctl(
        &dir,
        &[
            "ingest",
            "s",
            file.to_str().unwrap(),
            "--chunk-tokens",
            "32",
            "--memory-tokens",
            "32",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let lock = dir.join("lock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let expected = format!("in use by process {}", holder.id());
    let mut seen = String::new();
    while std::time::Instant::now() < deadline {
        let pid_written =
            std::fs::read_to_string(&lock).is_ok_and(|p| p.trim() == holder.id().to_string());
        if pid_written {
            let o = run(&dir, &["streams", "list"]);
            seen = stderr(&o);
            if seen.contains(&expected) {
                assert_eq!(o.status.code(), Some(1));
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(seen.contains(&expected), "{seen}");
}

#[test]
fn export_then_import_round_trips_a_stream() {
    let dir = data_dir("export");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "Ada likes green tea. Meeting on Friday.\n".repeat(5)).unwrap();
    let o = run(
        &dir,
        &[
            "ingest",
            "notes",
            file.to_str().unwrap(),
            "--chunk-tokens",
            "40",
            "--memory-tokens",
            "24",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let exported = run(&dir, &["export", "notes"]);
    assert!(exported.status.success(), "{}", stderr(&exported));
    let lines = stdout(&exported);
    assert!(
        lines.lines().next().unwrap().contains(r#""type":"stream""#),
        "{lines}"
    );
    assert!(lines.contains(r#""type":"version""#) && lines.contains(r#""type":"chunk""#));

    let mut child = memctl(&dir, &["import", "-", "--stream", "copy"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let again = stdout(&run(&dir, &["export", "copy"]));
    assert_eq!(
        again.lines().skip(1).collect::<Vec<_>>(),
        lines.lines().skip(1).collect::<Vec<_>>(),
        "every record but the name survives the round trip"
    );
    // Importing over an existing stream, and a malformed line, are clear errors.
    let export_file = dir.join("notes.jsonl");
    std::fs::write(&export_file, &lines).unwrap();
    let o = run(&dir, &["import", export_file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    std::fs::write(&export_file, format!("{lines}{{\"type\": \"nonsense\"}}\n")).unwrap();
    let o = run(
        &dir,
        &["import", export_file.to_str().unwrap(), "--stream", "x"],
    );
    assert_eq!(o.status.code(), Some(1));
    let line = lines.lines().count() + 1;
    assert!(
        stderr(&o).contains(&format!("line {line}")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn deep_query_reads_only_chunks_that_arrived_since_it_last_ran() {
    let dir = data_dir("deep");
    let file = dir.join("notes.txt");
    let first = "The harbour office moved to Pier Street. The ferry leaves at dawn. ".repeat(4);
    std::fs::write(&file, &first).unwrap();
    let ingest = [
        "ingest",
        "notes",
        file.to_str().unwrap(),
        "--chunk-tokens",
        "40",
        "--memory-tokens",
        "32",
    ];
    assert!(run(&dir, &ingest).status.success());
    let history = json(&run(&dir, &["memory", "history", "notes", "--json"]));
    let chunks = history.as_array().unwrap().len() as u64;
    let deep = [
        "query",
        "notes",
        "Where is the harbour office?",
        "--deep",
        "--json",
        "--chunk-tokens",
        "40",
        "--memory-tokens",
        "32",
        "--answer-tokens",
        "24",
    ];
    let a = json(&run(&dir, &deep));
    assert_eq!(a["chain"], 1);
    assert_eq!(
        a["chunks_read"], chunks,
        "the first deep query reads every chunk"
    );
    assert_eq!(a["version"], chunks);
    assert_eq!(a["template"]["id"], "memagent-final-boxed");
    let b = json(&run(&dir, &deep));
    assert_eq!(b["chunks_read"], 0, "asking again reads nothing new");
    assert_eq!(b["version"], chunks);

    std::fs::write(
        &file,
        format!("{first}A new cafe opened beside the harbour office.\n"),
    )
    .unwrap();
    assert!(run(&dir, &ingest).status.success());
    let history = json(&run(&dir, &["memory", "history", "notes", "--json"]));
    let now = history.as_array().unwrap().len() as u64;
    assert!(now > chunks);
    let c = json(&run(&dir, &deep));
    assert_eq!(c["chunks_read"], now - chunks, "only the new chunks");
    assert_eq!(c["version"], now);
    // The general memory chain is untouched by the question's chain.
    assert_eq!(
        json(&run(&dir, &["memory", "show", "notes", "--json"]))["version"],
        now
    );
}

#[test]
fn several_questions_are_answered_together_as_each_alone() {
    let file_text = "Ines runs the harbour office on Pier Street. The ferry leaves at dawn. \
                     Rope is stored in shed four. "
        .repeat(3);
    let questions = [
        "Where is the harbour office?",
        "When does the ferry leave?",
        "Where is the rope stored?",
    ];
    let loop_args = [
        "--chunk-tokens",
        "40",
        "--memory-tokens",
        "32",
        "--answer-tokens",
        "24",
    ];
    let setup = |name: &str| {
        let dir = data_dir(name);
        let file = dir.join("notes.txt");
        std::fs::write(&file, &file_text).unwrap();
        let mut ingest = vec!["ingest", "notes", file.to_str().unwrap()];
        ingest.extend(&loop_args[..4]);
        assert!(run(&dir, &ingest).status.success());
        dir
    };
    let query = |dir: &std::path::Path, questions: &[&str], deep: bool| {
        let mut args = vec!["query", "notes"];
        args.extend(questions);
        args.push("--json");
        if deep {
            args.push("--deep");
        }
        args.extend(&loop_args);
        json(&run(dir, &args))
    };
    let together = setup("questions-together");
    let alone = setup("questions-alone");

    // From the general memory: one batch of answers, each as asked alone.
    let batch = query(&together, &questions, false);
    assert_eq!(batch["stream"], "notes");
    let answers = batch["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 3, "{batch}");
    for (answer, question) in answers.iter().zip(questions) {
        let one = query(&alone, &[question], false);
        assert_eq!(answer["question"], question);
        assert_eq!(answer["answer"], one["answer"], "{question}");
        assert_eq!(answer["version"], one["version"]);
    }

    // Deep: the chains read side by side end where each chain alone ends. The second
    // question is asked twice and read once.
    let mut asked = questions.to_vec();
    asked.push(questions[1]);
    let batch = query(&together, &asked, true);
    let answers = batch["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 4, "{batch}");
    assert_eq!(
        answers[1], answers[3],
        "a repeated question gets the same answer"
    );
    let history = json(&run(&together, &["memory", "history", "notes", "--json"]));
    let chunks = history.as_array().unwrap().len() as u64;
    for (answer, question) in answers.iter().zip(questions) {
        let one = query(&alone, &[question], true);
        assert_eq!(answer["question"], question);
        assert_eq!(answer["chunks_read"], chunks, "{answer}");
        assert_eq!(one["chunks_read"], chunks, "{one}");
        assert_eq!(
            answer["chain"], one["chain"],
            "chains are numbered as asked"
        );
        assert_eq!(answer["answer"], one["answer"], "{question}");
    }
    let (a, b) = (
        memagent_store::Store::open(&together).unwrap(),
        memagent_store::Store::open(&alone).unwrap(),
    );
    let (sa, sb) = (a.require("notes").unwrap(), b.require("notes").unwrap());
    for chain in 1..=3 {
        let texts = |store: &memagent_store::Store, stream: &memagent_store::StreamRecord| {
            store
                .versions(stream, chain)
                .unwrap()
                .into_iter()
                .map(|v| v.text)
                .collect::<Vec<String>>()
        };
        let (ta, tb) = (texts(&a, &sa), texts(&b, &sb));
        assert_eq!(ta.len() as u64, chunks);
        assert_eq!(ta, tb, "chain {chain}: every memory version as alone");
    }
}

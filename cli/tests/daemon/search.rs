//! Recall in the daemon: text is searchable as soon as it is appended, apart from memory
//! steps; the API's search and its errors as JSON; and SIGKILL while indexing, after
//! which the daemon's results equal a fresh rebuild's.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::{append, stderr, stdout, test_root, wait_for, Daemon};

/// One HTTP request over the daemon's socket: the status and the body as JSON.
fn request(daemon: &Daemon, method: &str, path: &str, body: &[u8], kind: &str) -> (u16, Value) {
    let mut socket = UnixStream::connect(daemon.data.join("memagent.sock")).unwrap();
    write!(
        socket,
        "{method} {path} HTTP/1.1\r\nHost: memagent\r\nContent-Type: {kind}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    // A body over the limit may be refused before it is all sent.
    let _ = socket.write_all(body);
    let mut response = Vec::new();
    let _ = socket.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    let status: u16 = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    // Chunked bodies: the JSON object between the first `{` and the last `}`.
    let json_text = match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) => &body[a..=b],
        _ => body,
    };
    let value =
        serde_json::from_str(json_text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

fn post(daemon: &Daemon, path: &str, body: &Value) -> (u16, Value) {
    request(
        daemon,
        "POST",
        path,
        body.to_string().as_bytes(),
        "application/json",
    )
}

#[test]
fn appended_text_is_searchable_before_any_memory_step_and_errors_are_json() {
    let root = test_root("search");
    let notes = root.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let config = format!(
        "[[watch]]\npath = \"{}\"\nstream = \"notes\"\n",
        notes.display()
    );
    // Memory steps wait: whole chunks of 4,096 tokens, partial ones after an hour.
    let daemon = Daemon::start(
        &root,
        &config,
        &["--idle-seconds", "3600", "--chunk-tokens", "4096"],
    );
    let file = notes.join("cabin.md");
    append(
        &file,
        "# Cabin\n\nBring firewood.\n\nThe wifi password at the cabin is pinecone42.\n",
    );
    let found = wait_for(
        "the passage in search results",
        Duration::from_secs(60),
        || {
            let (status, reply) = post(
                &daemon,
                "/v1/search",
                &json!({"stream": "notes", "text": "wifi password cabin"}),
            );
            if status == 404 {
                return None; // the stream is not there yet
            }
            assert_eq!(status, 200, "{reply}");
            let passages = reply["passages"].as_array().unwrap().clone();
            (!passages.is_empty()).then_some(passages)
        },
    );
    assert!(
        found[0]["text"].as_str().unwrap().contains("pinecone42"),
        "{found:#?}"
    );
    assert_eq!(found[0]["line"], 1);
    assert!(found[0]["source"].as_str().unwrap().ends_with("cabin.md"));
    let row = daemon.stream_status("notes").unwrap();
    assert_eq!(row["version"], 0, "no memory step ran: {row}");
    assert_eq!(row["index_lag_bytes"], 0, "{row}");
    assert!(row["pending_bytes"].as_u64().unwrap() > 0, "{row}");
    // Its resident memory holds the model and the embedder (together over 100 MB).
    let status = daemon.try_status().unwrap();
    let rss = status["rss_bytes"].as_u64().unwrap();
    assert!(rss > 100_000_000, "{status}");
    assert!(
        status["peak_rss_bytes"].as_u64().unwrap() >= rss,
        "{status}"
    );

    // memctl search and query go through the daemon.
    let out = daemon.memctl(&["search", "notes", "pinecone", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["passages"][0]["start"], found[0]["start"]);
    let out = daemon.memctl(&[
        "query",
        "notes",
        "What is the wifi password at the cabin?",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        answer["passages"].as_array().is_some_and(|p| !p.is_empty()),
        "{answer:#}"
    );

    // Every error is JSON naming the field or the limit.
    let (status, reply) = request(
        &daemon,
        "POST",
        "/v1/append",
        b"{\"stream\": ",
        "application/json",
    );
    assert_eq!(status, 400, "{reply}");
    assert!(reply["error"].as_str().is_some(), "{reply}");
    let (status, reply) = post(&daemon, "/v1/append", &json!({"stream": "notes"}));
    assert_eq!(status, 422, "{reply}");
    assert!(reply["error"].as_str().unwrap().contains("text"), "{reply}");
    let (status, reply) = request(&daemon, "POST", "/v1/search", b"{}", "text/plain");
    assert_eq!(status, 415, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("application/json"),
        "{reply}"
    );
    let huge = json!({"stream": "notes", "text": "x".repeat(17 << 20)});
    let (status, reply) = post(&daemon, "/v1/append", &huge);
    assert_eq!(status, 413, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("limit"),
        "{reply}"
    );
    assert_eq!(reply["limit_bytes"], 16 << 20, "{reply}");
    let deep_rank = json!({"stream": "notes", "question": "Where?", "rerank": 100_000});
    let (status, reply) = post(&daemon, "/v1/query", &deep_rank);
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("`rerank` must be at most"),
        "{reply}"
    );
    let (status, reply) = post(&daemon, "/v1/search", &json!({"text": "x"}));
    assert_eq!(status, 400);
    assert!(
        reply["error"].as_str().unwrap().contains("`stream`"),
        "{reply}"
    );
    let (status, reply) = request(&daemon, "GET", "/v1/nowhere", b"", "application/json");
    assert_eq!(status, 404, "{reply}");
}

#[test]
fn sigkill_while_indexing_then_restart_gives_a_rebuild_s_results() {
    let root = test_root("search-crash");
    let notes = root.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let config = format!(
        "[[watch]]\npath = \"{}\"\nstream = \"notes\"\n",
        notes.display()
    );
    let args = ["--idle-seconds", "3600", "--chunk-tokens", "4096"];
    let mut daemon = Daemon::start(&root, &config, &args);
    let filler = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/filler.txt"),
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(20261125);
    for round in 0..4 {
        // A burst of paragraphs, then a kill at a random moment while it is indexed.
        let file = notes.join(format!("part-{round}.md"));
        // Six appends a moment apart (each indexed and committed on its own), and a
        // kill at a random moment among them.
        let kill_at = rng.random_range(0..6);
        for i in 0..6 {
            append(
                &file,
                &format!(
                    "Entry {round}.{i}: locker code {}.\n\n{filler}\n",
                    rng.random_range(1000..9999)
                ),
            );
            // The writer's pace (a workload, not a wait).
            std::thread::sleep(Duration::from_millis(rng.random_range(100..1500)));
            if i == kill_at {
                daemon.kill();
                daemon.spawn();
            }
        }
    }
    // After the last start the index catches up with every log.
    wait_for("the index to catch up", Duration::from_secs(300), || {
        let status = daemon.try_status()?;
        let rows = status["streams"].as_array()?.clone();
        rows.iter()
            .all(|r| r["index_lag_bytes"] == 0 && r["log_bytes"].as_u64() > Some(0))
            .then_some(())
    });
    let queries = [
        "locker code 2.3",
        "a garden teaches patience",
        "Entry 3.5",
        "river in spring",
    ];
    let search = |daemon: &Daemon| -> Vec<Value> {
        queries
            .iter()
            .map(|q| {
                let out = daemon.memctl(&["search", "notes", q, "-k", "8", "--json"]);
                assert!(out.status.success(), "{}", stderr(&out));
                serde_json::from_slice(&out.stdout).unwrap()
            })
            .collect()
    };
    let after_kills = search(&daemon);
    let log = daemon.log_text();
    eprintln!(
        "catch-ups at start: {}",
        log.matches("search index: read").count()
    );
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    // A fresh rebuild of the same data answers the same.
    let rebuild = daemon.memctl(&["index", "rebuild", "--json"]);
    assert!(rebuild.status.success(), "{}", stderr(&rebuild));
    let rebuilt = {
        queries
            .iter()
            .map(|q| {
                let out = daemon.memctl(&["search", "notes", q, "-k", "8", "--json"]);
                serde_json::from_slice::<Value>(&out.stdout).unwrap()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(after_kills, rebuilt);
    assert!(after_kills[0]["passages"][0]["text"]
        .as_str()
        .unwrap()
        .contains("locker code"));
}

/// With `[query] rerank`, every question is ranked again unless it says otherwise, and
/// the daemon reads a chat's passages ahead once they are indexed: a question ranking
/// them again reads no passage of its own, and gets the same likelihoods, to the bit, and
/// the same answer as the query run without a daemon, which reads every passage with the
/// question.
#[test]
fn passages_read_ahead_are_ranked_again_as_if_read_with_the_question() {
    let root = test_root("read-ahead");
    let mut daemon = Daemon::start(&root, "[query]\nrerank = 20\n", &[]);
    let file = root.join("talk.jsonl");
    std::fs::write(&file, crate::chats::sittings_about_bees()).unwrap();
    let o = daemon.memctl(&["ingest", "talk", file.to_str().unwrap(), "--no-process"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let read_ahead = |daemon: &Daemon| daemon.try_status().map(|s| s["read_ahead"].clone());
    let ahead = wait_for("the chat read ahead", Duration::from_secs(120), || {
        read_ahead(&daemon).filter(|a| {
            a["on"] == true && a["passages_read"].as_u64() > Some(0) && a["pending"] == 0
        })
    });
    assert_eq!(ahead["kept_prompts"], ahead["passages_read"], "{ahead}");
    let shown = daemon.memctl(&["daemon", "status"]);
    assert!(
        stdout(&shown).contains(&format!(
            "read ahead: {} passages read",
            ahead["passages_read"]
        )),
        "{}",
        stdout(&shown)
    );

    // The memory steps run beside the questions: each passage names the memory version
    // that read it, so the answers are compared once the chat is read into memory.
    let bytes = daemon.stream_status("talk").expect("the chat's status")["log_bytes"]
        .as_u64()
        .expect("the chat's log length");
    daemon.wait_caught_up("talk", bytes, Duration::from_secs(300));
    let question = "What did Ben start on Tuesdays?";
    let ask = |daemon: &Daemon, flags: &[&str]| -> Value {
        let o = daemon.memctl(&[&["query", "talk", question, "--json"], flags].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let ranked = |answer: &Value| -> Vec<bool> {
        let passages = answer["passages"].as_array().unwrap();
        assert!(!passages.is_empty(), "{answer}");
        passages.iter().map(|p| p["likelihood"].is_f64()).collect()
    };
    let through = ask(&daemon, &[]);
    assert!(ranked(&through).iter().all(|&r| r), "{through}");
    assert!(
        ranked(&ask(&daemon, &["--rerank", "0"]))
            .iter()
            .all(|&r| !r),
        "--rerank 0 keeps the search's order"
    );
    // A request of the API that does not say gets the daemon's default.
    let body = json!({"stream": "talk", "question": question}).to_string();
    let (code, api) = request(
        &daemon,
        "POST",
        "/v1/query",
        body.as_bytes(),
        "application/json",
    );
    assert_eq!(code, 200, "{api}");
    assert_eq!(api["passages"], through["passages"]);
    let after = read_ahead(&daemon).unwrap();
    assert_eq!(
        (&after["kept_prompts"], &after["passages_read"]),
        (&ahead["kept_prompts"], &ahead["passages_read"]),
        "the question read no passage of its own: {after}"
    );
    assert!(daemon.stop().success(), "{}", daemon.log_text());

    let alone = ask(&daemon, &[]);
    assert_eq!(alone["passages"], through["passages"]);
    assert_eq!(alone["answer"], through["answer"]);

    // A restart keeps nothing read, and nothing is new to index: the largest stream (the
    // only one here) is read ahead again.
    daemon.spawn();
    wait_for(
        "the chat read ahead again",
        Duration::from_secs(120),
        || {
            read_ahead(&daemon)
                .filter(|a| a["passages_read"] == ahead["passages_read"] && a["pending"] == 0)
        },
    );
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

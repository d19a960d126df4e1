//! `memctl mcp` driven by the official MCP Python SDK's client over stdio, with the real
//! default model and a real database on disk.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use memagent_store::{Store, GENERAL};
use serde_json::{json, Value};

use crate::clients::{assert_tool_error, ok_call};
use crate::{data_dir, memctl};

fn mcp_session(dir: &Path, ops: &[Value]) -> Vec<Value> {
    crate::clients::mcp_session(&memctl(dir, &["mcp"]), ops)
}

#[test]
fn an_mcp_client_remembers_recalls_and_reads_memory() {
    let dir = data_dir("mcp");
    let uri = "memagent://streams/notes/memory";
    let ops = [
        json!(["list_tools"]),
        json!(["call", "streams", {}]),
        // The default 135M model answers from this pair (as in the daemon's query test).
        json!(["call", "remember", {"stream": "notes", "text": "Harbour notes for this week.\n"}]),
        json!(["call", "remember", {"stream": "notes", "text": "The harbour master is called Ines Duarte.\n"}]),
        json!(["call", "recall", {"stream": "notes", "question": "Who is the harbour master?"}]),
        json!(["call", "memory", {"stream": "notes"}]),
        json!(["call", "history", {"stream": "notes"}]),
        json!(["call", "remember", {"stream": "chat", "turns": [
            {"role": "user", "name": "Priya", "content": "My sister Lucia lives in Porto."},
            {"role": "assistant", "content": "Noted."}
        ]}]),
        json!(["list_resources"]),
        json!(["read", uri]),
        // Errors: an unknown stream, a missing argument, both text and turns, a bad URI.
        json!(["call", "recall", {"stream": "nope", "question": "Who?"}]),
        json!(["call", "remember", {"text": "no stream named"}]),
        json!(["call", "remember", {"stream": "notes", "text": "a", "turns": []}]),
        json!(["read", "memagent://streams/nope/memory"]),
        // The passages ranked again by the question's likelihood, and a depth refused.
        json!(["call", "recall", {"stream": "notes", "question": "Who is the harbour master?", "rerank": 4}]),
        json!(["call", "recall", {"stream": "notes", "question": "Who?", "rerank": 5000}]),
    ];
    let r = mcp_session(&dir, &ops);

    let mut names: Vec<&str> = r[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["history", "memory", "recall", "remember", "search", "streams"],
        "{:#}",
        r[0]
    );
    let remember = r[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "remember")
        .unwrap();
    assert_eq!(
        remember["inputSchema"]["required"],
        json!(["stream"]),
        "{remember:#}"
    );
    assert_eq!(ok_call(&r[1])["streams"], json!([]), "{:#}", r[1]);

    let first = ok_call(&r[2]);
    assert_eq!(first["version"], 1, "{first:#}");
    assert_eq!(first["through_daemon"], false, "{first:#}");
    let second = ok_call(&r[3]);
    assert_eq!(second["version"], 2, "{second:#}");
    assert_eq!(second["chunks_read"], 1, "{second:#}");

    let answer = r[4]["text"].as_str().unwrap();
    assert_eq!(r[4]["is_error"], false, "{:#}", r[4]);
    assert!(
        answer.contains("Ines") || answer.contains("Duarte"),
        "answer: {answer}"
    );
    assert_eq!(ok_call(&r[4])["version"], 2);

    // The memory as the store holds it, through the tool and the resource alike.
    let store = Store::open(&dir).unwrap();
    let notes = store.require("notes").unwrap();
    let latest = store.latest(&notes, GENERAL).unwrap().unwrap();
    assert_eq!(r[5]["text"], latest.text.as_str(), "{:#}", r[5]);
    assert_eq!(ok_call(&r[5])["version"], 2);
    let versions = ok_call(&r[6])["versions"].as_array().unwrap().clone();
    assert_eq!(versions.len(), 2, "{:#}", r[6]);
    assert_eq!(versions[1]["parent"], 1);
    assert_eq!(versions[1]["author"], "model");
    assert!(versions[1]["time"].as_str().unwrap().ends_with("UTC"));

    // Chat turns are stored as the daemon stores a chat log's messages.
    assert_eq!(ok_call(&r[7])["version"], 1, "{:#}", r[7]);
    let chat = store.require("chat").unwrap();
    let log = store.read_log(&chat, 0, chat.log_len).unwrap();
    assert_eq!(
        String::from_utf8(log).unwrap(),
        "user (Priya): My sister Lucia lives in Porto.\nassistant: Noted.\n"
    );

    let uris: Vec<&str> = r[8]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|res| res["uri"].as_str().unwrap())
        .collect();
    assert_eq!(uris, ["memagent://streams/chat/memory", uri], "{:#}", r[8]);
    assert_eq!(r[9]["contents"], json!([latest.text]), "{:#}", r[9]);

    assert_tool_error(&r[10], "no stream named `nope`");
    // A missing argument is refused before the tool runs, naming the field.
    assert_tool_error(&r[11], "missing field `stream`");
    assert_tool_error(&r[12], "not both");
    let unknown = r[13]["mcp_error"]["message"].as_str().unwrap_or_default();
    assert!(unknown.contains("nope"), "{:#}", r[13]);
    let ranked = ok_call(&r[14]);
    let passages = ranked["passages"].as_array().unwrap();
    assert!(
        !passages.is_empty() && passages.iter().all(|p| p["likelihood"].as_f64().is_some()),
        "{ranked:#}"
    );
    assert_tool_error(&r[15], "`rerank` must be at most 200");
    // Nothing was written for the refused calls.
    assert_eq!(store.stream("nope").unwrap().map(|s| s.name), None);
    assert_eq!(store.versions(&notes, GENERAL).unwrap().len(), 2);
}

/// A `recall` that does not say how many passages to rank again takes the configuration
/// file's `[query] rerank`; one saying 0 keeps the search's order.
#[test]
fn an_mcp_recall_ranks_again_as_the_configuration_says_unless_it_says() {
    let dir = data_dir("mcp-query-rerank");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(&config, "[query]\nrerank = 4\n").unwrap();
    let server = memctl(&dir, &["--config", config.to_str().unwrap(), "mcp"]);
    let question = json!({"stream": "notes", "question": "Who is the harbour master?"});
    let mut unranked = question.clone();
    unranked["rerank"] = json!(0);
    let r = crate::clients::mcp_session(
        &server,
        &[
            json!(["call", "remember", {"stream": "notes", "text": "Harbour notes for this week.\n"}]),
            json!(["call", "remember", {"stream": "notes", "text": "The harbour master is called Ines Duarte.\n"}]),
            json!(["call", "recall", question]),
            json!(["call", "recall", unranked]),
        ],
    );
    let likelihoods = |reply: &Value| -> Vec<bool> {
        let passages = ok_call(reply)["passages"].as_array().unwrap().clone();
        assert!(!passages.is_empty(), "{reply:#}");
        passages.iter().map(|p| p["likelihood"].is_f64()).collect()
    };
    assert!(likelihoods(&r[2]).iter().all(|&l| l), "{:#}", r[2]);
    assert!(likelihoods(&r[3]).iter().all(|&l| !l), "{:#}", r[3]);
}

/// Starts `memctl mcp`, sends `lines` (JSON-RPC messages) and reads one reply line per
/// request, then closes its standard input: the exit status, within a deadline.
fn session_then_eof(dir: &Path, lines: &[Value]) -> (std::process::ExitStatus, Vec<Value>) {
    use std::io::{BufRead, BufReader, Write};
    let mut server = memctl(dir, &["mcp"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = server.stdin.take().unwrap();
    let mut stdout = BufReader::new(server.stdout.take().unwrap());
    let mut replies = Vec::new();
    for line in lines {
        writeln!(stdin, "{line}").unwrap();
        if line.get("id").is_some() {
            let mut reply = String::new();
            stdout.read_line(&mut reply).unwrap();
            replies.push(serde_json::from_str(&reply).unwrap());
        }
    }
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            panic!("memctl mcp still runs 30 s after its standard input closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, replies)
}

#[test]
fn the_mcp_server_exits_when_its_input_closes() {
    let dir = data_dir("mcp-eof");
    // Before any message.
    let (status, _) = session_then_eof(&dir, &[]);
    assert!(status.success(), "{status}");
    // After the handshake and a call.
    let (status, replies) = session_then_eof(
        &dir,
        &[
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "memctl-test", "version": "0"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "streams", "arguments": {}}}),
        ],
    );
    assert!(status.success(), "{status}");
    assert_eq!(
        replies[0]["result"]["serverInfo"]["name"], "memagent",
        "{replies:#?}"
    );
    assert_eq!(
        replies[1]["result"]["structuredContent"],
        json!({"streams": []}),
        "{replies:#?}"
    );
}

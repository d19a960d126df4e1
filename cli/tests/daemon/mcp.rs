//! `memctl mcp` while a daemon holds the database: every call goes through its socket,
//! and what an assistant remembers is read in by the daemon.

use std::time::Duration;

use serde_json::json;

use crate::clients::{assert_tool_error, mcp_session, ok_call};
use crate::{stderr, test_root, Daemon};

#[test]
fn mcp_calls_go_through_the_daemon_that_holds_the_database() {
    let root = test_root("mcp");
    // Nothing watched: the API alone.
    let mut daemon = Daemon::start(&root, "", &["--idle-seconds", "1"]);
    let mut server = daemon.command();
    server.arg("mcp");
    let remember = |text: &str| {
        let r = mcp_session(
            &server,
            &[json!(["call", "remember", {"stream": "notes", "text": text}])],
        );
        let done = ok_call(&r[0]).clone();
        assert_eq!(done["through_daemon"], true, "{done:#}");
        assert_eq!(done["appended_bytes"], text.len(), "{done:#}");
        done["log_bytes"].as_u64().unwrap()
    };
    // The default 135M model answers from this pair (as in the query test).
    let bytes = remember("Harbour notes for this week.\n");
    daemon.wait_caught_up("notes", bytes, Duration::from_secs(120));
    let bytes = remember("The harbour master is called Ines Duarte.\n");
    let row = daemon.wait_caught_up("notes", bytes, Duration::from_secs(120));
    assert_eq!(row["version"], 2, "{row}");

    let r = mcp_session(
        &server,
        &[
            json!(["call", "recall", {"stream": "notes", "question": "Who is the harbour master?"}]),
            json!(["call", "memory", {"stream": "notes"}]),
            json!(["call", "history", {"stream": "notes"}]),
            json!(["call", "streams", {}]),
            json!(["read", "memagent://streams/notes/memory"]),
            json!(["call", "recall", {"stream": "nope", "question": "Who?"}]),
        ],
    );
    let answer = r[0]["text"].as_str().unwrap_or_default();
    assert!(
        answer.contains("Ines") || answer.contains("Duarte"),
        "answer: {:#}\n{}",
        r[0],
        daemon.log_text()
    );
    assert_eq!(ok_call(&r[0])["version"], 2);
    let show = daemon.memctl(&["memory", "show", "notes", "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let show: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(r[1]["text"], show["text"], "{:#}", r[1]);
    assert_eq!(ok_call(&r[2])["versions"].as_array().map(Vec::len), Some(2));
    let streams = &ok_call(&r[3])["streams"];
    assert_eq!(streams[0]["stream"], "notes", "{streams:#}");
    assert_eq!(r[4]["contents"], json!([show["text"]]), "{:#}", r[4]);
    assert_tool_error(&r[5], "no stream named `nope`");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

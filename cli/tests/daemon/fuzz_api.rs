//! Fuzzing the daemon's API: request bodies and query strings of every shape, sent over
//! the real socket to a real daemon. Every answer is a status below 500 with a JSON body
//! (an `error` naming what is wrong for a 4xx), the daemon keeps running, and what the
//! requests did not ask to change is unchanged. 64 requests by default;
//! `PROPTEST_CASES=10000` for a longer run.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};

use crate::{test_root, Daemon};

/// One HTTP/1.1 request over the socket: the status and the body.
fn request(socket: &Path, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: memagent\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // The daemon may answer and close before reading a body it refuses.
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body));
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response);
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text}"));
    let at = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(response.len(), |i| i + 4);
    (status, response[at..].to_vec())
}

/// A JSON value of any kind, a few levels deep, with the API's field names likely.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        any::<String>().prop_map(Value::from),
        Just(json!("fuzz")),
        Just(json!("notes")),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        let field = prop::sample::select(vec![
            "stream",
            "streams",
            "text",
            "source",
            "force",
            "turns",
            "question",
            "questions",
            "at",
            "k",
            "all",
            "deep",
            "memory_only",
            "evidence_tokens",
            "version",
            "extra",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((field, inner), 0..5).prop_map(|kv| Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

/// A request: (method, path, body).
fn any_request() -> impl Strategy<Value = (String, String, Vec<u8>)> {
    let endpoint = prop::sample::select(vec![
        ("POST", "/v1/append"),
        ("POST", "/v1/search"),
        ("POST", "/v1/memory"),
        ("POST", "/v1/query"),
        ("GET", "/v1/memory"),
        ("GET", "/v1/history"),
        ("GET", "/v1/answers"),
        ("DELETE", "/v1/streams"),
        ("GET", "/v1/status"),
        ("PUT", "/v1/append"),
        ("GET", "/v1/nowhere"),
        ("POST", "/v1/nowhere"),
    ]);
    let query = prop_oneof![
        Just(String::new()),
        Just("?stream=fuzz".to_string()),
        Just("?stream=fuzz&at=18446744073709551615".to_string()),
        Just("?stream=fuzz&at=-3&sources=maybe".to_string()),
        // Any query string a valid request line can carry (a malformed request line is
        // refused by the HTTP layer before the API sees it).
        "\\?[&=a-z0-9]{0,30}",
        "\\?stream=[a-z]{1,6}&at=[0-9]{1,25}",
    ];
    let body = prop_oneof![
        any_json().prop_map(|v| v.to_string().into_bytes()),
        prop::collection::vec(any::<u8>(), 0..80),
        Just(b"{\"stream\": \"fuzz\", \"text\": \"Fuzz line.\\n\"}".to_vec()),
        Just(b"{\"stream\": \"fuzz\", \"text\": \"x\", \"turns\": [[99999, 1], [0]]}".to_vec()),
    ];
    (endpoint, query, body).prop_map(|((method, path), query, body)| {
        // A query runs the model: only shapes it refuses before reading are sent.
        let body = match path {
            // Only a POST carries a body: one the daemon refuses unread (a GET's, a
            // wrong method's, an unknown path's) resets the connection under its answer.
            _ if method != "POST" => Vec::new(),
            "/v1/query"
                if serde_json::from_slice::<Value>(&body)
                    .is_ok_and(|v| v["question"].is_string()) =>
            {
                b"{\"question\": 3}".to_vec()
            }
            _ => body,
        };
        (method.to_string(), format!("{path}{query}"), body)
    })
}

#[test]
fn any_request_gets_a_json_answer_and_the_daemon_keeps_its_data() {
    let root = test_root("fuzz-api");
    let inbox = root.join("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    std::fs::write(
        inbox.join("notes"),
        "The spare key is under the blue pot.\n",
    )
    .unwrap();
    let config = format!(
        "[[watch]]\npath = \"{}\"\nstream = \"notes\"\n",
        inbox.display()
    );
    let mut daemon = Daemon::start(&root, &config, &["--idle-seconds", "0.5"]);
    daemon.wait_caught_up("notes", 37, Duration::from_secs(120));
    let before = daemon.memctl(&["memory", "notes", "--json"]);
    let socket = daemon.data.join("memagent.sock");

    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&any_request(), |(method, path, body)| {
        // The watched stream is not the fuzzer's to remove.
        let path = path.replace("stream=notes", "stream=fuzz");
        let body = String::from_utf8_lossy(&body)
            .replace("\"notes\"", "\"fuzz\"")
            .into_bytes();
        let (status, answer) = request(&socket, &method, &path, &body);
        prop_assert!(
            status < 500,
            "{method} {path} {}: {status} {}",
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&answer)
        );
        let value: Value = serde_json::from_slice(&answer).map_err(|e| {
            TestCaseError::fail(format!("{method} {path}: {status}, not JSON ({e})"))
        })?;
        if status >= 400 {
            prop_assert!(
                value["error"].as_str().is_some_and(|e| !e.is_empty()),
                "{value}"
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\ndaemon log:\n{}", daemon.log_text());
    }
    assert!(daemon.is_running(), "{}", daemon.log_text());
    let after = daemon.memctl(&["memory", "notes", "--json"]);
    assert_eq!(
        after.stdout, before.stdout,
        "the watched stream's memory changed"
    );
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

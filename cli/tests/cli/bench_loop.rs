//! `memctl bench loop`: its errors without a usable server, and one fixed-length run
//! against a loopback OpenAI-compatible server standing in for llama.cpp's.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::{stderr, with_model};

#[test]
fn without_a_usable_server_it_says_what_to_pass() {
    let o = with_model(&["bench", "loop", "--tokens", "500"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--llama-server PATH"), "{}", stderr(&o));

    let o = with_model(&[
        "bench",
        "loop",
        "--llama-server",
        "/nonexistent/llama-server",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("is not a file"), "{}", stderr(&o));

    // A server that dies at start: its own words are shown.
    let dir = std::env::temp_dir().join(format!("memctl-bench-loop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("llama-server");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'error: failed to load model (fake)' >&2\nexit 3\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).unwrap();
    let o = with_model(&[
        "bench",
        "loop",
        "--tokens",
        "500",
        "--llama-server",
        fake.to_str().unwrap(),
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("exited"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("failed to load model (fake)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_fixed_length_run_generates_the_same_tokens_on_both_sides() {
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    let port = server.server_addr().to_ip().unwrap().port();
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let thread = {
        let (server, seen) = (Arc::clone(&server), Arc::clone(&seen));
        std::thread::spawn(move || {
            for mut request in server.incoming_requests() {
                let mut text = String::new();
                request.as_reader().read_to_string(&mut text).unwrap();
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                seen.lock().unwrap().push(body.clone());
                // Exactly max_tokens tokens, as a server ignoring end of turn writes.
                let n = body["max_tokens"].as_u64().unwrap_or(1);
                let reply = json!({
                    "choices": [{"message": {"role": "assistant",
                                             "content": " fact".repeat(n as usize)},
                                 "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 500, "completion_tokens": n},
                    "timings": {"prompt_ms": 100.0, "predicted_ms": 200.0},
                });
                let header =
                    tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                let _ = request.respond(
                    tiny_http::Response::from_string(reply.to_string()).with_header(header),
                );
            }
        })
    };
    let url = format!("http://127.0.0.1:{port}/v1");
    let o = with_model(&[
        "bench",
        "loop",
        "--server-url",
        &url,
        "--tokens",
        "600",
        "--profiles",
        "small",
        "--modes",
        "fixed",
        "--json",
    ]);
    server.unblock();
    thread.join().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let measures = v["measures"].as_array().unwrap();
    assert_eq!(measures.len(), 2, "{v}");
    let (local, remote) = (&measures[0], &measures[1]);
    assert_eq!(local["engine"], "local");
    assert_eq!(remote["engine"], "server");
    for m in measures {
        assert_eq!(m["profile"], "small");
        assert_eq!(m["mode"], "fixed");
        assert_eq!(m["steps"], 1, "{m}");
        assert!(m["input_tokens"].as_u64().unwrap() >= 590, "{m}");
        assert!(m["input_tokens_per_second"].as_f64().unwrap() > 0.0);
    }
    // One step of M = 256 and an answer of 256, on both sides.
    assert_eq!(local["generated_tokens"], 512, "{local}");
    assert_eq!(remote["generated_tokens"], 512, "{remote}");
    assert!(local["decode_seconds"].as_f64().unwrap() > 0.0);
    // The server's own timings: 0.1 s + 0.2 s per request, two requests.
    assert!((remote["prefill_seconds"].as_f64().unwrap() - 0.2).abs() < 1e-9);
    assert!((remote["decode_seconds"].as_f64().unwrap() - 0.4).abs() < 1e-9);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "a step and the final answer");
    for body in seen.iter() {
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["stream"], false, "no loop stops at a fixed length");
    }
}

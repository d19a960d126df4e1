//! `memctl ask` as a real process: the memory loop on the real default model, and the
//! remote backend against a loopback chat-completions server.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::{model_path, stderr, stdout, tempdir};

/// Runs `memctl --model DEFAULT args…` with `input` on standard input.
fn ask(args: &[&str], input: &str) -> Output {
    ask_with_env(args, input, &[])
}

fn ask_with_env(args: &[&str], input: &str, env: &[(&str, &str)]) -> Output {
    let model = model_path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memctl"))
        .arg("--model")
        .arg(&model)
        .arg("ask")
        .args(args)
        .env_remove("MEMAGENT_MODEL")
        .env_remove("MEMAGENT_BACKEND")
        .env_remove("OPENAI_API_KEY")
        .env_remove("MEMAGENT_CONFIG")
        // No configuration file: the default location is empty.
        .env("XDG_CONFIG_HOME", "/nonexistent/memagent-test-config")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run memctl");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

const NEEDLE_DOC: &str = "Our notes from the planning meeting. The bakery on the corner \
    changed its opening hours. The special magic number for Lisbon is 4817263. The ferry \
    timetable was updated for the winter, and the library extended its weekend hours.";

#[test]
fn ask_answers_from_a_file_with_json_stats() {
    let dir = tempdir();
    let file = dir.join("notes.txt");
    std::fs::write(&file, NEEDLE_DOC).unwrap();
    let o = ask(
        &[
            "--file",
            file.to_str().unwrap(),
            "--json",
            "--memory-only",
            "What is the special magic number for Lisbon?",
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mode"], "memory");
    assert!(
        v["extracted"].as_str().unwrap().contains("4817263"),
        "{v:#}"
    );
    assert!(v["answer"].as_str().unwrap().contains("4817263"));
    assert_eq!(v["chunks"], 1);
    assert_eq!(
        v["profile"]["chunk_tokens"], 1024,
        "the small-model profile"
    );
    assert_eq!(v["profile"]["memory_tokens"], 256);
    assert_eq!(v["templates"]["update"]["id"], "memagent-update");
    assert_eq!(v["templates"]["final"]["id"], "memagent-final-boxed");
    let step = &v["steps"][0];
    for key in [
        "index",
        "chunk_tokens",
        "prompt_tokens",
        "completion_tokens",
        "memory_tokens",
        "cut",
        "stop_reason",
        "seconds",
        "memory",
    ] {
        assert!(!step[key].is_null(), "step lacks {key}: {step:#}");
    }
    assert_eq!(step["chunk_tokens"], v["input_tokens"]);
}

#[test]
fn ask_answers_beside_the_document_s_passages_and_cites_them() {
    let dir = tempdir();
    let file = dir.join("notes.txt");
    std::fs::write(&file, NEEDLE_DOC).unwrap();
    let o = ask(
        &[
            "--file",
            file.to_str().unwrap(),
            "--json",
            "What is the special magic number for Lisbon?",
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mode"], "evidence");
    assert_eq!(v["templates"]["final"]["id"], "memagent-passage-answer");
    assert!(
        v["extracted"].as_str().unwrap().contains("4817263"),
        "{v:#}"
    );
    let passages = v["passages"].as_array().unwrap();
    assert_eq!(passages.len(), 1, "one short document, one passage: {v:#}");
    assert_eq!(passages[0]["start"], 0);
    assert_eq!(passages[0]["end"], NEEDLE_DOC.len());
    // The memory's own answer stays beside it.
    assert!(v["memory_answer"]["extracted"].is_string(), "{v:#}");
}

#[test]
fn ask_reads_stdin_and_shows_every_memory() {
    let doc = NEEDLE_DOC.repeat(4);
    let o = ask(
        &[
            "--chunk-tokens",
            "64",
            "--memory-tokens",
            "48",
            "--answer-tokens",
            "24",
            "--show-memory",
            "What changed at the bakery?",
        ],
        &doc,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let shown = out.matches("--- memory after chunk ").count();
    assert!(shown >= 3, "{out}");
    assert!(
        out.contains(&format!("--- memory after chunk {shown}/{shown} ")),
        "{out}"
    );
    // The answer follows the memories.
    let answer = out.rsplit("---\n").next().unwrap();
    assert!(!answer.trim().is_empty(), "{out}");
}

#[test]
fn ask_direct_answers_in_one_prompt_or_says_why_not() {
    let o = ask(
        &[
            "--direct",
            "--json",
            "What is the special magic number for Lisbon?",
        ],
        NEEDLE_DOC,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mode"], "direct");
    assert_eq!(v["template"]["id"], "memagent-direct-boxed");
    assert!(
        v["extracted"].as_str().unwrap().contains("4817263"),
        "{v:#}"
    );

    let long = "The tide comes in and goes out again. ".repeat(1200);
    let o = ask(&["--direct", "What does the tide do?"], &long);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("drop --direct"), "{}", stderr(&o));
}

#[test]
fn ask_rejects_bad_requests_clearly() {
    let cases: [(&[&str], &str, &str); 5] = [
        (&[""], "some text", "question is empty"),
        (&["What is it?"], "", "document is empty"),
        (
            &["--chunk-tokens", "9000", "What is it?"],
            "some text",
            "--chunk-tokens",
        ),
        (
            &["--backend", "openai", "What is it?"],
            "some text",
            "--base-url",
        ),
        (
            &["--file", "/nonexistent/doc.txt", "What is it?"],
            "",
            "cannot read /nonexistent/doc.txt",
        ),
    ];
    for (args, input, expected) in cases {
        let o = ask(args, input);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}

#[test]
fn ask_through_an_openai_compatible_server() {
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    let port = server.server_addr().to_ip().unwrap().port();
    // (path, body, authorization) of every request.
    type Seen = Vec<(String, Value, Option<String>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let thread = {
        let (server, seen) = (Arc::clone(&server), Arc::clone(&seen));
        std::thread::spawn(move || {
            for mut request in server.incoming_requests() {
                let mut text = String::new();
                request.as_reader().read_to_string(&mut text).unwrap();
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let auth = request
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("Authorization"))
                    .map(|h| h.value.to_string());
                let path = request.url().to_string();
                seen.lock()
                    .unwrap()
                    .push((path.clone(), body.clone(), auth));
                let content = body["messages"][0]["content"].as_str().unwrap_or("");
                let (status, reply) = if path != "/v1/chat/completions" {
                    (404, json!({"error": "not found"}))
                } else {
                    let text = if content.contains("Updated memory:") {
                        "The bakery changed its opening hours."
                    } else {
                        "\\boxed{its opening hours}"
                    };
                    (
                        200,
                        json!({"choices": [{"message": {"role": "assistant", "content": text},
                                               "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 50, "completion_tokens": 8}}),
                    )
                };
                let header =
                    tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                let _ = request.respond(
                    tiny_http::Response::from_string(reply.to_string())
                        .with_status_code(status)
                        .with_header(header),
                );
            }
        })
    };
    let base = format!("http://127.0.0.1:{port}/v1");
    let model = model_path();
    let o = ask_with_env(
        &[
            "--backend",
            "openai",
            "--base-url",
            &base,
            "--remote-model",
            "RL-MemoryAgent-14B",
            "--tokenizer",
            model.to_str().unwrap(),
            "--chunk-tokens",
            "64",
            // Every chunk goes to the server, as the protocol has it.
            "--reading",
            "whole",
            "--json",
            "--memory-only",
            "What changed at the bakery?",
        ],
        &NEEDLE_DOC.repeat(3),
        &[("OPENAI_API_KEY", "sk-local")],
    );
    server.unblock();
    thread.join().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["extracted"], "its opening hours");
    assert_eq!(v["model"], "RL-MemoryAgent-14B");
    // The server says nothing of the model's size; the GGUF given as --tokenizer does.
    assert_eq!(v["profile"]["memory_tokens"], 256);
    let seen = seen.lock().unwrap();
    let chats: Vec<_> = seen
        .iter()
        .filter(|(path, _, _)| path == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), v["chunks"].as_u64().unwrap() as usize + 1);
    assert!(chats.len() >= 3);
    for (_, body, auth) in &chats {
        assert_eq!(auth.as_deref(), Some("Bearer sk-local"));
        assert_eq!(body["model"], "RL-MemoryAgent-14B");
    }
    // No context length from the server: the run goes on and says budget checks are off.
    assert!(stderr(&o).contains("--context-tokens"), "{}", stderr(&o));
}

#[test]
fn a_remote_model_of_unknown_size_needs_a_profile() {
    // A server that knows no extra endpoint: nothing tells the served model's size.
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    let port = server.server_addr().to_ip().unwrap().port();
    let thread = {
        let server = Arc::clone(&server);
        std::thread::spawn(move || {
            for request in server.incoming_requests() {
                let _ = request.respond(
                    tiny_http::Response::from_string("{\"error\": \"not found\"}")
                        .with_status_code(404),
                );
            }
        })
    };
    let base = format!("http://127.0.0.1:{port}/v1");
    let remote = [
        "--backend",
        "openai",
        "--base-url",
        &base,
        "--remote-model",
        "mystery",
    ];
    let o = ask(&[&remote[..], &["What is it?"]].concat(), "some text");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--profile small"), "{}", stderr(&o));
    assert!(stderr(&o).contains("mystery"), "{}", stderr(&o));
    // With a profile the run goes on, to the next thing it lacks: a tokenizer.
    let o = ask(
        &[&remote[..], &["--profile", "paper", "What is it?"]].concat(),
        "some text",
    );
    server.unblock();
    thread.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!stderr(&o).contains("--profile small"), "{}", stderr(&o));
    assert!(stderr(&o).contains("--tokenizer"), "{}", stderr(&o));
}

/// Filler sentences about nothing the question asks.
const FILLER: &str = "The bakery on the corner changed its opening hours. The ferry timetable \
    was updated for the winter. The library extended its weekend hours. A new bench was \
    placed by the pond. The market sold apples and pears all week. ";

#[test]
fn a_focused_reading_skips_chunks_without_the_question_s_words() {
    let dir = tempdir();
    let file = dir.join("notes.txt");
    let document = format!(
        "{}Let QXRTV hold 48213. {}Let MWPLA hold whatever QXRTV holds. {}",
        FILLER.repeat(3),
        FILLER.repeat(3),
        FILLER.repeat(3)
    );
    std::fs::write(&file, &document).unwrap();
    let question = "Which names end up holding 48213 in the text above?";
    let run = |reading: &str| {
        let o = ask(
            &[
                "--file",
                file.to_str().unwrap(),
                "--json",
                "--memory-only",
                "--chunk-tokens",
                "96",
                "--reading",
                reading,
                question,
            ],
            "",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let focused = run("focused");
    let steps = focused["steps"].as_array().unwrap();
    assert!(steps.len() >= 4, "{focused:#}");
    let mut read = 0;
    for step in steps {
        let note = step["focus"]
            .as_str()
            .expect("a focused step says what it read");
        if note.contains("none of") {
            assert_eq!(step["completion_tokens"], 0, "{step:#}");
        } else {
            read += 1;
        }
    }
    assert!((1..steps.len()).contains(&read), "{focused:#}");
    // The chain is followed: both assignments are in the last memory, whatever the
    // model wrote.
    let last = steps.last().unwrap()["memory"].as_str().unwrap();
    assert!(
        last.contains("QXRTV") && last.contains("MWPLA"),
        "{focused:#}"
    );

    let whole = run("whole");
    for step in whole["steps"].as_array().unwrap() {
        assert!(step["focus"].is_null(), "{step:#}");
        assert!(step["completion_tokens"].as_u64().unwrap() > 0, "{step:#}");
    }
}

#[test]
fn a_question_asking_for_every_value_reads_more_passages_within_the_same_budget() {
    let dir = tempdir();
    let file = dir.join("notes.txt");
    // Each pet in a passage of its own, between paragraphs about nothing asked.
    let pets = [
        ("cat", "Ana has a cat called Miso."),
        ("parrot", "Ana also keeps a parrot named Kiwi."),
        ("dog", "Ana adopted a dog called Bruno."),
        ("tortoise", "Ana looks after a tortoise named Pebble."),
        ("rabbit", "Ana got a rabbit called Clover."),
    ];
    let document: String = pets
        .iter()
        .map(|(_, said)| format!("{}{said} {}\n\n", FILLER.repeat(2), FILLER))
        .collect();
    std::fs::write(&file, &document).unwrap();
    let run = |question: &str| {
        let o = ask(
            &[
                "--file",
                file.to_str().unwrap(),
                "--json",
                "--evidence-tokens",
                "20",
                question,
            ],
            "",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let one = run("What is the name of Ana's cat?");
    let every = run("What pets does Ana have?");
    let read = |v: &Value| v["passages"].as_array().unwrap().len();
    assert!(read(&one) >= 1, "{one:#}");
    assert!(read(&every) > read(&one), "{one:#}\n{every:#}");
    // The list names the pets of more passages than the budget alone would let it read.
    let answer = every["extracted"].as_str().unwrap().to_lowercase();
    let named = pets
        .iter()
        .filter(|(kind, _)| answer.contains(kind))
        .count();
    assert!(named > read(&one), "{every:#}");
}

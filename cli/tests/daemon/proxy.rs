//! The OpenAI-compatible proxy that remembers, driven by the official OpenAI Python
//! client, in front of a loopback upstream that records what it receives.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use memagent_store::Store;
use serde_json::{json, Value};

use crate::chats::sittings_about_bees;
use crate::clients::openai_session;
use crate::{stderr, test_root, wait_for, Daemon};

/// The upstream's streamed reply, passed through byte for byte.
const EVENTS: &str = "data: {\"id\":\"up-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"She \"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"up-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lives in \"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"up-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Porto.\"},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n";

const NOTED: &str = "Noted: Lucia lives in Porto.";
const TOKEN: &str = "proxy-secret";

/// A loopback OpenAI-compatible server that records every request body: streamed
/// requests get [`EVENTS`], model `busy` gets a 429, others a completion saying [`NOTED`].
struct Upstream {
    url: String,
    received: Arc<Mutex<Vec<Value>>>,
    server: Option<Arc<tiny_http::Server>>,
    thread: Option<JoinHandle<()>>,
}

impl Upstream {
    fn start() -> Self {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let url = format!("http://{}/v1", server.server_addr().to_ip().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (server, received) = (server.clone(), received.clone());
            std::thread::spawn(move || {
                for mut request in server.incoming_requests() {
                    let mut body = String::new();
                    request.as_reader().read_to_string(&mut body).unwrap();
                    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    received.lock().unwrap().push(body.clone());
                    let json_type =
                        tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                    let response = if body["model"] == "busy" {
                        tiny_http::Response::from_string(
                            json!({"error": {"message": "slow down", "type": "rate_limit"}})
                                .to_string(),
                        )
                        .with_status_code(429)
                        .with_header(json_type)
                    } else if body["stream"] == true {
                        tiny_http::Response::from_string(EVENTS).with_header(
                            tiny_http::Header::from_bytes("Content-Type", "text/event-stream")
                                .unwrap(),
                        )
                    } else {
                        tiny_http::Response::from_string(
                            json!({
                                "id": "up-2", "object": "chat.completion", "created": 1,
                                "model": body["model"],
                                "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": NOTED}}],
                                "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16},
                            })
                            .to_string(),
                        )
                        .with_header(json_type)
                    };
                    let _ = request.respond(response);
                }
            })
        };
        Self {
            url,
            received,
            server: Some(server),
            thread: Some(thread),
        }
    }

    fn received(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }

    /// Stops answering: its port is closed afterwards.
    fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.unblock();
            if let Some(thread) = self.thread.take() {
                thread.join().unwrap();
            }
            // The last reference: dropping it closes the listening socket.
            drop(server);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[test]
fn the_proxy_adds_memory_passes_replies_through_and_remembers_the_turns() {
    let root = test_root("proxy");
    let mut upstream = Upstream::start();
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nupstream = \"{}\"\n",
        upstream.url
    );
    let mut daemon = Daemon::start(&root, &config, &["--idle-seconds", "1"]);
    let base = format!("http://127.0.0.1:{port}/v1");
    let fact = "Please remember: my sister Lucia lives in Porto.";

    // No memory yet: the request goes on as it came; its turns start the stream.
    let first = [
        json!({"role": "system", "content": "Be brief."}),
        user(fact),
    ];
    let r = openai_session(
        &base,
        TOKEN,
        &[json!(["chat", {"model": "up", "user": "priya", "messages": first}])],
    );
    assert_eq!(r[0]["content"], NOTED, "{:#}", r[0]);
    let turn1 = format!("user: {fact}\nassistant: {NOTED}\n");
    let row = daemon.wait_caught_up("priya", turn1.len() as u64, Duration::from_secs(120));
    assert_eq!(row["version"], 1, "{row}");
    let show = daemon.memctl(&["memory", "show", "priya", "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let memory: Value = serde_json::from_slice(&show.stdout).unwrap();
    let memory = memory["text"].as_str().unwrap().trim().to_string();

    // The stream named in the path; streamed; then the errors.
    let conversation = [
        user(fact),
        json!({"role": "assistant", "content": NOTED}),
        user("Where does Lucia live?"),
    ];
    let in_path = json!({"base_url": format!("http://127.0.0.1:{port}/streams/priya/v1")});
    let r = openai_session(
        &base,
        TOKEN,
        &[
            json!(["stream", {"model": "up", "messages": conversation}, in_path]),
            json!(["chat", {"model": "up", "messages": [user("Hi")]}]),
            json!(["chat", {"model": "up", "user": "priya", "messages": [user("Hi")]}, {"api_key": "wrong"}]),
            json!(["chat", {"model": "busy", "user": "priya", "messages": [user("Hi")]}]),
        ],
    );
    assert_eq!(
        r[0]["deltas"],
        json!(["She ", "lives in ", "Porto."]),
        "{:#}",
        r[0]
    );
    assert_eq!(r[1]["error"]["status"], 400, "{:#}", r[1]);
    let message = r[1]["error"]["message"].as_str().unwrap();
    assert!(message.contains("no memory stream named"), "{message}");
    assert_eq!(r[2]["error"]["status"], 401, "{:#}", r[2]);
    assert_eq!(r[3]["error"]["status"], 429, "{:#}", r[3]);
    assert_eq!(r[3]["error"]["message"], "slow down", "{:#}", r[3]);

    // The memory went to the upstream as a first system message, the rest unchanged.
    let received = upstream.received();
    assert_eq!(received.len(), 3, "{received:#?}");
    assert_eq!(received[0]["messages"], json!(first), "no memory yet");
    let sent = received[1]["messages"].as_array().unwrap();
    assert_eq!(sent[0]["role"], "system");
    let system = sent[0]["content"].as_str().unwrap();
    assert!(system.contains(&memory), "{system}\nmemory:\n{memory}");
    assert!(system.contains("stream `priya`, version 1"), "{system}");
    assert_eq!(&sent[1..], &conversation[..]);

    // A streamed reply is passed through byte for byte, with its content type.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut raw = agent
        .post(&format!("{base}/chat/completions"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("X-Memagent-Stream", "priya")
        .send_json(json!({"model": "up", "stream": true, "messages": [user("Thanks!")]}))
        .unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(
        raw.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    assert_eq!(raw.body_mut().read_to_string().unwrap(), EVENTS);

    // Every answered request's new turns and reply, in order; refused ones left nothing.
    let expected = format!(
        "{turn1}user: Where does Lucia live?\nassistant: She lives in Porto.\n\
         user: Thanks!\nassistant: She lives in Porto.\n"
    );
    daemon.wait_caught_up("priya", expected.len() as u64, Duration::from_secs(120));
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    upstream.stop();
    let store = Store::open(&daemon.data).unwrap();
    let stream = store.require("priya").unwrap();
    let log = store.read_log(&stream, 0, stream.log_len).unwrap();
    assert_eq!(String::from_utf8(log).unwrap(), expected);
}

/// With `rerank` in `[proxy]`, a request carries the best of the passages found for its
/// message once they are ranked again by the model's likelihood of it: those that
/// `memctl search --rerank` puts first, which here are not the search's own best.
#[test]
fn the_proxy_hands_on_the_passages_ranked_again() {
    let root = test_root("proxy-rerank");
    let mut upstream = Upstream::start();
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nupstream = \"{}\"\n\
         rerank = 20\n",
        upstream.url
    );
    let mut daemon = Daemon::start(&root, &config, &[]);
    let status = daemon.try_status().unwrap();
    assert_eq!(
        status["read_ahead"]["on"], true,
        "ranking again reads passages ahead by default: {status}"
    );
    let file = root.join("talk.jsonl");
    std::fs::write(&file, sittings_about_bees()).unwrap();
    let o = daemon.memctl(&["ingest", "talk", file.to_str().unwrap(), "--no-process"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let question = "What did Ben start on Tuesdays?";
    // The passages a request carries: the best 8 found that fit in the proxy's budget
    // of characters, oldest first.
    let carried = |rerank: &str| -> Vec<String> {
        let o = daemon.memctl(&[
            "search", "talk", question, "-k", "8", "--rerank", rerank, "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let found: Value = serde_json::from_slice(&o.stdout).unwrap();
        let mut used = 0;
        let mut kept = Vec::new();
        for p in found["passages"].as_array().unwrap() {
            let shown = p["dated"].as_str().or(p["text"].as_str()).unwrap().trim();
            if used + shown.len() <= memagent_watcher::PROXY_EVIDENCE_CHARS {
                used += shown.len();
                kept.push((p["start"].as_u64().unwrap(), shown.to_string()));
            }
        }
        kept.sort();
        kept.into_iter().map(|(_, shown)| shown).collect()
    };
    // Indexed as the daemon takes the text in.
    let plain = wait_for("the chat indexed", Duration::from_secs(60), || {
        Some(carried("0")).filter(|kept| !kept.is_empty())
    });
    let want = carried("20");
    assert_ne!(
        want, plain,
        "a question whose passages ranking again changes is needed here"
    );

    let r = openai_session(
        &format!("http://127.0.0.1:{port}/v1"),
        TOKEN,
        &[json!(["chat", {"model": "up", "user": "talk", "messages": [user(question)]}])],
    );
    assert_eq!(r[0]["content"], NOTED, "{:#}", r[0]);
    let received = upstream.received();
    let system = received[0]["messages"][0]["content"].as_str().unwrap();
    let (_, listed) = system.split_once("oldest first:").expect("passages listed");
    let expected: String = want
        .iter()
        .enumerate()
        .map(|(i, shown)| format!("\n[{}] {shown}", i + 1))
        .collect();
    assert_eq!(listed, expected, "{system}");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    upstream.stop();
}

/// A daemon whose model is a remote server (the loopback stand-in) reads nothing ahead,
/// whatever `read_ahead` says, and its log says why.
#[test]
fn a_remote_model_reads_nothing_ahead_and_says_so() {
    let root = test_root("read-ahead-remote");
    let mut upstream = Upstream::start();
    let model = crate::model_path();
    let mut daemon = Daemon::start(
        &root,
        "[daemon]\nread_ahead = true\n",
        &[
            "--backend",
            "openai",
            "--base-url",
            &upstream.url,
            "--remote-model",
            "up",
            "--tokenizer",
            model.to_str().unwrap(),
        ],
    );
    let file = root.join("talk.jsonl");
    std::fs::write(&file, sittings_about_bees()).unwrap();
    let o = daemon.memctl(&["ingest", "talk", file.to_str().unwrap(), "--no-process"]);
    assert!(o.status.success(), "{}", stderr(&o));
    wait_for("the log to say why", Duration::from_secs(60), || {
        daemon
            .log_text()
            .contains("read_ahead: up keeps no prompts")
            .then_some(())
    });
    let status = daemon.try_status().unwrap();
    let ahead = &status["read_ahead"];
    assert_eq!(
        (
            &ahead["on"],
            &ahead["passages_read"],
            &ahead["kept_prompts"]
        ),
        (&json!(true), &json!(0), &json!(0)),
        "{status}"
    );
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    upstream.stop();
}

#[test]
fn an_unreachable_upstream_is_a_502_naming_it() {
    let root = test_root("proxy-down");
    // A port nothing listens on.
    let upstream = format!("http://127.0.0.1:{}/v1", free_port());
    let port = free_port();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\nupstream = \"{upstream}\"\n"
    );
    let mut daemon = Daemon::start(&root, &config, &[]);
    let r = openai_session(
        &format!("http://127.0.0.1:{port}/v1"),
        TOKEN,
        &[json!(["chat", {"model": "up", "user": "priya", "messages": [user("Hello?")]}])],
    );
    assert_eq!(r[0]["error"]["status"], 502, "{:#}", r[0]);
    let message = r[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains(&upstream), "{message}");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    // Nothing was appended.
    let store = Store::open(&daemon.data).unwrap();
    assert_eq!(store.stream("priya").unwrap().map(|s| s.log_len), None);
}

#[test]
fn without_an_upstream_the_daemons_model_answers() {
    let root = test_root("proxy-local");
    let port = free_port();
    let config = format!("[proxy]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\n");
    // The default idle time: no memory step between the two requests.
    let mut daemon = Daemon::start(&root, &config, &[]);
    let question = [user("What is the capital of France? Answer in one word.")];
    let base = format!("http://127.0.0.1:{port}/v1");
    let r = openai_session(
        &base,
        TOKEN,
        &[
            json!(["chat", {"model": "local", "user": "ana", "messages": question, "max_tokens": 24}]),
            json!(["stream", {"model": "local", "user": "ana", "messages": question, "max_tokens": 24}]),
        ],
    );
    let answer = r[0]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{:#}", r[0]));
    assert!(!answer.trim().is_empty(), "{:#}", r[0]);
    // Greedy: the streamed reply is the same.
    assert_eq!(r[1]["content"], answer, "{r:#?}");
    let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
    let models: serde_json::Value = agent
        .get(&format!("{base}/models"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    assert_eq!(models["data"][0]["owned_by"], "memagent", "{models}");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    let store = Store::open(&daemon.data).unwrap();
    let stream = store.require("ana").unwrap();
    let log = String::from_utf8(store.read_log(&stream, 0, stream.log_len).unwrap()).unwrap();
    let turn = format!(
        "user: {}\nassistant: {}\n",
        question[0]["content"].as_str().unwrap(),
        answer.trim_end()
    );
    assert_eq!(log, turn.repeat(2));
}

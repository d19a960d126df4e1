//! The remote backend against a loopback HTTP server that speaks the chat-completions
//! protocol (a stand-in for vLLM, SGLang, llama.cpp's server or Ollama) and records what
//! it receives.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use memagent_agent::{
    chunk_text, MemoryAgent, OpenAiBackend, Profile, RemoteOptions, RemoteTokenizer, TextTokenizer,
    FINAL_BOXED, NO_MEMORY, UPDATE,
};
use memagent_engine::Tokenizer;
use serde_json::{json, Value};

use crate::support;

#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    path: String,
    body: Value,
    authorization: Option<String>,
}

type Handler = dyn Fn(&Recorded, usize) -> (u16, String) + Send + Sync;

/// A server on 127.0.0.1 that answers each request with `handler(request, number)`.
struct Loopback {
    url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl Loopback {
    fn start(handler: Box<Handler>) -> Self {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind loopback"));
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let server = Arc::clone(&server);
            let requests = Arc::clone(&requests);
            std::thread::spawn(move || {
                for mut request in server.incoming_requests() {
                    let mut text = String::new();
                    request.as_reader().read_to_string(&mut text).unwrap();
                    let recorded = Recorded {
                        method: request.method().to_string(),
                        path: request.url().to_string(),
                        body: serde_json::from_str(&text).unwrap_or(Value::Null),
                        authorization: request
                            .headers()
                            .iter()
                            .find(|h| h.field.equiv("Authorization"))
                            .map(|h| h.value.to_string()),
                    };
                    let n = {
                        let mut all = requests.lock().unwrap();
                        all.push(recorded.clone());
                        all.len()
                    };
                    let (status, body) = handler(&recorded, n);
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                    let response = tiny_http::Response::from_string(body)
                        .with_status_code(status)
                        .with_header(header);
                    let _ = request.respond(response);
                }
            })
        };
        Self {
            url: format!("http://127.0.0.1:{port}/v1"),
            requests,
            server,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    fn backend(&self) -> OpenAiBackend {
        let mut options = RemoteOptions::new(&self.url, "RL-MemoryAgent-14B");
        options.backoff = Duration::from_millis(5);
        options.retries = 3;
        options.timeout = Duration::from_secs(30);
        OpenAiBackend::new(options).unwrap()
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn chat_reply(content: &str) -> String {
    json!({
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    })
    .to_string()
}

/// The default model's tokenizer (read from the GGUF header, without weights).
fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&support::model_path()).unwrap()
}

fn document() -> String {
    let sentences = [
        "Ada keeps bees behind the old mill.",
        "The ferry leaves at dawn and returns after dark.",
        "Our team chose the blue logo after a long debate.",
        "Nobody remembers who planted the walnut tree.",
    ];
    sentences
        .iter()
        .cycle()
        .take(24)
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn requests_carry_exactly_the_filled_templates() {
    let server = Loopback::start(Box::new(|req, _| {
        let content = req.body["messages"][0]["content"].as_str().unwrap_or("");
        if content.starts_with("You are presented with a problem, a section") {
            // Each memory names the chunk it read, so the next prompt must carry it.
            let section = content.split("<section>\n").nth(1).unwrap_or("");
            let words: Vec<&str> = section.split_whitespace().take(3).collect();
            (
                200,
                chat_reply(&format!("memory after: {}", words.join(" "))),
            )
        } else {
            (200, chat_reply("I read it all. \\boxed{the blue logo}"))
        }
    }));
    let mut options = RemoteOptions::new(&server.url, "RL-MemoryAgent-14B");
    options.api_key = Some("sk-test".to_string());
    let backend = OpenAiBackend::new(options).unwrap();
    let tokenizer = tokenizer();
    let profile = Profile {
        chunk_tokens: 64,
        memory_tokens: 48,
        answer_tokens: 32,
    };
    let agent = MemoryAgent::new(&backend, &tokenizer, profile);
    let question = "Which logo did the team choose?";
    let doc = document();
    let run = agent.run(&doc, question, &mut |_| {}).unwrap();
    assert_eq!(run.final_answer.answer, "the blue logo");

    let chunks = chunk_text(&tokenizer, &doc, 64).unwrap();
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    let requests = server.requests();
    assert_eq!(
        requests.len(),
        chunks.len() + 1,
        "one request per chunk, one final"
    );
    let mut memory = NO_MEMORY.to_string();
    for (i, chunk) in chunks.iter().enumerate() {
        let req = &requests[i];
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/v1/chat/completions");
        assert_eq!(req.authorization.as_deref(), Some("Bearer sk-test"));
        assert_eq!(req.body["model"], "RL-MemoryAgent-14B");
        assert_eq!(req.body["max_tokens"], 48);
        assert_eq!(req.body["temperature"], 0.0);
        let expected =
            json!([{"role": "user", "content": UPDATE.fill(question, &memory, &chunk.text)}]);
        assert_eq!(req.body["messages"], expected, "step {}", i + 1);
        memory = run.steps[i].memory.clone();
        assert!(memory.starts_with("memory after: "), "{memory}");
    }
    let last = requests.last().unwrap();
    assert_eq!(
        last.body["messages"],
        json!([{"role": "user", "content": FINAL_BOXED.fill(question, &memory, "")}])
    );
    assert_eq!(last.body["max_tokens"], 32);
}

#[test]
fn retries_after_503_then_succeeds() {
    let server = Loopback::start(Box::new(|_, n| {
        if n <= 2 {
            (
                503,
                r#"{"error": {"message": "server is warming up"}}"#.to_string(),
            )
        } else {
            (200, chat_reply("\\boxed{7}"))
        }
    }));
    let backend = server.backend();
    let tokenizer = tokenizer();
    let agent = MemoryAgent::new(&backend, &tokenizer, Profile::PAPER);
    let answer = agent.answer("What number?", "The number is 7.").unwrap();
    assert_eq!(answer.answer, "7");
    assert_eq!(server.requests().len(), 3, "two 503s, then the answer");
}

#[test]
fn gives_up_after_the_retries_and_says_why() {
    let server = Loopback::start(Box::new(|_, _| {
        (503, r#"{"error": {"message": "overloaded"}}"#.to_string())
    }));
    let backend = server.backend();
    let tokenizer = tokenizer();
    let agent = MemoryAgent::new(&backend, &tokenizer, Profile::PAPER);
    let err = agent
        .answer("What number?", "memory")
        .unwrap_err()
        .to_string();
    assert!(err.contains("503") && err.contains("overloaded"), "{err}");
    assert!(err.contains("4 attempts"), "{err}");
    assert_eq!(server.requests().len(), 4);
}

#[test]
fn a_400_is_reported_clearly_without_retrying() {
    let server = Loopback::start(Box::new(|_, _| {
        let body = json!({"error": {"message": "max_tokens must be at most 512",
                                    "type": "BadRequestError"}});
        (400, body.to_string())
    }));
    let backend = server.backend();
    let tokenizer = tokenizer();
    let agent = MemoryAgent::new(&backend, &tokenizer, Profile::PAPER);
    let err = agent
        .answer("What number?", "memory")
        .unwrap_err()
        .to_string();
    assert!(err.contains("400"), "{err}");
    assert!(err.contains("max_tokens must be at most 512"), "{err}");
    assert!(err.contains("/v1/chat/completions"), "{err}");
    assert_eq!(server.requests().len(), 1, "a 400 is not retried");
}

#[test]
fn chunks_through_the_servers_tokenize_endpoint() {
    let local = Arc::new(tokenizer());
    let served = Arc::clone(&local);
    let server = Loopback::start(Box::new(move |req, _| match req.path.as_str() {
        "/tokenize" => {
            let text = req.body["prompt"].as_str().unwrap();
            let ids = served.encode(text, false).unwrap();
            (200, json!({"tokens": ids, "count": ids.len()}).to_string())
        }
        "/detokenize" => {
            let ids: Vec<u32> = serde_json::from_value(req.body["tokens"].clone()).unwrap();
            (
                200,
                json!({"prompt": served.decode(&ids).unwrap()}).to_string(),
            )
        }
        _ => (404, "{}".to_string()),
    }));
    let backend = server.backend();
    let remote = RemoteTokenizer::connect(&backend).unwrap();
    let doc = document();
    let through_server = chunk_text(&remote, &doc, 64).unwrap();
    let here = chunk_text(local.as_ref(), &doc, 64).unwrap();
    assert_eq!(through_server, here);
    assert!(server.requests().iter().any(|r| r.path == "/detokenize"));
}

#[test]
fn a_server_without_tokenize_asks_for_a_local_tokenizer() {
    let server = Loopback::start(Box::new(|_, _| {
        (404, r#"{"detail":"Not Found"}"#.to_string())
    }));
    let backend = server.backend();
    let err = RemoteTokenizer::connect(&backend)
        .err()
        .expect("no /tokenize")
        .to_string();
    assert!(
        err.contains("/tokenize") || err.contains("tokenize"),
        "{err}"
    );
    assert!(err.contains("--tokenizer"), "{err}");
}

#[test]
fn context_length_from_models_drives_the_budget_check() {
    let server = Loopback::start(Box::new(|req, _| {
        if req.path == "/v1/models" {
            let body = json!({"object": "list", "data": [
                {"id": "other", "max_model_len": 131072},
                {"id": "RL-MemoryAgent-14B", "max_model_len": 4096}]});
            (200, body.to_string())
        } else {
            (200, chat_reply("memory"))
        }
    }));
    let mut backend = server.backend();
    backend.discover();
    assert_eq!(backend.options().context_length, Some(4096));
    assert_eq!(backend.options().parameters, None);
    let tokenizer = tokenizer();
    let agent = MemoryAgent::new(&backend, &tokenizer, Profile::PAPER);
    let err = agent.budget("What number?").unwrap_err().to_string();
    assert!(err.contains("4096"), "{err}");
    assert!(err.contains("--chunk-tokens"), "{err}");
}

#[test]
fn a_llama_cpp_server_tells_the_model_size_and_its_context() {
    // llama.cpp's server: one model under its file name, its size in `meta`, the
    // context it was started with (-c) in /props.
    let server = Loopback::start(Box::new(|req, _| match req.path.as_str() {
        "/v1/models" => {
            let body = json!({"object": "list", "data": [{
                "id": "models/SmolLM2-135M-Instruct.Q4_1.gguf", "object": "model",
                "meta": {"n_params": 134_515_008u64, "n_ctx_train": 8192, "n_vocab": 49152}}]});
            (200, body.to_string())
        }
        "/props" => (
            200,
            json!({"default_generation_settings": {"n_ctx": 6144}}).to_string(),
        ),
        _ => (404, json!({"error": "not found"}).to_string()),
    }));
    let mut backend = server.backend();
    backend.discover();
    assert_eq!(backend.options().parameters, Some(134_515_008));
    assert_eq!(backend.options().context_length, Some(6144));
}

/// A reply longer than M tokens is cut at M, and the line the cut left unfinished goes.
#[test]
fn memory_is_cut_to_the_cap_and_loses_its_unfinished_line() {
    let long: String = (1..=40)
        .map(|i| format!("{i}. Fact {i} is about the harbour.\n"))
        .collect();
    let reply = long.clone();
    let server = Loopback::start(Box::new(move |_, _| (200, chat_reply(&reply))));
    let backend = server.backend();
    let tokenizer = tokenizer();
    let profile = Profile {
        chunk_tokens: 64,
        memory_tokens: 20,
        answer_tokens: 16,
    };
    let agent = MemoryAgent::new(&backend, &tokenizer, profile);
    let chunk = &chunk_text(&tokenizer, "A short chunk.", 64).unwrap()[0];
    let step = agent.update("Anything?", NO_MEMORY, chunk).unwrap();
    assert!(step.cut);
    let cut_at_m = TextTokenizer::decode(
        &tokenizer,
        &TextTokenizer::encode(&tokenizer, &long).unwrap()[..20],
    )
    .unwrap();
    assert!(!cut_at_m.ends_with('\n'), "{cut_at_m:?}");
    let kept = &cut_at_m[..=cut_at_m.rfind('\n').unwrap()];
    assert_eq!(step.memory, kept);
    assert_eq!(
        TextTokenizer::encode(&tokenizer, &step.memory)
            .unwrap()
            .len(),
        step.memory_tokens
    );
    assert!(step.memory_tokens < 20);
    assert!(step.repaired.unwrap().contains("cut at M"));
}

/// Server-sent chat-completion events of `pieces` (one content event each), then the
/// `tail` events; a reader, so that an endless stream is written only as fast as the
/// connection takes it.
struct EventStream {
    events: Box<dyn Iterator<Item = String> + Send>,
    pending: Vec<u8>,
    written: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::io::Read for EventStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() {
            match self.events.next() {
                Some(event) => {
                    self.written
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    self.pending = format!("data: {event}\n\n").into_bytes();
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
}

fn content_event(text: &str) -> String {
    json!({"object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    .to_string()
}

/// Serves one streamed reply made of `events`; returns the base URL, how many events
/// were handed to the connection, and a flag set once the response is over (the whole
/// stream written, or the client gone).
fn serve_stream(
    events: impl Iterator<Item = String> + Send + 'static,
) -> (
    String,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<Mutex<Value>>,
) {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind loopback");
    let port = server.server_addr().to_ip().unwrap().port();
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let body = Arc::new(Mutex::new(Value::Null));
    let (w, o, b) = (Arc::clone(&written), Arc::clone(&over), Arc::clone(&body));
    std::thread::spawn(move || {
        let mut request = server.recv().unwrap();
        let mut text = String::new();
        request.as_reader().read_to_string(&mut text).unwrap();
        *b.lock().unwrap() = serde_json::from_str(&text).unwrap();
        let reader = EventStream {
            events: Box::new(events),
            pending: Vec::new(),
            written: w,
        };
        let header = tiny_http::Header::from_bytes("Content-Type", "text/event-stream").unwrap();
        let response = tiny_http::Response::new(200.into(), vec![header], reader, None, None);
        let _ = request.respond(response);
        o.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    (format!("http://127.0.0.1:{port}/v1"), written, over, body)
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

const ENDLESS: usize = 2_000_000;

#[test]
fn a_looping_stream_is_cut_at_the_repeated_line_and_the_connection_closed() {
    // A small model's favourite loop: the same fact under ever new numbers, token by token.
    let pieces = |n: usize| {
        vec![
            n.to_string(),
            ".".into(),
            " Ingrid".into(),
            " lives".into(),
            " in".into(),
            " Porto".into(),
            ".".into(),
            "\n".into(),
        ]
    };
    let events = (1..ENDLESS).flat_map(move |n| pieces(n).into_iter().map(|p| content_event(&p)));
    let (url, written, over, body) = serve_stream(events);
    let backend = OpenAiBackend::new(RemoteOptions::new(url, "served")).unwrap();
    let tokenizer = tokenizer();
    let agent = MemoryAgent::new(&backend, &tokenizer, Profile::SMALL);
    let chunk = &chunk_text(&tokenizer, "Ingrid moved to Porto.", 64).unwrap()[0];
    let step = agent
        .update("Where does Ingrid live?", NO_MEMORY, chunk)
        .unwrap();
    assert_eq!(step.memory, "1. Ingrid lives in Porto.\n");
    assert_eq!(step.stop_reason, memagent_engine::StopReason::Repetition);
    assert_eq!(
        step.completion_tokens, 16,
        "two lines of 8 events were read"
    );
    let sent = body.lock().unwrap().clone();
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"]["include_usage"], true);
    // The client hung up: the server stops long before the end of its stream.
    wait_until("the server sees the client go", || {
        over.load(std::sync::atomic::Ordering::SeqCst)
    });
    let handed = written.load(std::sync::atomic::Ordering::SeqCst);
    assert!(handed < ENDLESS / 10, "{handed} events were written");
}

#[test]
fn a_token_loop_without_newlines_is_cut_after_the_guard_span() {
    let words = [" the", " cat", " sat"];
    let events = (0..ENDLESS).map(move |i| content_event(words[i % 3]));
    let (url, _, over, _) = serve_stream(events);
    let backend = OpenAiBackend::new(RemoteOptions::new(url, "served")).unwrap();
    let tokenizer = tokenizer();
    let agent = MemoryAgent::new(&backend, &tokenizer, Profile::SMALL);
    let answer = agent
        .answer("What did the cat do?", "The cat sat.")
        .unwrap();
    // The guard is 16 events: at 32 the last 16 repeat, and they are dropped.
    let expected: String = (0..16).map(|i| words[i % 3]).collect();
    assert_eq!(answer.reply, expected);
    assert_eq!(answer.stop_reason, memagent_engine::StopReason::Repetition);
    wait_until("the server sees the client go", || {
        over.load(std::sync::atomic::Ordering::SeqCst)
    });
}

#[test]
fn a_finished_stream_keeps_usage_timings_and_the_finish_reason() {
    let mut events: Vec<String> = ["Ada", " keeps", " bees", "."]
        .iter()
        .map(|p| content_event(p))
        .collect();
    events.push(
        json!({"object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        .to_string(),
    );
    events.push(
        json!({"object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 321, "completion_tokens": 4, "total_tokens": 325},
               "timings": {"prompt_n": 321, "prompt_ms": 1500.0, "predicted_n": 4,
                           "predicted_ms": 250.0}})
        .to_string(),
    );
    events.push("[DONE]".to_string());
    let (url, written, _, _) = serve_stream(events.into_iter());
    let backend = OpenAiBackend::new(RemoteOptions::new(url, "served")).unwrap();
    let options = memagent_engine::GenerateOptions {
        max_new_tokens: 4,
        stop_on_repeated_line: true,
        ..Default::default()
    };
    let reply = memagent_agent::Backend::complete(&backend, "Who keeps bees?", &options).unwrap();
    assert_eq!(reply.text, "Ada keeps bees.");
    assert_eq!(reply.stop_reason, memagent_engine::StopReason::MaxTokens);
    assert_eq!((reply.prompt_tokens, reply.completion_tokens), (321, 4));
    let timings = reply.timings.expect("llama.cpp timings");
    assert_eq!(timings.prefill_seconds, 1.5);
    assert_eq!(timings.decode_seconds, 0.25);
    assert_eq!(written.load(std::sync::atomic::Ordering::SeqCst), 7);
}

#[test]
fn a_batch_of_steps_is_sent_at_once_and_each_reply_lands_on_its_step() {
    // Each request is answered on its own thread once all three are in flight, so a
    // client that sent them one by one would see "alone" replies after a 10 s wait.
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind loopback"));
    let port = server.server_addr().to_ip().expect("an IP address").port();
    let in_flight = Arc::new((Mutex::new(0usize), std::sync::Condvar::new()));
    let thread = {
        let server = Arc::clone(&server);
        std::thread::spawn(move || {
            for mut request in server.incoming_requests() {
                let in_flight = Arc::clone(&in_flight);
                std::thread::spawn(move || {
                    let mut text = String::new();
                    request.as_reader().read_to_string(&mut text).unwrap();
                    let body: Value = serde_json::from_str(&text).unwrap();
                    let content = body["messages"][0]["content"].as_str().unwrap_or("");
                    let section = content.split("<section>\n").nth(1).unwrap_or("");
                    let word = section.split_whitespace().next().unwrap_or("").to_string();
                    let (count, all_in) = &*in_flight;
                    let mut n = count.lock().unwrap();
                    *n += 1;
                    all_in.notify_all();
                    let (_n, wait) = all_in
                        .wait_timeout_while(n, Duration::from_secs(10), |n| *n < 3)
                        .unwrap();
                    let how = if wait.timed_out() {
                        "alone"
                    } else {
                        "together"
                    };
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                    let reply = chat_reply(&format!("{how} read {word}"));
                    let _ = request
                        .respond(tiny_http::Response::from_string(reply).with_header(header));
                });
            }
        })
    };
    let mut options = RemoteOptions::new(format!("http://127.0.0.1:{port}/v1"), "served");
    options.timeout = Duration::from_secs(30);
    let backend = OpenAiBackend::new(options).unwrap();
    let tokenizer = tokenizer();
    let agent = MemoryAgent::new(&backend, &tokenizer, Profile::SMALL);
    let chunks: Vec<memagent_agent::Chunk> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|w| memagent_agent::Chunk {
            text: format!("{w} is the word of this section."),
            tokens: 8,
        })
        .collect();
    let steps: Vec<(&str, &str, &memagent_agent::Chunk)> = chunks
        .iter()
        .map(|c| ("Which words appear?", NO_MEMORY, c))
        .collect();
    let reports = agent.update_many(UPDATE, &steps).unwrap();
    let memories: Vec<&str> = reports.iter().map(|r| r.memory.as_str()).collect();
    assert_eq!(
        memories,
        [
            "together read alpha",
            "together read beta",
            "together read gamma"
        ]
    );
    server.unblock();
    thread.join().unwrap();
}

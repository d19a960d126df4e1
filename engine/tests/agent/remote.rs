//! The remote backend against a loopback HTTP server that speaks the chat-completions
//! protocol (a stand-in for vLLM, SGLang, llama.cpp's server or Ollama) and records what
//! it receives.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use memagent_engine::agent::{
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

#[test]
fn memory_is_cut_to_the_cap_at_a_token_boundary() {
    let long = "word ".repeat(200);
    let server = Loopback::start(Box::new(move |_, _| (200, chat_reply(&long))));
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
    assert_eq!(step.memory_tokens, 20);
    assert_eq!(
        TextTokenizer::encode(&tokenizer, &step.memory)
            .unwrap()
            .len(),
        20
    );
    assert!("word ".repeat(200).starts_with(&step.memory));
}

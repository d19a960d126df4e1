//! The remote backend: any OpenAI-compatible chat-completions server (vLLM, SGLang,
//! llama.cpp's server, Ollama). Requests time out, and 429/5xx answers and transport
//! failures are retried with exponential backoff (honouring `Retry-After`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::backend::{Backend, Completion, TextTokenizer, Timings};
use crate::error::{Error, Result};
use memagent_engine::{GenerateOptions, StopReason};

/// How to reach the server.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Base URL of the OpenAI API, e.g. `http://gpu-box:8000/v1`.
    pub base_url: String,
    /// The served model's name (`model` in each request).
    pub model: String,
    /// Sent as `Authorization: Bearer …` when given.
    pub api_key: Option<String>,
    /// Limit for one whole request, including reading the reply.
    pub timeout: Duration,
    /// Retries after the first attempt, on 429, 5xx and transport errors.
    pub retries: u32,
    /// First wait between attempts; doubled after each.
    pub backoff: Duration,
    /// The model's context in tokens; when absent, asked by [`OpenAiBackend::discover`].
    pub context_length: Option<usize>,
    /// The served model's parameter count, when known (it chooses the loop's profile);
    /// llama.cpp's server reports it, see [`OpenAiBackend::discover`].
    pub parameters: Option<usize>,
}

impl RemoteOptions {
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Duration::from_secs(600),
            retries: 5,
            backoff: Duration::from_millis(500),
            context_length: None,
            parameters: None,
        }
    }
}

/// A chat-completions client for one served model.
pub struct OpenAiBackend {
    options: RemoteOptions,
    agent: ureq::Agent,
}

/// Longest wait between two attempts, whatever the server asks.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

impl OpenAiBackend {
    /// A client; nothing is sent until the first request.
    pub fn new(options: RemoteOptions) -> Result<Self> {
        if !(options.base_url.starts_with("http://") || options.base_url.starts_with("https://")) {
            return Err(Error::InvalidRequest(format!(
                "base URL `{}` must start with http:// or https://",
                options.base_url
            )));
        }
        if options.model.trim().is_empty() {
            return Err(Error::InvalidRequest(
                "the remote model name is empty; pass the served model's name".to_string(),
            ));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(options.timeout))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Self { options, agent })
    }

    pub fn options(&self) -> &RemoteOptions {
        &self.options
    }

    fn api_url(&self, path: &str) -> String {
        format!("{}/{path}", self.options.base_url.trim_end_matches('/'))
    }

    /// The server's root: the base URL without its `/v1` (where vLLM and llama.cpp serve
    /// `/tokenize`).
    fn root_url(&self, path: &str) -> String {
        let base = self.options.base_url.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        format!("{root}/{path}")
    }

    /// Fills in what the server says about the served model and was not given: the
    /// context length (`max_model_len` in vLLM's `/models`, else `n_ctx` of llama.cpp's
    /// `/props`) and the parameter count (`meta.n_params` in llama.cpp's `/models`). The
    /// model is the `/models` entry of that name, or the only entry (llama.cpp serves one
    /// model under its file name). Nothing is required: servers that say less leave
    /// these unknown.
    pub fn discover(&mut self) {
        if self.options.context_length.is_some() && self.options.parameters.is_some() {
            return;
        }
        let url = self.api_url("models");
        match self.request(&url, None) {
            Ok(models) => {
                let list = models["data"].as_array().map(Vec::as_slice).unwrap_or(&[]);
                let entry = list
                    .iter()
                    .find(|m| m["id"].as_str() == Some(&self.options.model))
                    .or(if list.len() == 1 { list.first() } else { None });
                if let Some(entry) = entry {
                    let number = |v: &Value| v.as_u64().map(|n| n as usize);
                    self.options.context_length = self
                        .options
                        .context_length
                        .or_else(|| number(&entry["max_model_len"]));
                    self.options.parameters = self
                        .options
                        .parameters
                        .or_else(|| number(&entry["meta"]["n_params"]));
                }
            }
            Err(e) => {
                // The server is down or not OpenAI-like: asking it more only waits longer.
                tracing::debug!("cannot ask {url} about the model: {e}");
                return;
            }
        }
        if self.options.context_length.is_none() {
            let url = self.root_url("props");
            match self.request(&url, None) {
                Ok(props) => {
                    self.options.context_length = props["default_generation_settings"]["n_ctx"]
                        .as_u64()
                        .or_else(|| props["n_ctx"].as_u64())
                        .map(|n| n as usize);
                }
                Err(e) => tracing::debug!("cannot ask {url} for the context length: {e}"),
            }
        }
    }

    /// Sends one request (POST with `body`, else GET), retrying what can be retried, and
    /// parses the JSON answer.
    fn request(&self, url: &str, body: Option<&Value>) -> Result<Value> {
        self.send(url, body, &mut |_, reply| read_json(url, reply))
    }

    /// Sends one request and hands a successful answer (its content type and body) to
    /// `read`; 429, 5xx and transport failures, while sending or in `read`, start over.
    fn send<T>(
        &self,
        url: &str,
        body: Option<&Value>,
        read: &mut dyn FnMut(&str, &mut ureq::Body) -> std::result::Result<T, Attempt>,
    ) -> Result<T> {
        let mut wait = self.options.backoff;
        let mut attempt = 0;
        loop {
            let outcome = self.attempt(url, body, read);
            let retry_after = match &outcome {
                Err(Attempt::Retry { retry_after, .. }) => *retry_after,
                _ => None,
            };
            match outcome {
                Ok(value) => return Ok(value),
                Err(Attempt::Fail(e)) => return Err(e),
                Err(Attempt::Retry { error, .. }) if attempt >= self.options.retries => {
                    return Err(Error::Remote(format!(
                        "{error} (gave up after {} attempts)",
                        attempt + 1
                    )));
                }
                Err(Attempt::Retry { error, .. }) => {
                    let pause = retry_after.unwrap_or(wait).min(MAX_BACKOFF);
                    tracing::warn!("{error}; retrying in {:.1}s", pause.as_secs_f64());
                    std::thread::sleep(pause);
                    wait = (wait * 2).min(MAX_BACKOFF);
                    attempt += 1;
                }
            }
        }
    }

    fn attempt<T>(
        &self,
        url: &str,
        body: Option<&Value>,
        read: &mut dyn FnMut(&str, &mut ureq::Body) -> std::result::Result<T, Attempt>,
    ) -> std::result::Result<T, Attempt> {
        let sent = match body {
            Some(body) => {
                let mut req = self.agent.post(url);
                if let Some(key) = &self.options.api_key {
                    req = req.header("Authorization", &format!("Bearer {key}"));
                }
                req.send_json(body)
            }
            None => {
                let mut req = self.agent.get(url);
                if let Some(key) = &self.options.api_key {
                    req = req.header("Authorization", &format!("Bearer {key}"));
                }
                req.call()
            }
        };
        let mut response = sent.map_err(|e| Attempt::Retry {
            error: format!("request to {url} failed: {e}"),
            retry_after: None,
        })?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            return read(&content_type, response.body_mut());
        }
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| reading_failed(url, e))?;
        let message = server_message(&text);
        if status == 429 || status >= 500 {
            return Err(Attempt::Retry {
                error: format!("{url} answered {status}: {message}"),
                retry_after,
            });
        }
        Err(Attempt::Fail(Error::RemoteStatus {
            url: url.to_string(),
            status,
            message,
        }))
    }

    /// One streamed reply (server-sent events), read until the server ends it or `stop`
    /// says the reply started looping; then the connection is closed, which makes vLLM
    /// and llama.cpp's server stop generating.
    fn stream(&self, url: &str, body: &Value, options: &GenerateOptions) -> Result<StreamedReply> {
        self.send(url, Some(body), &mut |content_type, reply| {
            let start = Instant::now();
            if !content_type.contains("text/event-stream") {
                // A server that ignores `stream` answers in one piece.
                return Ok(StreamedReply::whole(read_json(url, reply)?));
            }
            let mut out = StreamedReply {
                stop: LoopStop::new(options.stop_on_repeat, options.stop_on_repeated_line),
                ..StreamedReply::default()
            };
            let reader = std::io::BufReader::new(reply.as_reader());
            for line in std::io::BufRead::lines(reader) {
                let line = line.map_err(|e| reading_failed(url, e))?;
                let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                    continue; // blank separators, comments, `event:` lines
                };
                if data == "[DONE]" {
                    break;
                }
                let event: Value = serde_json::from_str(data).map_err(|e| {
                    Attempt::Fail(Error::Remote(format!(
                        "{url} streamed an event that is not JSON ({e}): {}",
                        snippet(data)
                    )))
                })?;
                if !event["error"].is_null() {
                    return Err(Attempt::Fail(Error::Remote(format!(
                        "{url} reported an error while streaming: {}",
                        server_message(data)
                    ))));
                }
                out.read_event(&event, start);
                if out.stopped {
                    break;
                }
            }
            out.seconds = start.elapsed().as_secs_f64();
            Ok(out)
        })
    }
}

fn reading_failed(url: &str, e: impl std::fmt::Display) -> Attempt {
    Attempt::Retry {
        error: format!("reading the answer of {url} failed: {e}"),
        retry_after: None,
    }
}

fn read_json(url: &str, reply: &mut ureq::Body) -> std::result::Result<Value, Attempt> {
    let text = reply.read_to_string().map_err(|e| reading_failed(url, e))?;
    serde_json::from_str(&text).map_err(|e| {
        Attempt::Fail(Error::Remote(format!(
            "{url} answered with invalid JSON ({e}): {}",
            snippet(&text)
        )))
    })
}

/// What a streamed reply brought, with the loop check that may have ended it early.
#[derive(Default)]
struct StreamedReply {
    stop: LoopStop,
    /// Content events read (one per token on vLLM and llama.cpp's server).
    deltas: usize,
    finish_reason: Option<String>,
    usage: Value,
    timings: Value,
    /// Seconds from the answer's start to its first content.
    first_content: Option<f64>,
    seconds: f64,
    /// The reply was cut at a loop and the rest not read.
    stopped: bool,
}

impl StreamedReply {
    /// A non-streamed answer in the same shape.
    fn whole(answer: Value) -> Self {
        let choice = &answer["choices"][0];
        let mut stop = LoopStop::default();
        if let Some(text) = choice["message"]["content"].as_str() {
            stop.text.push_str(text);
        }
        Self {
            stop,
            finish_reason: choice["finish_reason"].as_str().map(str::to_string),
            usage: answer["usage"].clone(),
            timings: answer["timings"].clone(),
            ..Self::default()
        }
    }

    fn read_event(&mut self, event: &Value, start: Instant) {
        let choice = &event["choices"][0];
        if let Some(delta) = choice["delta"]["content"].as_str() {
            if !delta.is_empty() {
                self.first_content
                    .get_or_insert_with(|| start.elapsed().as_secs_f64());
                self.deltas += 1;
                self.stopped = self.stop.push(delta);
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_string());
        }
        if event["usage"].is_object() {
            self.usage = event["usage"].clone();
        }
        if event["timings"].is_object() {
            self.timings = event["timings"].clone();
        }
    }
}

/// The local model's loop stops applied to streamed text: a content event stands for a
/// token (the span check compares runs of events), and a completed line that repeats an
/// earlier one ends the reply without it.
#[derive(Default)]
struct LoopStop {
    span: Option<usize>,
    lines: bool,
    text: String,
    /// Each event as a number (equal texts, equal numbers) and where it starts in `text`.
    events: Vec<u32>,
    starts: Vec<usize>,
    ids: std::collections::HashMap<String, u32>,
}

impl LoopStop {
    fn new(span: Option<usize>, lines: bool) -> Self {
        Self {
            span,
            lines,
            ..Self::default()
        }
    }

    /// Adds one event's text; true when the reply loops (the text is then cut).
    fn push(&mut self, delta: &str) -> bool {
        let before = self.text.len();
        self.text.push_str(delta);
        if let Some(span) = self.span {
            let next = self.ids.len() as u32;
            let id = *self.ids.entry(delta.to_string()).or_insert(next);
            self.events.push(id);
            self.starts.push(before);
            if let Some(keep) = memagent_engine::repeated_tail(&self.events, span) {
                self.text.truncate(self.starts[keep]);
                return true;
            }
        }
        if self.lines {
            let ends: Vec<usize> = self.text[before..]
                .match_indices('\n')
                .map(|(i, _)| before + i + 1)
                .collect();
            for end in ends {
                if let Some(keep) = super::hygiene::repeated_last_line(&self.text[..end]) {
                    self.text.truncate(keep);
                    return true;
                }
            }
        }
        false
    }
}

enum Attempt {
    Retry {
        error: String,
        retry_after: Option<Duration>,
    },
    Fail(Error),
}

/// The `error.message` of an OpenAI-style error body, else the start of the body.
fn server_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v["error"]["message"]
                .as_str()
                .or_else(|| v["error"].as_str())
                .or_else(|| v["message"].as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| snippet(text))
}

fn snippet(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

impl Backend for OpenAiBackend {
    fn model_name(&self) -> String {
        self.options.model.clone()
    }

    fn context_length(&self) -> Option<usize> {
        self.options.context_length
    }

    fn chat_prompt_tokens(&self, _user_message: &str) -> Result<Option<usize>> {
        // The server applies the chat template; its exact token count is not known here.
        Ok(None)
    }

    /// Sends the messages at once, one request each: a server that batches (vLLM,
    /// SGLang, llama.cpp with several slots) decodes them together.
    fn complete_batch(
        &self,
        user_messages: &[String],
        options: &GenerateOptions,
    ) -> Result<Vec<Completion>> {
        if user_messages.len() == 1 {
            return Ok(vec![self.complete(&user_messages[0], options)?]);
        }
        std::thread::scope(|scope| {
            let requests: Vec<_> = user_messages
                .iter()
                .map(|message| scope.spawn(move || self.complete(message, options)))
                .collect();
            requests
                .into_iter()
                .map(|request| request.join().expect("a request thread panicked"))
                .collect()
        })
    }

    fn complete(&self, user_message: &str, options: &GenerateOptions) -> Result<Completion> {
        let start = Instant::now();
        // Streamed when the reply may have to be cut at a loop: reading stops there.
        let stream = options.stop_on_repeat.is_some() || options.stop_on_repeated_line;
        let mut body = json!({
            "model": self.options.model,
            "messages": [{"role": "user", "content": user_message}],
            "max_tokens": options.max_new_tokens,
            "temperature": options.sampling.temperature,
            "stream": stream,
        });
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if options.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if options.sampling.temperature > 0.0 {
            body["top_p"] = json!(options.sampling.top_p);
            body["seed"] = json!(options.sampling.seed);
        }
        let url = self.api_url("chat/completions");
        let reply = if stream {
            self.stream(&url, &body, options)?
        } else {
            let answer = self.request(&url, Some(&body))?;
            let choice = &answer["choices"][0];
            if !(choice["message"]["content"].is_string()
                || (choice.is_object() && choice["message"]["content"].is_null()))
            {
                return Err(Error::Remote(format!(
                    "{url} answered without choices[0].message.content: {}",
                    snippet(&answer.to_string())
                )));
            }
            StreamedReply::whole(answer)
        };
        let stop_reason = if reply.stopped {
            StopReason::Repetition
        } else if reply.finish_reason.as_deref() == Some("length") {
            StopReason::MaxTokens
        } else {
            StopReason::EndOfTurn
        };
        let usage = |key: &str| reply.usage[key].as_u64().map(|n| n as usize);
        let seconds = start.elapsed().as_secs_f64();
        let ms = |key: &str| reply.timings[key].as_f64().map(|ms| ms / 1000.0);
        // llama.cpp's server times both phases; otherwise the first streamed content
        // marks the end of the prefill.
        let timings = match (ms("prompt_ms"), ms("predicted_ms")) {
            (Some(prefill_seconds), Some(decode_seconds)) if !reply.stopped => Some(Timings {
                prefill_seconds,
                decode_seconds,
            }),
            _ => reply.first_content.map(|first| Timings {
                prefill_seconds: first,
                decode_seconds: (reply.seconds - first).max(0.0),
            }),
        };
        Ok(Completion {
            prompt_tokens: usage("prompt_tokens").unwrap_or(0),
            completion_tokens: usage("completion_tokens")
                .filter(|_| !reply.stopped)
                .unwrap_or(reply.deltas),
            text: reply.stop.text,
            stop_reason,
            seconds,
            decoding: None,
            timings,
        })
    }
}

/// The server's own tokenizer, through `/tokenize` and `/detokenize` (vLLM and
/// llama.cpp's server have them).
pub struct RemoteTokenizer<'a> {
    backend: &'a OpenAiBackend,
}

impl<'a> RemoteTokenizer<'a> {
    /// Checks that the server can tokenize; a clear error names the alternative.
    pub fn connect(backend: &'a OpenAiBackend) -> Result<Self> {
        let tokenizer = Self { backend };
        tokenizer.encode("memagent")?;
        Ok(tokenizer)
    }

    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let url = self.backend.root_url(path);
        self.backend.request(&url, Some(body)).map_err(|e| match e {
            Error::RemoteStatus { status, .. } if matches!(status, 404 | 405 | 501) => {
                Error::Remote(format!(
                    "the server has no {path} endpoint ({url} answered {status}), so \
                         documents cannot be cut into chunks; pass --tokenizer PATH (the \
                         served model's GGUF or tokenizer.json)"
                ))
            }
            other => other,
        })
    }
}

impl TextTokenizer for RemoteTokenizer<'_> {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let answer = self.call(
            "tokenize",
            &json!({
                "model": self.backend.options.model,
                "prompt": text,
                "content": text,
                "add_special_tokens": false,
            }),
        )?;
        answer["tokens"]
            .as_array()
            .and_then(|ids| {
                ids.iter()
                    .map(|id| id.as_u64().map(|id| id as u32))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or_else(|| {
                Error::Remote(format!(
                    "the server's /tokenize answer has no `tokens` list of ids: {}",
                    snippet(&answer.to_string())
                ))
            })
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        let answer = self.call(
            "detokenize",
            &json!({"model": self.backend.options.model, "tokens": ids}),
        )?;
        answer["prompt"]
            .as_str()
            .or_else(|| answer["content"].as_str())
            .map(str::to_string)
            .ok_or_else(|| {
                Error::Remote(format!(
                    "the server's /detokenize answer has no `prompt` or `content` text: {}",
                    snippet(&answer.to_string())
                ))
            })
    }
}

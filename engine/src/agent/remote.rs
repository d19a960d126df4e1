//! The remote backend: any OpenAI-compatible chat-completions server (vLLM, SGLang,
//! llama.cpp's server, Ollama). Requests time out, and 429/5xx answers and transport
//! failures are retried with exponential backoff (honouring `Retry-After`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::backend::{Backend, Completion, TextTokenizer};
use crate::error::{Error, Result};
use crate::model::{GenerateOptions, StopReason};

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

    /// Sends one request (POST with `body`, else GET), retrying what can be retried.
    fn request(&self, url: &str, body: Option<&Value>) -> Result<Value> {
        let mut wait = self.options.backoff;
        let mut attempt = 0;
        loop {
            let outcome = self.attempt(url, body);
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

    fn attempt(&self, url: &str, body: Option<&Value>) -> std::result::Result<Value, Attempt> {
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
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| Attempt::Retry {
                error: format!("reading the answer of {url} failed: {e}"),
                retry_after: None,
            })?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|e| {
                Attempt::Fail(Error::Remote(format!(
                    "{url} answered {status} with invalid JSON ({e}): {}",
                    snippet(&text)
                )))
            });
        }
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

    fn complete(&self, user_message: &str, options: &GenerateOptions) -> Result<Completion> {
        let start = Instant::now();
        let mut body = json!({
            "model": self.options.model,
            "messages": [{"role": "user", "content": user_message}],
            "max_tokens": options.max_new_tokens,
            "temperature": options.sampling.temperature,
            "stream": false,
        });
        if options.sampling.temperature > 0.0 {
            body["top_p"] = json!(options.sampling.top_p);
            body["seed"] = json!(options.sampling.seed);
        }
        let url = self.api_url("chat/completions");
        let answer = self.request(&url, Some(&body))?;
        let choice = &answer["choices"][0];
        let text = match &choice["message"]["content"] {
            Value::String(s) => s.clone(),
            Value::Null if choice.is_object() => String::new(),
            _ => {
                return Err(Error::Remote(format!(
                    "{url} answered without choices[0].message.content: {}",
                    snippet(&answer.to_string())
                )))
            }
        };
        let stop_reason = match choice["finish_reason"].as_str() {
            Some("length") => StopReason::MaxTokens,
            _ => StopReason::EndOfTurn,
        };
        let usage = |key: &str| answer["usage"][key].as_u64().unwrap_or(0) as usize;
        Ok(Completion {
            text,
            prompt_tokens: usage("prompt_tokens"),
            completion_tokens: usage("completion_tokens"),
            stop_reason,
            seconds: start.elapsed().as_secs_f64(),
            decoding: None,
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

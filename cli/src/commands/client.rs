//! Talking to a running daemon over its Unix socket (HTTP/JSON).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// A connection to the daemon that holds a data directory.
pub struct DaemonClient {
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
}

impl DaemonClient {
    /// The daemon of `data_dir`, when one answers on its socket.
    pub fn connect(data_dir: &Path) -> Option<Self> {
        let socket = memagent_watcher::socket_path(data_dir);
        if !socket.exists() {
            return None;
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        let client = Self { socket, runtime };
        client.get("/v1/ping").ok()?;
        Some(client)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.request(Method::GET, path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.request(Method::POST, path, Some(body))
    }

    pub fn delete(&self, path: &str) -> Result<Value> {
        self.request(Method::DELETE, path, None)
    }

    fn request(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value> {
        let socket = &self.socket;
        let what = format!("the daemon at {}", socket.display());
        self.runtime.block_on(async {
            let stream = tokio::net::UnixStream::connect(socket)
                .await
                .with_context(|| format!("cannot connect to {what}"))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .with_context(|| format!("cannot talk to {what}"))?;
            tokio::spawn(connection);
            let body = body.map_or_else(Vec::new, |b| b.to_string().into_bytes());
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, "memagent")
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))?;
            let response = sender
                .send_request(request)
                .await
                .with_context(|| format!("{what} did not answer"))?;
            let status = response.status();
            let bytes = response.into_body().collect().await?.to_bytes();
            let value: Value = serde_json::from_slice(&bytes)
                .with_context(|| format!("{what} answered {status} with something not JSON"))?;
            if !status.is_success() {
                match value.get("error").and_then(Value::as_str) {
                    Some(message) => bail!("{message}"),
                    None => bail!("{what} answered {status}"),
                }
            }
            Ok(value)
        })
    }
}

/// `text` for a URL's query string.
pub fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

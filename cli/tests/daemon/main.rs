//! The daemon as a real process: a real directory, real notify events, the real default
//! model, the socket API, and SIGKILL.

mod answers;
mod bad_input;
mod batch;
mod changes;
mod chat;
#[path = "../support/chats.rs"]
mod chats;
#[path = "../support/clients.rs"]
mod clients;
mod crash;
mod full_disk;
mod fuzz_api;
mod mcp;
mod proxy;
mod query;
mod scheduling;
mod search;
mod shared;
mod soak;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn model_path() -> PathBuf {
    std::env::var_os("MEMAGENT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

/// Daemon arguments for fast steps: 64-token chunks, 24-token memories, and partial
/// chunks read after half a second idle.
pub const QUICK_STEPS: [&str; 6] = [
    "--idle-seconds",
    "0.5",
    "--chunk-tokens",
    "64",
    "--memory-tokens",
    "24",
];

/// A fresh folder for one test.
pub fn test_root(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memctl-daemon-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Polls `check` until it returns `Some`, or panics with `what` at the deadline.
pub fn wait_for<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `memctl daemon run` child with its own config file, data directory and log.
pub struct Daemon {
    child: Option<Child>,
    pub root: PathBuf,
    pub data: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    args: Vec<String>,
    starts: usize,
}

impl Daemon {
    /// Writes `config` (TOML, without `data_dir`) and starts the daemon with `args`.
    pub fn start(root: &Path, config: &str, args: &[&str]) -> Self {
        let path = root.join("config.toml");
        std::fs::write(&path, config).unwrap();
        let mut daemon = Self {
            child: None,
            root: root.to_path_buf(),
            data: root.join("data"),
            config: path,
            log: root.join("daemon.log"),
            args: args.iter().map(|s| s.to_string()).collect(),
            starts: 0,
        };
        daemon.spawn();
        daemon
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memctl"));
        cmd.arg("--model")
            .arg(model_path())
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data)
            .env_remove("MEMAGENT_MODEL")
            .env_remove("MEMAGENT_DATA_DIR")
            .env_remove("MEMAGENT_DATABASE")
            .env_remove("RUST_LOG");
        cmd
    }

    /// Starts (again), appending to the same log, and waits until the API answers.
    pub fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = self
            .command()
            .args(["daemon", "run"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start memctl daemon run");
        self.child = Some(child);
        self.starts += 1;
        let starts = self.starts;
        wait_for("the daemon's API", Duration::from_secs(120), || {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "daemon start {starts} exited with {status}:\n{}",
                    self.log_text()
                );
            }
            self.try_status()
        });
    }

    pub fn memctl(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run memctl")
    }

    pub fn try_status(&self) -> Option<Value> {
        let out = self.memctl(&["daemon", "status", "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("status is JSON"))
    }

    /// The status row of `stream`, once the daemon knows it.
    pub fn stream_status(&self, stream: &str) -> Option<Value> {
        let status = self.try_status()?;
        status["streams"]
            .as_array()?
            .iter()
            .find(|s| s["stream"] == stream)
            .cloned()
    }

    /// Waits until `stream` holds `bytes` bytes and has read them all into memory.
    pub fn wait_caught_up(&self, stream: &str, bytes: u64, within: Duration) -> Value {
        wait_for(
            &format!("`{stream}` to read {bytes} bytes into memory"),
            within,
            || {
                self.stream_status(stream)
                    .filter(|s| s["log_bytes"].as_u64() == Some(bytes) && s["pending_bytes"] == 0)
            },
        )
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGKILL, and wait for the process to go.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, and the exit status once it stopped.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        wait_for("the daemon to stop", Duration::from_secs(60), || {
            child.try_wait().unwrap()
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Appends `text` to `path` with one write.
pub fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = File::options()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

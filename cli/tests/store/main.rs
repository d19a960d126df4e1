//! Persistent streams with real `memctl` processes, a real sled database on disk (and a
//! real PostgreSQL server, see `postgres`) and the real default model.

#[path = "../support/chats.rs"]
mod chats;
#[path = "../support/clients.rs"]
mod clients;
mod commands;
mod crash;
mod general;
mod mcp;
mod postgres;
mod ruler;
mod search;

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn model_path() -> PathBuf {
    std::env::var_os("MEMAGENT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

/// A fresh data directory for one test.
pub fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memctl-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `memctl --model DEFAULT --data-dir DIR args…`, not yet started.
pub fn memctl(dir: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memctl"));
    cmd.arg("--model")
        .arg(model_path())
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env_remove("MEMAGENT_MODEL")
        .env_remove("MEMAGENT_DATA_DIR")
        .env_remove("MEMAGENT_CONFIG")
        .env_remove("MEMAGENT_DATABASE")
        // No configuration file: the default location is empty.
        .env("XDG_CONFIG_HOME", "/nonexistent/memagent-test-config");
    cmd
}

pub fn run(dir: &std::path::Path, args: &[&str]) -> Output {
    memctl(dir, args).output().expect("run memctl")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

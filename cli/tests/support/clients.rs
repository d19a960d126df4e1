//! Clients that no one here wrote, driving memctl: the official MCP Python SDK's client
//! (`memctl mcp` over stdio, tests/data/mcp_client.py) and the official OpenAI Python
//! client (the proxy, tests/data/openai_client.py). Shared by the store and daemon tests.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// The interpreter with the MCP and OpenAI clients that scripts/test installs.
pub fn test_python() -> PathBuf {
    let python = std::env::var_os("MEMAGENT_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-python/bin/python")
        });
    assert!(
        python.exists(),
        "{} is missing: run the tests with scripts/test, or run scripts/test-python once \
         (it installs the MCP and OpenAI Python clients)",
        python.display()
    );
    python
}

/// Runs tests/data/`script` with `spec` (JSON with its `ops`) on standard input: the
/// results it prints, one per op.
fn python_client(script: &str, spec: &Value) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(script);
    let mut client = Command::new(test_python())
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {script}: {e}"));
    use std::io::Write;
    client
        .stdin
        .take()
        .unwrap()
        .write_all(spec.to_string().as_bytes())
        .unwrap();
    let out = client.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stderr}");
    let results: Vec<Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{script} printed something not JSON ({e}):\n{stderr}"));
    assert_eq!(
        results.len(),
        spec["ops"].as_array().map_or(0, Vec::len),
        "{results:#?}"
    );
    results
}

/// Runs `ops` against the MCP server `server` would start (its program and arguments):
/// one result each.
pub fn mcp_session(server: &Command, ops: &[Value]) -> Vec<Value> {
    let args: Vec<String> = server
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let spec = json!({
        "command": server.get_program().to_string_lossy(),
        "args": args,
        "env": {"XDG_CONFIG_HOME": "/nonexistent/memagent-test-config"},
        "ops": ops,
    });
    python_client("mcp_client.py", &spec)
}

/// A tool call's structured result, after checking it is not an error.
pub fn ok_call(result: &Value) -> &Value {
    assert_eq!(result["is_error"], false, "{result:#}");
    &result["structured"]
}

/// Checks that a tool call failed with a message containing `needle`.
pub fn assert_tool_error(result: &Value, needle: &str) {
    assert_eq!(result["is_error"], true, "{result:#}");
    let message = result["text"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{result:#}");
}

/// Runs `ops` against the OpenAI-compatible server at `base_url` with `api_key`: one
/// result each.
#[allow(dead_code)] // the daemon tests' alone
pub fn openai_session(base_url: &str, api_key: &str, ops: &[Value]) -> Vec<Value> {
    python_client(
        "openai_client.py",
        &json!({"base_url": base_url, "api_key": api_key, "ops": ops}),
    )
}

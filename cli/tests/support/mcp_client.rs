//! The official MCP Python SDK's client driving `memctl mcp` over stdio
//! (tests/data/mcp_client.py); shared by the store and daemon tests.

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

/// Runs `ops` against the server `server` would start (its program and arguments) with
/// the SDK's client: one result each.
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
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/mcp_client.py");
    let mut client = Command::new(test_python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the MCP client");
    use std::io::Write;
    client
        .stdin
        .take()
        .unwrap()
        .write_all(spec.to_string().as_bytes())
        .unwrap();
    let out = client.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the MCP client failed:\n{stderr}");
    let results: Vec<Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("client output is not JSON ({e}):\n{stderr}"));
    assert_eq!(results.len(), ops.len(), "{results:#?}");
    results
}

/// A tool call's structured result, after checking it is not an error.
pub fn ok_call(result: &Value) -> &Value {
    assert_eq!(result["is_error"], false, "{result:#}");
    &result["structured"]
}

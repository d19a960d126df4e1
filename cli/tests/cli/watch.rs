//! `memctl watch add|list|rm` editing a real configuration file.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use super::stderr;

fn watch(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memctl"))
        .arg("--config")
        .arg(config)
        .arg("watch")
        .args(args)
        .output()
        .expect("run memctl")
}

#[test]
fn watches_are_added_listed_and_removed_keeping_the_rest_of_the_file() {
    let dir = std::env::temp_dir().join(format!("memctl-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let notes = dir.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(&config, "# kept comment\nmodel = \"/models/x.gguf\"\n").unwrap();

    let o = watch(
        &config,
        &[
            "add",
            notes.to_str().unwrap(),
            "--stream",
            "notes",
            "--include",
            "*.md",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = watch(
        &config,
        &[
            "add",
            dir.to_str().unwrap(),
            "--format",
            "chat-jsonl",
            "--no-recursive",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        text.starts_with("# kept comment\nmodel = \"/models/x.gguf\"\n"),
        "{text}"
    );

    let o = watch(&config, &["list", "--json"]);
    let list: Value = serde_json::from_slice(&o.stdout).unwrap();
    let notes_abs = std::fs::canonicalize(&notes).unwrap();
    assert_eq!(list[0]["path"], notes_abs.to_str().unwrap());
    assert_eq!(list[0]["stream"], "notes");
    assert_eq!(list[0]["include"][0], "*.md");
    assert_eq!(list[0]["recursive"], true);
    assert_eq!(list[1]["format"], "chat-jsonl");
    assert_eq!(list[1]["recursive"], false);

    // The same path twice, and a bad format, are refused with the key named.
    let o = watch(&config, &["add", notes.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("watch[2].path"), "{}", stderr(&o));
    let o = watch(
        &config,
        &["add", notes.to_str().unwrap(), "--format", "bogus"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown variant `bogus`"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        text,
        "a refused change writes nothing"
    );

    let o = watch(&config, &["rm", notes.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list: Value = serde_json::from_slice(&watch(&config, &["list", "--json"]).stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["format"], "chat-jsonl");
    let o = watch(&config, &["rm", "/not/watched"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is not watched"), "{}", stderr(&o));
}

#[test]
fn invalid_watch_entries_name_the_key() {
    let dir = std::env::temp_dir().join(format!("memctl-watch-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("[[watch]]\npath = \"relative/notes\"\n", "watch[0].path"),
        (
            "[[watch]]\npath = \"/x\"\ninclude = [\"a[b\"]\n",
            "watch[0].include[0]",
        ),
        (
            "[[watch]]\npath = \"/x\"\nrecursiv = true\n",
            "unknown field `recursiv`",
        ),
        (
            "[[watch]]\npath = \"/x\"\n[[watch]]\npath = \"/y\"\nstream = \"\"\n",
            "watch[1].stream",
        ),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let config = dir.join(format!("bad{i}.toml"));
        std::fs::write(&config, text).unwrap();
        let o = watch(&config, &["list"]);
        assert_eq!(o.status.code(), Some(1), "{text}");
        assert!(stderr(&o).contains(expected), "{text}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(config.to_str().unwrap()),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn daemon_backend_and_profile_keys_are_validated_by_name() {
    let dir = std::env::temp_dir().join(format!("memctl-config-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    for (text, key) in [
        ("[daemon]\nlisten = \"8765\"\n", "daemon.token"),
        (
            "[daemon]\nlisten = \"not an address\"\ntoken = \"t\"\n",
            "daemon.listen",
        ),
        ("[daemon]\nidle_seconds = 0\n", "daemon.idle_seconds"),
        ("[profile]\nchunk_tokens = 0\n", "profile.chunk_tokens"),
        ("[backend]\nkind = \"cloud\"\n", "kind"),
        ("[daemon]\nidle = 5\n", "unknown field `idle`"),
    ] {
        std::fs::write(&config, text).unwrap();
        let o = watch(&config, &["list"]);
        assert!(!o.status.success(), "{text} was accepted");
        assert!(
            stderr(&o).contains(key) && stderr(&o).contains("config.toml"),
            "{text}: {}",
            stderr(&o)
        );
    }
    // The backend named in the file is used: an openai backend without a base URL says
    // which key to set.
    std::fs::write(&config, "[backend]\nkind = \"openai\"\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_memctl"))
        .arg("--config")
        .arg(&config)
        .args(["ask", "--file", "/dev/null", "why?"])
        .env_remove("MEMAGENT_BACKEND")
        .env_remove("MEMAGENT_BASE_URL")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--base-url"), "{}", stderr(&o));
}

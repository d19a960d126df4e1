//! Bad input never stops the daemon: each problem is logged with its path and reason,
//! and good files around it are still read.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::{append, test_root, wait_for, Daemon};

#[test]
fn bad_inputs_are_logged_and_the_daemon_keeps_running() {
    let root = test_root("bad");
    let dir = root.join("inbox");
    std::fs::create_dir_all(&dir).unwrap();
    // Present at start: a binary file, a file nobody may read, a symlink loop, a chat
    // log with a malformed line.
    std::fs::write(dir.join("photo.txt"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
    let locked = dir.join("locked.txt");
    std::fs::write(&locked, "private\n").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    std::os::unix::fs::symlink("loop.txt", dir.join("loop.txt")).unwrap();
    append(
        &dir.join("talk.jsonl"),
        "{\"role\":\"user\",\"content\":\"first\"}\n{\"role\": oops}\n{\"role\":\"user\",\"content\":\"third\"}\n",
    );
    // Also the TCP listener, on a free loopback port, with its token.
    let config = format!(
        "[daemon]\nlisten = \"127.0.0.1:0\"\ntoken = \"sesame-42\"\n\n[[watch]]\npath = \"{}\"\n",
        dir.display()
    );
    let mut daemon = Daemon::start(&root, &config, &["--idle-seconds", "1"]);

    // Files that appear and vanish at once, some while being read.
    for i in 0..40 {
        let path = dir.join(format!("flash-{i}.txt"));
        std::fs::write(&path, "here and gone\n".repeat(200)).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
    // Invalid UTF-8 is read with replacement characters.
    std::fs::write(dir.join("latin1-raw.txt"), b"caf\xe9 au lait\n").unwrap();
    // A good file after all that is still read.
    append(
        &dir.join("good.txt"),
        "The spare key is under the blue pot.\n",
    );
    daemon.wait_caught_up("good.txt", 37, Duration::from_secs(120));
    daemon.wait_caught_up("talk.jsonl", 24, Duration::from_secs(120));
    daemon.wait_caught_up("latin1-raw.txt", 15, Duration::from_secs(120));

    let log = wait_for("every problem in the log", Duration::from_secs(30), || {
        let log = daemon.log_text();
        [
            format!(
                "{}: a binary file (a NUL byte at offset 8); skipped",
                dir.join("photo.txt").display()
            ),
            format!("{}: no read permission (mode 000)", locked.display()),
            format!(
                "{}: cannot read it: Too many levels of symbolic links",
                dir.join("loop.txt").display()
            ),
            format!("{}:2: not JSON", dir.join("talk.jsonl").display()),
            format!(
                "{}: invalid UTF-8 at byte 3",
                dir.join("latin1-raw.txt").display()
            ),
            format!(
                "{}: gone before it could be read",
                dir.join("flash-39.txt").display()
            ),
        ]
        .iter()
        .all(|line| log.contains(line.as_str()))
        .then_some(log)
    });
    assert!(daemon.is_running(), "{log}");
    let status = daemon.try_status().expect("the API still answers");
    let streams: Vec<&str> = status["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stream"].as_str().unwrap())
        .collect();
    for skipped in ["photo.txt", "locked.txt", "loop.txt"] {
        assert!(
            !streams.contains(&skipped),
            "{skipped} was skipped: {streams:?}"
        );
    }
    // A fixed file is read at the next look.
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o600)).unwrap();
    append(&locked, "now readable\n");
    daemon.wait_caught_up("locked.txt", 21, Duration::from_secs(120));
    assert!(!log.contains("panicked"), "{log}");

    // TCP: the bearer token is required.
    let addr = log
        .lines()
        .find_map(|l| l.split("API on http://").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the TCP address in the log")
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let get = |token: Option<&str>| {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            tcp,
            "GET /v1/streams HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        tcp.read_to_string(&mut response).unwrap();
        response
    };
    assert!(get(None).starts_with("HTTP/1.1 401"), "{}", get(None));
    assert!(get(Some("sesame-41")).starts_with("HTTP/1.1 401"));
    let ok = get(Some("sesame-42"));
    assert!(
        ok.starts_with("HTTP/1.1 200") && ok.contains("good.txt"),
        "{ok}"
    );
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

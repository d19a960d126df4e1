//! A full disk, for real: the data directory on a small tmpfs, mounted in a user and mount
//! namespace of the test's own (so no privilege is needed and nothing outlives it). Below
//! the reserve, writes are refused at once with the path and the sizes, and reads go on;
//! when space returns, writing resumes and the watched text left behind is read. With no
//! reserve, sled meets the full disk itself: no call hangs past the write deadline, and
//! SIGTERM still stops the daemon.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{append, stderr, stdout, test_root, wait_for, Daemon};

/// Runs [`on_a_small_filesystem`] in a new user and mount namespace, where it may mount.
#[test]
fn a_full_disk_refuses_writes_keeps_reads_and_never_wedges() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount"])
        .arg(&exe)
        .args([
            "full_disk::on_a_small_filesystem",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .output()
        .expect("unshare (util-linux) runs the scenario in its own mount namespace");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("1 passed"),
        "the scenario did not run:\n{text}"
    );
}

/// `memctl args`, which must finish within `within` (it is killed and the test fails
/// otherwise): a hung call is what this file tests against.
fn memctl_within(daemon: &Daemon, args: &[&str], within: Duration) -> Output {
    let mut child = daemon
        .command()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "`memctl {}` hung:\n{}\ndaemon log:\n{}",
                args.join(" "),
                stderr(&out),
                daemon.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn status(daemon: &Daemon) -> Value {
    let out = memctl_within(daemon, &["daemon", "status", "--json"], CALL);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every call here answers well within this.
const CALL: Duration = Duration::from_secs(60);

/// Writes a file of `bytes` bytes.
fn ballast(path: &Path, bytes: u64) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(0).unwrap();
    use std::io::Write;
    let mut w = std::io::BufWriter::new(file);
    let block = vec![b'x'; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        if w.write_all(&block[..n]).is_err() {
            break; // the disk is full: as full as it gets
        }
        left -= n as u64;
    }
    let _ = w.flush();
}

#[test]
#[ignore = "run by a_full_disk_refuses_writes_keeps_reads_and_never_wedges, in a namespace"]
fn on_a_small_filesystem() {
    let root = test_root("full-disk");
    let data = root.join("data");
    let inbox = root.join("inbox");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&inbox).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(&data)
        .status()
        .unwrap();
    assert!(
        mounted.success(),
        "mount a 48 MB tmpfs on {}",
        data.display()
    );
    let config = |reserve_mb: u32| {
        format!(
            "reserve_mb = {reserve_mb}\n\n[[watch]]\npath = \"{}\"\n",
            inbox.display()
        )
    };
    let notes = inbox.join("notes.txt");
    append(&notes, "The spare key is under the blue pot.\n");
    let mut daemon = Daemon::start(
        &root,
        &config(8),
        &[
            "--idle-seconds",
            "0.5",
            "--rescan-seconds",
            "1",
            "--write-timeout-seconds",
            "2",
            "--stop-timeout-seconds",
            "3",
        ],
    );
    daemon.wait_caught_up("notes.txt", 37, Duration::from_secs(120));
    let free = status(&daemon)["space"]["available"].as_u64().unwrap();
    assert_eq!(status(&daemon)["store"], "ok");

    // Fill the filesystem to 4 MB under the 8 MB reserve.
    let fill = data.join("ballast");
    ballast(&fill, free.saturating_sub(4_000_000));
    let piece = root.join("piece.txt");
    std::fs::write(&piece, "Filler line about nothing at all.\n".repeat(30_000)).unwrap();
    let piece_arg = piece.to_str().unwrap();
    let refused = memctl_within(&daemon, &["ingest", "big", piece_arg], CALL);
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
    let message = stderr(&refused);
    assert!(message.contains("kept free"), "{message}");
    assert!(message.contains(data.to_str().unwrap()), "{message}");
    let state = status(&daemon);
    assert_eq!(
        state["store"], "refusing writes: too little free space",
        "{state}"
    );
    assert_eq!(state["space"]["refusing"], true);
    // Text arriving in a watched file meanwhile is left where it is, not skipped.
    append(&notes, "The boiler code is 4417.\n");
    // Reads go on.
    let listed = memctl_within(&daemon, &["streams", "list"], CALL);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("notes.txt"), "{}", stdout(&listed));
    let found = memctl_within(
        &daemon,
        &["search", "notes.txt", "spare key", "--json"],
        CALL,
    );
    assert!(found.status.success(), "{}", stderr(&found));
    assert!(stdout(&found).contains("blue pot"), "{}", stdout(&found));
    assert!(daemon.is_running());

    // Space returns: writing resumes by itself, and the watched text is read.
    std::fs::remove_file(&fill).unwrap();
    daemon.wait_caught_up("notes.txt", 37 + 25, Duration::from_secs(120));
    let appended = memctl_within(&daemon, &["ingest", "big", piece_arg], CALL);
    assert!(appended.status.success(), "{}", stderr(&appended));
    assert_eq!(status(&daemon)["store"], "ok");
    assert!(
        daemon.log_text().contains("writing resumes"),
        "{}",
        daemon.log_text()
    );

    // No reserve, and another process filling the disk while the daemon writes: space
    // passes the check and is gone when sled writes, so sled meets the full disk
    // itself. Every call still answers (an error at worst), and SIGTERM still stops
    // the daemon.
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    std::fs::write(&daemon.config, config(0)).unwrap();
    daemon.spawn();
    let filling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let filler = {
        let (filling, fill) = (filling.clone(), fill.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut file = std::fs::File::create(&fill).unwrap();
            let block = vec![b'x'; 1 << 16];
            while filling.load(std::sync::atomic::Ordering::Relaxed) {
                if file.write_all(&block).is_err() {
                    // Full: give back a little for the daemon to take, then fill again.
                    let len = file.metadata().unwrap().len();
                    file.set_len(len.saturating_sub(1 << 20)).unwrap();
                    file = std::fs::File::options().append(true).open(&fill).unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        })
    };
    let small = root.join("small.txt");
    std::fs::write(&small, "Another filler line.\n".repeat(5_000)).unwrap();
    let mut outcomes = Vec::new();
    for i in 0..12 {
        let out = memctl_within(
            &daemon,
            &["ingest", &format!("full-{i}"), small.to_str().unwrap()],
            CALL,
        );
        let message = stderr(&out);
        assert!(
            out.status.success()
                || message.contains("No space left")
                || message.contains("kept free")
                || message.contains("not acknowledged"),
            "{message}"
        );
        outcomes.push(match out.status.success() {
            true => "stored".to_string(),
            false => message.lines().last().unwrap_or_default().to_string(),
        });
    }
    eprintln!("appends while the disk filled: {outcomes:#?}");
    // Reads answer, or say the store did not finish in time.
    let listed = memctl_within(&daemon, &["streams", "list"], CALL);
    assert!(
        listed.status.success() || stderr(&listed).contains("did not finish within"),
        "{}",
        stderr(&listed)
    );
    let pid = daemon.pid();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    wait_for("the daemon to stop after SIGTERM", CALL, || {
        (!daemon.is_running()).then_some(())
    });
    filling.store(false, std::sync::atomic::Ordering::Relaxed);
    filler.join().unwrap();
}

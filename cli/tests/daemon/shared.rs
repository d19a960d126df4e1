//! Three daemons sharing one real PostgreSQL database (a throwaway server `scripts/test`
//! starts, or `MEMAGENT_TEST_DATABASE`): each stream is stepped by one daemon at a time
//! under its lease; one killed with SIGKILL mid-run leaves its streams to the others;
//! one paused with SIGSTOP past its lease finds, when it wakes, that its leases went to
//! the others, and writes nothing stale; all the while, 30 more streams grow a line at a
//! time. Every log reads back as acknowledged and every memory chain is continuous.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use memagent_store::{Store, GENERAL};

use super::{test_root, wait_for, Daemon, QUICK_STEPS};

#[path = "../../../store/tests/support/database.rs"]
mod database;

use database::fresh_database;

/// Streams appended to a line at a time while the daemons are killed and stopped.
const LIVE: usize = 30;

/// The text of stream `i`: a few 64-token chunks of numbered sentences.
fn text(i: usize) -> String {
    (0..24)
        .map(|j| {
            format!(
                "Note {j} of stream {i}: the crate for shelf {j} holds {} lamps.\n",
                i * 100 + j
            )
        })
        .collect()
}

/// Whether every stream's general memory has read its whole log.
fn all_read(store: &Store) -> bool {
    store
        .streams()
        .unwrap()
        .iter()
        .all(|s| store.cursor(s, GENERAL).unwrap().offset == s.log_len)
}

/// Who holds each stream's lease now (unexpired), by stream id.
fn holders(store: &Store) -> HashMap<u64, (String, u64)> {
    let (leases, now) = store.leases().unwrap();
    leases
        .into_iter()
        .filter(|l| l.expires_ms >= now)
        .map(|l| (l.stream, (l.owner, l.epoch)))
        .collect()
}

fn signal(daemon: &Daemon, signal: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(daemon.pid(), signal) }, 0);
}

/// SIGKILL daemon a once it holds leases, until the others hold its streams; then
/// SIGSTOP daemon b (once `daemon status` shows its leases) until its leases lapse, and
/// SIGCONT it.
fn faults(daemons: &mut [Daemon], store: &Store) {
    wait_for("daemon a to hold leases", Duration::from_secs(120), || {
        holders(store).values().any(|(o, _)| o == "a").then_some(())
    });
    daemons[0].kill();
    let a_held: Vec<u64> = holders(store)
        .into_iter()
        .filter(|(_, (o, _))| o == "a")
        .map(|(id, _)| id)
        .collect();
    // Its streams go on with the others within the lease time.
    wait_for(
        "a's streams to be taken over",
        Duration::from_secs(60),
        || {
            let now = holders(store);
            a_held
                .iter()
                .all(|id| now.get(id).is_none_or(|(o, _)| o != "a"))
                .then_some(())
        },
    );
    // `daemon status` says which daemon steps which stream.
    wait_for(
        "b's status to show its leases",
        Duration::from_secs(120),
        || {
            let status = daemons[1].try_status()?;
            status["streams"]
                .as_array()?
                .iter()
                .any(|s| s["lease"]["owner"] == "b")
                .then_some(())
        },
    );
    signal(&daemons[1], libc::SIGSTOP);
    wait_for("b's leases to lapse", Duration::from_secs(60), || {
        holders(store).values().all(|(o, _)| o != "b").then_some(())
    });
    signal(&daemons[1], libc::SIGCONT);
}

/// Appends a line at a time to [`LIVE`] streams, through the database and through the
/// daemon `through`, until `stop` says so (waiting for it up to 20 ms between lines):
/// what each stream was acknowledged, in order.
fn append_lines(
    dir: &std::path::Path,
    url: &str,
    through: &Daemon,
    stop: mpsc::Receiver<()>,
) -> Vec<String> {
    let store = Store::open_with(dir, Some(url)).unwrap();
    let mut acked = vec![String::new(); LIVE];
    let mut n = 0usize;
    loop {
        let i = n % LIVE;
        let stream = format!("live{i:02}");
        let line = format!("Live line {n} of stream {i}: gauge {n} reads {}.\n", n * 7);
        // Every fourth line through a daemon's API (whichever daemon steps the stream),
        // the others straight to the database.
        let stored = match n % 4 {
            0 => {
                let file = dir.join(format!("line-{n}.txt"));
                std::fs::write(&file, &line).unwrap();
                through
                    .memctl(&["ingest", &stream, file.to_str().unwrap()])
                    .status
                    .success()
            }
            _ => store.append(&stream, line.as_bytes(), None).is_ok(),
        };
        if stored {
            acked[i].push_str(&line);
        }
        n += 1;
        match stop.recv_timeout(Duration::from_millis(20)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    acked
}

#[test]
fn daemons_sharing_a_database_step_each_stream_once_and_survive_sigkill_and_sigstop() {
    let url = fresh_database("shared_daemons");
    let root = test_root("shared");
    let config = format!("database = \"{url}\"\n");
    let start = |name: &str| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut args = QUICK_STEPS.to_vec();
        args.extend(["--name", name, "--lease-seconds", "2", "--embedder", "none"]);
        Daemon::start(&dir, &config, &args)
    };
    let mut daemons = [start("a"), start("b"), start("c")];

    // Twelve streams appended through the database, as any machine would.
    let streams = 12;
    for i in 0..streams {
        let file = root.join(format!("s{i}.txt"));
        std::fs::write(&file, text(i)).unwrap();
        // From a machine of its own: its own data directory, no daemon.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memctl"))
            .args(["--data-dir", root.join("appender").to_str().unwrap()])
            .args(["--database", &url, "--embedder", "none", "ingest"])
            .args([&format!("s{i:02}"), file.to_str().unwrap(), "--no-process"])
            .env_remove("MEMAGENT_DATA_DIR")
            .env("XDG_CONFIG_HOME", "/nonexistent/memagent-test-config")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let store = Store::open_with(&root.join("observer"), Some(&url)).unwrap();

    // The faults, while 30 more streams grow a line at a time.
    let (stop, stopped) = mpsc::channel();
    let live = std::thread::scope(|scope| {
        let (faulty, steady) = daemons.split_at_mut(2);
        let steady = &steady[0];
        let appender =
            scope.spawn(|| append_lines(&root.join("live-appender"), &url, steady, stopped));
        faults(faulty, &store);
        stop.send(()).unwrap();
        appender.join().unwrap()
    });

    wait_for(
        "every stream read into memory",
        Duration::from_secs(600),
        || all_read(&store).then_some(()),
    );
    // b, awake, found its leases gone: logged, and nothing stale written.
    wait_for(
        "b to notice its lost leases",
        Duration::from_secs(60),
        || {
            daemons[1]
                .log_text()
                .contains("expired or was taken over")
                .then_some(())
        },
    );

    let appended: Vec<(String, String)> = (0..streams)
        .map(|i| (format!("s{i:02}"), text(i)))
        .chain(
            live.into_iter()
                .enumerate()
                .filter(|(_, acked)| !acked.is_empty())
                .map(|(i, acked)| (format!("live{i:02}"), acked)),
        )
        .collect();
    assert!(appended.len() > streams, "no live line was acknowledged");
    assert_eq!(store.streams().unwrap().len(), appended.len());
    for (name, sent) in &appended {
        let s = store.require(name).unwrap();
        assert!(
            store.read_log(&s, 0, s.log_len).unwrap() == sent.as_bytes(),
            "{name}: the log is not what was acknowledged"
        );
        let versions = store.versions(&s, GENERAL).unwrap();
        let chunks = store.chunks(&s).unwrap();
        assert!(!versions.is_empty(), "{name} was never stepped");
        // One version per chunk, each reading the chunk after its parent's: a chain
        // without gaps or a step written twice.
        for (n, v) in versions.iter().enumerate() {
            assert_eq!(v.version, n as u64 + 1, "{name}: {versions:#?}");
            assert_eq!(v.parent, (n > 0).then_some(n as u64), "{name}: its parent");
            assert_eq!(v.chunk, Some(n as u64), "{name}: version {}", v.version);
        }
        assert_eq!(chunks.len(), versions.len());
        for pair in chunks.windows(2) {
            assert_eq!(pair[0].end, pair[1].start, "{name}: chunks continuous");
        }
        assert_eq!(chunks.last().unwrap().end, s.log_len);
    }
    // Search answers the same through every daemon: each one's index caught up with
    // text appended through the database, not through it.
    let found: Vec<String> = daemons[1..]
        .iter()
        .map(|daemon| {
            wait_for(
                "the text in the daemon's index",
                Duration::from_secs(60),
                || {
                    let out =
                        daemon.memctl(&["search", "s07", "shelf 13 holds 713 lamps", "--json"]);
                    let hits: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
                    let first = hits["passages"].as_array()?.first()?["text"]
                        .as_str()?
                        .to_string();
                    first.contains("713 lamps").then_some(first)
                },
            )
        })
        .collect();
    assert_eq!(found[0], found[1]);
    // A stream removed through one daemon leaves every other daemon's index.
    let removed = daemons[1].memctl(&["streams", "rm", "s07"]);
    assert!(removed.status.success(), "{removed:?}");
    wait_for(
        "the removed stream gone from the other daemon's index",
        Duration::from_secs(60),
        || {
            let out = daemons[2].memctl(&["search", "--all", "shelf 13 holds 713 lamps", "--json"]);
            let hits: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let passages = hits["passages"].as_array()?;
            (!passages.is_empty() && passages.iter().all(|p| p["stream"] != "s07")).then_some(())
        },
    );
    for daemon in daemons.iter_mut().skip(1) {
        assert!(daemon.is_running(), "{}", daemon.log_text());
        daemon.stop();
    }
}

/// `scripts/test-postgres ACTION DIR`, its standard output.
fn server_script(action: &str, dir: &std::path::Path) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/test-postgres");
    let out = std::process::Command::new(script)
        .args([action, dir.to_str().unwrap()])
        .output()
        .expect("run scripts/test-postgres");
    assert!(
        out.status.success(),
        "scripts/test-postgres {action}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The process id of the server running in `dir` (its `postmaster.pid`'s first line).
fn postmaster(dir: &std::path::Path) -> String {
    let pid = std::fs::read_to_string(dir.join("data/postmaster.pid")).unwrap();
    pid.lines().next().unwrap_or_default().to_string()
}

#[test]
fn a_daemon_goes_on_when_its_database_restarts_and_loses_nothing_acknowledged() {
    let root = test_root("pg-restart");
    // A server of this test's own, to restart.
    let pg = root.join("pg");
    let url = server_script("start", &pg);
    let config = format!("database = \"{url}\"\n");
    let dir = root.join("daemon");
    std::fs::create_dir_all(&dir).unwrap();
    let mut args = QUICK_STEPS.to_vec();
    args.extend(["--name", "d", "--lease-seconds", "2", "--embedder", "none"]);
    let mut daemon = Daemon::start(&dir, &config, &args);
    // Lines appended through the daemon's API, one `memctl ingest` each; the server
    // restarts after the 15th. What each ingest acknowledged is kept, in order.
    let mut acked = String::new();
    let mut refused = 0;
    for n in 0..40 {
        if n == 15 {
            let before = postmaster(&pg);
            server_script("restart", &pg);
            assert_ne!(postmaster(&pg), before, "the server restarted");
        }
        let line = format!("Line {n}: the gauge in room {n} reads {}.\n", n * 13);
        let file = root.join(format!("line-{n}.txt"));
        std::fs::write(&file, &line).unwrap();
        let out = daemon.memctl(&["ingest", "notes", file.to_str().unwrap()]);
        match out.status.success() {
            true => acked.push_str(&line),
            false => refused += 1,
        }
    }
    assert!(
        acked.len() > 30 * 40,
        "most appends acknowledged ({refused} refused)"
    );
    let store = Store::open_with(&root.join("observer"), Some(&url)).unwrap();
    wait_for("the log read into memory", Duration::from_secs(300), || {
        all_read(&store).then_some(())
    });
    let s = store.require("notes").unwrap();
    assert!(
        store.read_log(&s, 0, s.log_len).unwrap() == acked.as_bytes(),
        "the log is not what was acknowledged"
    );
    let versions = store.versions(&s, GENERAL).unwrap();
    for (n, v) in versions.iter().enumerate() {
        assert_eq!(v.version, n as u64 + 1);
        assert_eq!(v.chunk, Some(n as u64));
    }
    assert_eq!(store.chunks(&s).unwrap().last().unwrap().end, s.log_len);
    assert!(daemon.is_running(), "{}", daemon.log_text());
    daemon.stop();
    drop(store);
    server_script("stop", &pg);
}

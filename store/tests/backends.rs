//! The store's behaviour on both backends: the embedded sled database on disk and a real
//! PostgreSQL server (a throwaway one `scripts/test` starts, or `MEMAGENT_TEST_DATABASE`).
//! Each behaviour is one function run on each; a stream exported from one imports into
//! the other and exports again line for line.

use std::path::PathBuf;

use std::time::{Duration, Instant};

use memagent_store::{
    Author, ChunkRecord, Cursor, Error, ExportRecord, FileRecord, Lease, MemoryVersion,
    SegmentRecord, StandingAnswer, Store, StreamRecord, GENERAL,
};

mod support;

use support::{fresh_database, person_version};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memagent-backends-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn sled(name: &str) -> Store {
    Store::open(&scratch(&format!("sled-{name}"))).unwrap()
}

fn postgres(name: &str) -> Store {
    let url = fresh_database(name);
    Store::open_with(&scratch(&format!("pg-{name}")), Some(&url)).unwrap()
}

/// Runs `check` on a fresh store of each backend.
fn on_both(name: &str, check: impl Fn(&Store)) {
    check(&sled(name));
    check(&postgres(name));
}

fn model_version(version: u64, chunk: u64, text: &str) -> MemoryVersion {
    MemoryVersion {
        version,
        parent: version.checked_sub(1).filter(|&p| p > 0),
        text: text.to_string(),
        tokens: 7,
        chunk: Some(chunk),
        model: "SmolLM2-135M-Instruct.Q4_1.gguf".to_string(),
        model_sha256: "ab".repeat(32),
        template_id: "memagent-general".to_string(),
        template_version: 2,
        created: 1_768_467_600 + version,
        prompt_tokens: 300,
        completion_tokens: 40,
        seconds: 0.1 + version as f64 / 3.0,
        cut: version.is_multiple_of(2),
        author: Author::Model,
    }
}

fn chunk(index: u64, start: u64, end: u64) -> ChunkRecord {
    ChunkRecord {
        index,
        start,
        end,
        tokens: (end - start) as u32 / 4,
        sha256: [index as u8; 32],
    }
}

fn export_lines(store: &Store, name: &str) -> Vec<String> {
    store
        .export(name)
        .unwrap()
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect()
}

#[test]
fn appends_are_deduplicated_per_source_and_read_back_in_any_range() {
    on_both("append", |store| {
        let a = store.append("notes", b"one\n", Some("/tmp/a.txt")).unwrap();
        assert_eq!((a.bytes, a.revision), (4, false));
        let b = store
            .append("notes", b"one\ntwo\n", Some("/tmp/a.txt"))
            .unwrap();
        assert_eq!((b.bytes, b.revision), (4, false), "only the new bytes");
        assert_eq!(
            store
                .append("notes", b"one\ntwo\n", Some("/tmp/a.txt"))
                .unwrap()
                .bytes,
            0
        );
        let d = store.append("notes", b"ONE\n", Some("/tmp/a.txt")).unwrap();
        assert_eq!((d.bytes, d.revision), (4, true), "a rewritten source");
        let e = store
            .append_with("notes", b"ONE\n", Some("/tmp/a.txt"), true)
            .unwrap();
        assert_eq!((e.bytes, e.log_len), (4, 16), "forced");
        let s = store.require("notes").unwrap();
        assert_eq!(s.log_len, 16);
        assert_eq!(store.read_log(&s, 0, 99).unwrap(), b"one\ntwo\nONE\nONE\n");
        assert_eq!(store.read_log(&s, 2, 9).unwrap(), b"e\ntwo\nO");
        // The second append's provenance: the file's second line.
        let (at, segment) = store.segment_at(&s, 5).unwrap().unwrap();
        assert_eq!((at, segment.first_line), (4, 2));
        assert_eq!(segment.source, "/tmp/a.txt");
        assert!(matches!(
            store.append("", b"x", None),
            Err(memagent_store::Error::BadName(_))
        ));
    });
}

#[test]
fn a_long_append_reads_back_byte_for_byte_in_any_range() {
    on_both("long", |store| {
        // Over two PostgreSQL rows' worth, not a multiple of anything.
        let text: Vec<u8> = (0..2_500_003u32)
            .map(|i| b'a' + (i * 7 % 26) as u8)
            .collect();
        store.append("big", &text[..1_000_000], None).unwrap();
        store.append("big", &text[1_000_000..], None).unwrap();
        let s = store.require("big").unwrap();
        assert_eq!(s.log_len, text.len() as u64);
        for (from, to) in [
            (0, text.len()),
            (999_990, 1_000_010),
            (1_048_570, 2_100_000),
            (2_500_000, 2_500_003),
            (17, 18),
        ] {
            let read = store.read_log(&s, from as u64, to as u64).unwrap();
            assert!(read == text[from..to], "bytes {from}..{to}");
        }
    });
}

#[test]
fn a_memory_step_commits_its_version_chunk_and_cursor_together() {
    on_both("steps", |store| {
        store.append("s", &[b'x'; 300], None).unwrap();
        let s = store.require("s").unwrap();
        assert_eq!(store.cursor(&s, GENERAL).unwrap(), Cursor::default());
        for i in 0..3u64 {
            let cursor = Cursor {
                next_chunk: i + 1,
                offset: (i + 1) * 100,
                version: i + 1,
            };
            let v = model_version(i + 1, i, &format!("memory {i}"));
            store
                .commit_step(&s, GENERAL, &chunk(i, i * 100, (i + 1) * 100), &v, &cursor)
                .unwrap();
        }
        assert_eq!(store.cursor(&s, GENERAL).unwrap().offset, 300);
        let versions = store.versions(&s, GENERAL).unwrap();
        assert_eq!(versions.len(), 3);
        assert_eq!(versions[2], model_version(3, 2, "memory 2"));
        assert_eq!(store.latest(&s, GENERAL).unwrap().unwrap().text, "memory 2");
        assert_eq!(store.chunks(&s).unwrap()[1], chunk(1, 100, 200));
        assert_eq!(store.version_reading(&s, 150).unwrap(), Some(2));
        assert_eq!(store.version_reading(&s, 300).unwrap(), None);
        let from: Vec<u64> = store
            .versions_from(&s, GENERAL, 2)
            .unwrap()
            .map(|v| v.version)
            .collect();
        assert_eq!(from, [2, 3]);
        // An edit goes after the latest and keeps the cursor's place.
        let edit = store
            .add_version(&s, GENERAL, person_version("edited"))
            .unwrap();
        assert_eq!((edit.version, edit.parent), (4, Some(3)));
        assert_eq!(store.cursor(&s, GENERAL).unwrap().offset, 300);
        // A question chain has its own versions and cursor.
        let q = store.question_chain(&s, "Where is the key?").unwrap();
        assert_eq!(q.chain, 1);
        assert_eq!(store.question_chain(&s, "Where is the key?").unwrap(), q);
        assert_eq!(store.question_chain(&s, "Who called?").unwrap().chain, 2);
        assert!(store.versions(&s, q.chain).unwrap().is_empty());
    });
}

#[test]
fn a_watched_file_is_recorded_with_its_text_and_moves_when_renamed() {
    on_both("files", |store| {
        let mut file = FileRecord {
            path: "/watched/a.log".to_string(),
            stream: "watched".to_string(),
            dev: u64::MAX - 3,
            ino: 42,
            offset: 6,
            sha256: [9; 32],
            lines: 1,
            revisions: 0,
        };
        let segment = SegmentRecord {
            source: file.path.clone(),
            first_line: 1,
            turns: vec![(0, 1), (3, 2)],
        };
        store
            .append_file(b"hello\n", &file, None, &segment)
            .unwrap();
        file.path = "/watched/b.log".to_string();
        store
            .append_file(b"", &file, Some("/watched/a.log"), &segment)
            .unwrap();
        assert_eq!(
            store.files().unwrap(),
            [file.clone()],
            "the rename moved it"
        );
        let s = store.require("watched").unwrap();
        assert_eq!(store.read_log(&s, 0, 6).unwrap(), b"hello\n");
        assert_eq!(store.segment_at(&s, 3).unwrap(), Some((0, segment)));
        store.remove_stream("watched").unwrap();
        assert!(store.files().unwrap().is_empty());
        assert!(store.stream("watched").unwrap().is_none());
        assert!(matches!(
            store.remove_stream("watched"),
            Err(memagent_store::Error::NoStream(_))
        ));
    });
}

/// A stream with a record of every kind.
fn full_stream(store: &Store, name: &str) {
    let text = "[2026-01-15 09:00] user (Ana): I moved to Porto. Ação!\n".repeat(3);
    store
        .append_turns(
            name,
            text.as_bytes(),
            Some("/logs/chat.jsonl"),
            false,
            vec![(0, 3), (57, 4)],
        )
        .unwrap();
    store
        .append(name, b"a note without a source\n", None)
        .unwrap();
    let s = store.require(name).unwrap();
    let v = model_version(1, 0, "Ana lives in Porto.");
    let cursor = Cursor {
        next_chunk: 1,
        offset: 100,
        version: 1,
    };
    store
        .commit_step(&s, GENERAL, &chunk(0, 0, 100), &v, &cursor)
        .unwrap();
    store
        .add_version(&s, GENERAL, person_version("Ana lives in Porto (checked)."))
        .unwrap();
    let q = store.question_chain(&s, "Where does Ana live?").unwrap();
    store
        .commit_step(
            &s,
            q.chain,
            &chunk(0, 0, 100),
            &model_version(1, 0, "Porto"),
            &cursor,
        )
        .unwrap();
    store
        .add_answer(
            &s,
            &StandingAnswer {
                question: "Where does Ana live?".to_string(),
                version: 1,
                answer: "Porto".to_string(),
                created: 1_768_467_600,
                seconds: 0.25,
            },
        )
        .unwrap();
}

#[test]
fn an_export_moves_a_stream_between_backends_line_for_line() {
    let (embedded, server) = (sled("move"), postgres("move"));
    full_stream(&embedded, "chat");
    full_stream(&server, "chat");
    // The same appends and steps give the same export on either backend.
    let from_sled = export_lines(&embedded, "chat");
    assert_eq!(export_lines(&server, "chat")[1..], from_sled[1..]);
    // sled → PostgreSQL → sled.
    let records: Vec<ExportRecord> = from_sled
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    server.import(&records, Some("moved")).unwrap();
    let through_server = export_lines(&server, "moved");
    assert_eq!(through_server[1..], from_sled[1..]);
    let back: Vec<ExportRecord> = through_server
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    embedded.import(&back, Some("back")).unwrap();
    assert_eq!(export_lines(&embedded, "back")[1..], from_sled[1..]);
    let moved = server.require("moved").unwrap();
    let original = embedded.require("chat").unwrap();
    assert_eq!(
        server.read_log(&moved, 0, moved.log_len).unwrap(),
        embedded.read_log(&original, 0, original.log_len).unwrap()
    );
    // An import that fails leaves nothing behind, on either.
    let mut broken = records.clone();
    broken.push(ExportRecord::Log {
        offset: 1,
        text: "out of place".to_string(),
    });
    for store in [&embedded, &server] {
        let err = store.import(&broken, Some("broken")).unwrap_err();
        assert!(err.to_string().contains("expected"), "{err}");
        assert!(store.stream("broken").unwrap().is_none());
    }
}

#[test]
fn streams_are_listed_by_name_and_removed_with_everything_they_have() {
    on_both("remove", |store| {
        full_stream(store, "b-chat");
        full_stream(store, "a-chat");
        let names: Vec<String> = store
            .streams()
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["a-chat", "b-chat"]);
        let a = store.require("a-chat").unwrap();
        store.remove_stream("a-chat").unwrap();
        assert!(store.stream("a-chat").unwrap().is_none());
        assert!(store.versions(&a, GENERAL).unwrap().is_empty());
        assert!(store.answers(&a).unwrap().is_empty());
        assert!(store.chunks(&a).unwrap().is_empty());
        // A new stream of the same name starts empty.
        let again = store.create_stream("a-chat").unwrap();
        assert_eq!(again.log_len, 0);
        assert!(store.questions(&again).unwrap().is_empty());
        assert_eq!(store.streams().unwrap().len(), 2);
    });
}

#[test]
fn the_change_feed_names_the_streams_written_and_removed_since_a_mark() {
    // The embedded database is one process's: it keeps no feed, its caller knows.
    let embedded = sled("feed");
    embedded.append("a", b"one\n", None).unwrap();
    assert_eq!(embedded.change_mark().unwrap(), None);
    assert_eq!(embedded.changes(0).unwrap(), None);

    let url = fresh_database("feed");
    let store = Store::open_with(&scratch("pg-feed"), Some(&url)).unwrap();
    // Another daemon's store on the same database.
    let other = Store::open_with(&scratch("pg-feed-other"), Some(&url)).unwrap();
    for name in ["a", "b", "c"] {
        store.append(name, b"first\n", Some("/tmp/f.txt")).unwrap();
    }
    store.create_stream("empty").unwrap();
    let names = |c: &memagent_store::Changes| -> Vec<String> {
        c.streams.iter().map(|s| s.name.clone()).collect()
    };
    assert_eq!(names(&store.changes(0).unwrap().unwrap()), ["a", "b", "c"]);
    let mark = store.change_mark().unwrap().unwrap();
    let none = store.changes(mark).unwrap().unwrap();
    assert!(none.streams.is_empty() && none.removed.is_empty());
    assert_eq!(none.through, mark);
    // The same text from the same source appends nothing, and changes nothing.
    assert_eq!(
        store
            .append("a", b"first\n", Some("/tmp/f.txt"))
            .unwrap()
            .bytes,
        0
    );
    assert!(store.changes(mark).unwrap().unwrap().streams.is_empty());

    other.append("b", b"second\n", None).unwrap();
    let seen = store.changes(mark).unwrap().unwrap();
    assert_eq!(names(&seen), ["b"]);
    assert_eq!(seen.streams[0].log_len, 13, "the stream as it is now");
    assert!(seen.through > mark);
    assert_eq!(store.change_mark().unwrap(), Some(seen.through));

    let c = store.require("c").unwrap();
    other.remove_stream("c").unwrap();
    store.append("a", b"third\n", None).unwrap();
    let next = store.changes(seen.through).unwrap().unwrap();
    assert_eq!(names(&next), ["a"]);
    assert_eq!(next.removed, [c.id]);
    // An imported stream is a change too.
    let lines = store.export("b").unwrap();
    store.remove_stream("b").unwrap();
    store.import(&lines, Some("b2")).unwrap();
    let after = store.changes(next.through).unwrap().unwrap();
    assert_eq!(names(&after), ["b2"]);
    assert_eq!(after.streams[0].log_len, 13);
}

#[test]
fn daemons_starting_at_once_on_an_empty_database_migrate_it_once() {
    let url = fresh_database("migrate_race");
    let stores: Vec<Store> = std::thread::scope(|scope| {
        let started: Vec<_> = (0..4)
            .map(|i| {
                let url = url.clone();
                scope.spawn(move || {
                    Store::open_with(&scratch(&format!("migrate-race-{i}")), Some(&url))
                })
            })
            .collect();
        started
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    // Each works on the one schema.
    stores[0].append("shared", b"from 0\n", None).unwrap();
    stores[3].append("shared", b"from 3\n", None).unwrap();
    let s = stores[1].require("shared").unwrap();
    assert_eq!(
        stores[2].read_log(&s, 0, s.log_len).unwrap(),
        b"from 0\nfrom 3\n"
    );
}

#[test]
fn one_process_uses_a_data_directory_whichever_the_backend() {
    // The search index and the daemon's socket in it are that process's: a second
    // memctl on the same directory is told who holds it (and talks to the daemon).
    let url = fresh_database("dir_lock");
    let dir = scratch("dir-lock");
    let first = Store::open_with(&dir, Some(&url)).unwrap();
    let second = Store::open_with(&dir, Some(&url)).err().expect("refused");
    assert!(
        matches!(&second, Error::InUse { pid, .. } if *pid == std::process::id().to_string()),
        "{second}"
    );
    drop(first);
    Store::open_with(&dir, Some(&url)).unwrap();
}

#[test]
fn a_server_that_cannot_be_reached_is_an_error_naming_it() {
    let dir = scratch("unreachable");
    // Port 1 on loopback: nothing listens there.
    let err = Store::open_with(&dir, Some("postgres://memagent@127.0.0.1:1/memagent"))
        .err()
        .expect("no server");
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    let err = Store::open_with(&dir, Some("postgres://memagent@127.0.0.1:notaport/x"))
        .err()
        .expect("a bad URL");
    assert!(err.to_string().contains("URL"), "{err}");
}

fn stream_of(store: &Store, lease: &Lease) -> StreamRecord {
    store
        .streams()
        .unwrap()
        .into_iter()
        .find(|s| s.id == lease.stream)
        .unwrap()
}

/// Takes leases for `owner` until one on `stream` comes (deadline 10 s): each try is a
/// transaction on the server, which paces the polling.
fn wait_for_lease(store: &Store, owner: &str, stream: u64) -> Lease {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let taken = store.take_leases(owner, 100, 60_000, 0).unwrap();
        if let Some(lease) = taken.into_iter().find(|l| l.stream == stream) {
            return lease;
        }
        assert!(
            Instant::now() < deadline,
            "{owner} never got stream {stream}"
        );
    }
}

#[test]
fn a_stream_is_leased_to_one_daemon_and_a_late_commit_is_fenced() {
    let url = fresh_database("leases");
    let a = Store::open_with(&scratch("lease-a"), Some(&url)).unwrap();
    let b = Store::open_with(&scratch("lease-b"), Some(&url)).unwrap();
    for i in 0..6 {
        a.append(&format!("s{i}"), b"text to read into memory\n", None)
            .unwrap();
    }
    // Nothing left to read: never leased.
    a.create_stream("idle").unwrap();
    let ttl = 300;
    let mine = a.take_leases("daemon-a", 4, ttl, 0).unwrap();
    assert_eq!(mine.len(), 4);
    let theirs = b.take_leases("daemon-b", 10, ttl, 0).unwrap();
    assert_eq!(theirs.len(), 2, "only the streams daemon-a did not take");
    assert!(theirs
        .iter()
        .all(|t| mine.iter().all(|m| m.stream != t.stream)));

    // Three of them renewed for a minute in one statement; the first left to expire.
    let kept = a.renew_leases(&mine[1..], 60_000).unwrap();
    assert_eq!(kept.len(), 3);
    assert!(kept
        .iter()
        .zip(&mine[1..])
        .all(|(k, m)| k.stream == m.stream && k.epoch == m.epoch && k.expires_ms > m.expires_ms));

    let lease = mine[0].clone();
    let s = stream_of(&a, &lease);
    let step = |n: u64| {
        let cursor = Cursor {
            next_chunk: n,
            offset: n * 5,
            version: n,
        };
        (
            chunk(n - 1, (n - 1) * 5, n * 5),
            model_version(n, n - 1, &format!("v{n}")),
            cursor,
        )
    };
    let (c1, v1, k1) = step(1);
    a.commit_step_under(&lease, &s, GENERAL, &c1, &v1, &k1)
        .unwrap();

    // daemon-a stops renewing (paused, say): once the lease expires, daemon-b takes
    // the stream at the next epoch.
    let taken = wait_for_lease(&b, "daemon-b", s.id);
    assert_eq!(taken.epoch, lease.epoch + 1);
    // daemon-a wakes and commits its next step under the old lease: refused by the
    // fence, nothing written, and the lease cannot be renewed.
    let (c2, v2, k2) = step(2);
    let late = a
        .commit_step_under(&lease, &s, GENERAL, &c2, &v2, &k2)
        .unwrap_err();
    assert!(
        matches!(late, Error::Fenced { epoch, .. } if epoch == lease.epoch),
        "{late}"
    );
    assert!(late.to_string().contains("daemon-a"), "{late}");
    assert_eq!(b.versions(&s, GENERAL).unwrap(), [v1]);
    assert_eq!(b.cursor(&s, GENERAL).unwrap(), k1);
    assert!(a.renew_lease(&lease, ttl).unwrap().is_none());
    // Renewed together, the leases daemon-a still holds come back, the lost one not.
    let still: Vec<u64> = a
        .renew_leases(&mine, 60_000)
        .unwrap()
        .iter()
        .map(|l| l.stream)
        .collect();
    let held: Vec<u64> = mine[1..].iter().map(|l| l.stream).collect();
    assert_eq!(still, held);

    // The new owner commits, renews and gives the stream up; the other takes it at once.
    b.commit_step_under(&taken, &s, GENERAL, &c2, &v2, &k2)
        .unwrap();
    let renewed = b
        .renew_lease(&taken, 60_000)
        .unwrap()
        .expect("still daemon-b's");
    assert_eq!(renewed.epoch, taken.epoch);
    let (all, now) = a.leases().unwrap();
    assert!(all
        .iter()
        .any(|l| l.stream == s.id && l.owner == "daemon-b" && l.expires_ms > now));
    b.release_lease(&renewed).unwrap();
    let back = a.take_leases("daemon-a", 100, 60_000, 0).unwrap();
    let back = back
        .iter()
        .find(|l| l.stream == s.id)
        .expect("released: free at once");
    assert_eq!(back.epoch, taken.epoch + 1, "epochs only rise");
}

#[test]
fn new_text_is_leased_ahead_of_backlog_and_backlogs_take_turns() {
    let url = fresh_database("lease_order");
    let store = Store::open_with(&scratch("lease-order"), Some(&url)).unwrap();
    let fresh_bytes = 4096;
    let backlog = "an old note to read some day\n".repeat(1000);
    for name in ["old-a", "old-b", "old-c"] {
        store.append(name, backlog.as_bytes(), None).unwrap();
    }
    // Created last (the highest id), with a turn of new text: leased first.
    store
        .append("chat", b"Ana: I flew to Rome yesterday.\n", None)
        .unwrap();
    let id = |name: &str| store.stream(name).unwrap().unwrap().id;
    let first = store.take_leases("d1", 1, 60_000, fresh_bytes).unwrap();
    assert_eq!(
        first.iter().map(|l| l.stream).collect::<Vec<_>>(),
        [id("chat")]
    );
    // A backlog held and given back waits behind the backlogs never held.
    let second = store.take_leases("d1", 1, 60_000, fresh_bytes).unwrap();
    assert_eq!(second[0].stream, id("old-a"));
    store.release_lease(&second[0]).unwrap();
    let next: Vec<u64> = store
        .take_leases("d2", 2, 60_000, fresh_bytes)
        .unwrap()
        .iter()
        .map(|l| l.stream)
        .collect();
    assert_eq!(next, [id("old-b"), id("old-c")]);
    let last = store.take_leases("d2", 2, 60_000, fresh_bytes).unwrap();
    assert_eq!(
        last.iter().map(|l| l.stream).collect::<Vec<_>>(),
        [id("old-a")]
    );
    // Read to its end, the chat is no longer unread; the backlogs are, from their start.
    let chat = store.stream("chat").unwrap().unwrap();
    let read = Cursor {
        next_chunk: 1,
        offset: chat.log_len,
        version: 1,
    };
    store
        .commit_step_under(
            &first[0],
            &chat,
            GENERAL,
            &chunk(0, 0, chat.log_len),
            &model_version(1, 0, "v1"),
            &read,
        )
        .unwrap();
    let unread: Vec<(String, u64)> = store
        .unread()
        .unwrap()
        .into_iter()
        .map(|(s, offset)| (s.name, offset))
        .collect();
    assert_eq!(
        unread,
        [
            ("old-a".into(), 0),
            ("old-b".into(), 0),
            ("old-c".into(), 0)
        ]
    );
    store.release_lease(&first[0]).unwrap();
    assert!(store
        .take_leases("d3", 10, 60_000, fresh_bytes)
        .unwrap()
        .is_empty());
}

#[test]
fn daemons_taking_leases_at_once_never_share_a_stream() {
    let url = fresh_database("lease_race");
    let seed = Store::open_with(&scratch("lease-race"), Some(&url)).unwrap();
    for i in 0..30 {
        seed.append(&format!("s{i:02}"), b"pending\n", None)
            .unwrap();
    }
    let taken: Vec<Vec<Lease>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|d| {
                let url = url.clone();
                scope.spawn(move || {
                    let store =
                        Store::open_with(&scratch(&format!("lease-race-{d}")), Some(&url)).unwrap();
                    let mut mine = Vec::new();
                    // Each takes a few at a time, as daemons do, until none is left.
                    loop {
                        let got = store
                            .take_leases(&format!("daemon-{d}"), 4, 60_000, 0)
                            .unwrap();
                        if got.is_empty() {
                            break;
                        }
                        mine.extend(got);
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut streams: Vec<u64> = taken.iter().flatten().map(|l| l.stream).collect();
    streams.sort_unstable();
    let before = streams.len();
    streams.dedup();
    assert_eq!(before, streams.len(), "a stream leased twice: {taken:?}");
    assert_eq!(streams.len(), 30, "every pending stream leased");
}

#[test]
fn the_embedded_database_leases_every_pending_stream_to_its_one_process() {
    let store = sled("leases");
    store.append("a", b"pending\n", None).unwrap();
    store.create_stream("idle").unwrap();
    let leases = store.take_leases("me", 10, 1, 0).unwrap();
    assert_eq!(leases.len(), 1);
    let s = store.require("a").unwrap();
    assert_eq!(leases[0].stream, s.id);
    let (c, v) = (chunk(0, 0, 8), model_version(1, 0, "read"));
    let cursor = Cursor {
        next_chunk: 1,
        offset: 8,
        version: 1,
    };
    store
        .commit_step_under(&leases[0], &s, GENERAL, &c, &v, &cursor)
        .unwrap();
    assert!(
        store.take_leases("me", 10, 1, 0).unwrap().is_empty(),
        "nothing left"
    );
}

#[test]
fn many_calls_from_one_task_of_another_tokio_runtime_all_return() {
    // A daemon's API handler calls the store from its async workers. Tokio lends each
    // task a budget of operations; a call made after the budget is spent must still
    // return, not wait for a turn of the caller's runtime that never comes.
    let store = std::sync::Arc::new(postgres("async_caller"));
    let name = "s";
    store.append(name, b"one line\n", None).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let caller = store.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let found = runtime.block_on(async {
            let task = tokio::spawn(async move {
                (0..1000)
                    .filter(|_| caller.stream(name).unwrap().is_some())
                    .count()
            });
            task.await.unwrap()
        });
        let _ = done.send(found);
    });
    let found = finished
        .recv_timeout(Duration::from_secs(120))
        .expect("store calls from a tokio task stopped returning");
    assert_eq!(found, 1000);
}

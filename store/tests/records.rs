//! The store on a real sled database on disk: appends, the version chain, and records
//! that are corrupt, truncated or of an unknown format (errors that name the key).

use std::path::PathBuf;

use memagent_store::{Error, ExportRecord, StandingAnswer, Store, GENERAL};

mod support;

use support::person_version;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memagent-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn appends_are_deduplicated_per_source_and_survive_reopening() {
    let dir = scratch("append");
    {
        let store = Store::open(&dir).unwrap();
        let a = store.append("notes", b"one\n", Some("/tmp/a.txt")).unwrap();
        assert_eq!((a.bytes, a.revision), (4, false));
        let b = store
            .append("notes", b"one\ntwo\n", Some("/tmp/a.txt"))
            .unwrap();
        assert_eq!((b.bytes, b.revision), (4, false), "only the new bytes");
        let c = store
            .append("notes", b"one\ntwo\n", Some("/tmp/a.txt"))
            .unwrap();
        assert_eq!(c.bytes, 0, "nothing new");
        let d = store.append("notes", b"ONE\n", Some("/tmp/a.txt")).unwrap();
        assert_eq!(
            (d.bytes, d.revision),
            (4, true),
            "a rewritten source is a revision"
        );
        let e = store
            .append_with("notes", b"ONE\n", Some("/tmp/a.txt"), true)
            .unwrap();
        assert_eq!(e.bytes, 4, "forced");
    }
    let store = Store::open(&dir).unwrap();
    let s = store.require("notes").unwrap();
    let log = store.read_log(&s, 0, s.log_len).unwrap();
    assert_eq!(log, b"one\ntwo\nONE\nONE\n");
    assert_eq!(store.read_log(&s, 2, 9).unwrap(), b"e\ntwo\nO");
}

#[test]
fn versions_chain_through_edits() {
    let dir = scratch("chain");
    let store = Store::open(&dir).unwrap();
    let s = store.create_stream("notes").unwrap();
    let v1 = store.add_version(&s, GENERAL, person_version("a")).unwrap();
    let v2 = store.add_version(&s, GENERAL, person_version("b")).unwrap();
    assert_eq!((v1.version, v1.parent), (1, None));
    assert_eq!((v2.version, v2.parent), (2, Some(1)));
    assert_eq!(store.latest(&s, GENERAL).unwrap().unwrap().text, "b");
    assert_eq!(store.version(&s, GENERAL, 1).unwrap().unwrap().text, "a");
}

#[test]
fn corrupt_records_are_errors_that_name_the_key() {
    let dir = scratch("corrupt");
    let store = Store::open(&dir).unwrap();
    let s = store.create_stream("notes").unwrap();
    store
        .add_version(&s, GENERAL, person_version("kept"))
        .unwrap();
    let version_key: Vec<u8> = [s.id, GENERAL, 1]
        .iter()
        .flat_map(|n| n.to_be_bytes())
        .collect();

    // Truncated: a valid format byte, then too few bytes.
    let full = {
        let mut v = vec![1u8];
        v.extend_from_slice(&[1, 2]);
        v
    };
    store.raw_insert("versions", &version_key, &full).unwrap();
    let err = store.version(&s, GENERAL, 1).unwrap_err();
    assert_corrupt(&err, "versions", &format!("versions/{}/0/1", s.id));

    // Unknown format version.
    store
        .raw_insert("versions", &version_key, &[9, 0, 0])
        .unwrap();
    let err = store.versions(&s, GENERAL).unwrap_err();
    assert!(
        matches!(err, Error::UnknownFormat { version: 9, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("format version 9"), "{err}");

    // Empty value.
    store.raw_insert("streams", b"notes", &[]).unwrap();
    let err = store.stream("notes").unwrap_err();
    assert!(
        err.to_string().contains("streams/notes") && err.to_string().contains("empty"),
        "{err}"
    );

    // A content log file shorter than the database says.
    store.append("other", b"hello", None).unwrap();
    let s2 = store.require("other").unwrap();
    let file = dir.join("logs").join(format!("{}.log", s2.id));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(2)
        .unwrap();
    let err = store.read_log(&s2, 0, 5).unwrap_err();
    assert_corrupt(&err, "log", &file.display().to_string());
    assert!(err.to_string().contains("ends before byte 5"), "{err}");
}

#[test]
fn content_kept_in_the_database_by_an_older_memctl_moves_to_the_log_files() {
    let dir = scratch("log-tree");
    let key =
        |id: u64, at: u64| -> Vec<u8> { [id, at].iter().flat_map(|n| n.to_be_bytes()).collect() };
    let id = {
        let store = Store::open(&dir).unwrap();
        store.append("notes", b"Ada prefers tea.\n", None).unwrap();
        let s = store.require("notes").unwrap();
        // As an older memctl stored it: records of the text in the `log` tree (format
        // byte 1), the file not yet written.
        store
            .raw_insert("log", &key(s.id, 0), b"\x01Ada prefers ")
            .unwrap();
        store
            .raw_insert("log", &key(s.id, 12), b"\x01tea.\n")
            .unwrap();
        s.id
    };
    std::fs::remove_file(dir.join("logs").join(format!("{id}.log"))).unwrap();
    let store = Store::open(&dir).unwrap();
    let s = store.require("notes").unwrap();
    assert_eq!(
        store.read_log(&s, 0, s.log_len).unwrap(),
        b"Ada prefers tea.\n"
    );
    drop(store);
    // A second open finds the text where the first put it.
    let store = Store::open(&dir).unwrap();
    assert_eq!(
        store.read_log(&s, 0, s.log_len).unwrap(),
        b"Ada prefers tea.\n"
    );
    store.raw_insert("log", &key(s.id, 0), &[4, 1]).unwrap();
    drop(store);
    // An unknown format byte stops the open with the record named.
    let err = Store::open(&dir).err().expect("an unknown log record");
    assert!(err.to_string().contains(&format!("log/{id}/0")), "{err}");
    assert!(err.to_string().contains("format version 4"), "{err}");
}

#[test]
fn a_second_open_names_the_process_that_holds_the_database() {
    let dir = scratch("lock");
    let _held = Store::open(&dir).unwrap();
    // The lock is per open file description, so a second open in this process is refused
    // just as another process would be.
    let err = Store::open(&dir).err().expect("the database is held");
    let text = err.to_string();
    assert!(
        text.contains(&format!("in use by process {}", std::process::id())),
        "{text}"
    );
}

#[test]
fn removing_a_stream_removes_its_records() {
    let dir = scratch("rm");
    let store = Store::open(&dir).unwrap();
    store.append("gone", b"text", None).unwrap();
    let s = store.require("gone").unwrap();
    store.add_version(&s, GENERAL, person_version("m")).unwrap();
    store.append("kept", b"other", None).unwrap();
    store.remove_stream("gone").unwrap();
    assert!(store.stream("gone").unwrap().is_none());
    assert!(matches!(
        store.remove_stream("gone"),
        Err(Error::NoStream(_))
    ));
    let kept = store.require("kept").unwrap();
    assert_eq!(store.read_log(&kept, 0, kept.log_len).unwrap(), b"other");
    let logs = dir.join("logs");
    assert!(!logs.join(format!("{}.log", s.id)).exists());
    assert!(logs.join(format!("{}.log", kept.id)).exists());
}

#[test]
fn bytes_past_the_committed_length_are_never_read_and_cut_at_open() {
    let dir = scratch("tail");
    let file = {
        let store = Store::open(&dir).unwrap();
        store.append("notes", b"kept\n", None).unwrap();
        let s = store.require("notes").unwrap();
        dir.join("logs").join(format!("{}.log", s.id))
    };
    // An append killed after its bytes were written, before its commit.
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap();
    std::io::Write::write_all(&mut log, b"never committed\n").unwrap();
    drop(log);
    let store = Store::open(&dir).unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 5);
    store.append("notes", b"next\n", None).unwrap();
    let s = store.require("notes").unwrap();
    assert_eq!(store.read_log(&s, 0, s.log_len).unwrap(), b"kept\nnext\n");
    // Files of no stream (a removal cut short) are deleted at open.
    let stray = dir.join("logs").join("999999.log");
    std::fs::write(&stray, b"stray").unwrap();
    drop(store);
    let _store = Store::open(&dir).unwrap();
    assert!(!stray.exists());
}

#[test]
fn exported_versions_keep_their_timings_bit_for_bit() {
    // Step timings are arbitrary f64 values; an export line parsed back must give the same
    // record, or an export/import round trip would change the history it copies.
    let mut seconds = 0.123_456_789_012_345_f64;
    for i in 0..2000 {
        seconds = (seconds * 7.389_056_098_930_65 + i as f64 * 1e-7).fract() * 40.0;
        let mut version = person_version("Ada likes green tea.");
        version.seconds = seconds;
        let record = ExportRecord::Version { chain: 1, version };
        let line = serde_json::to_string(&record).unwrap();
        let back: ExportRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, record, "{line}");
    }
}

#[test]
fn writes_that_would_eat_the_reserve_are_refused_and_reads_go_on() {
    let dir = scratch("space");
    let store = Store::open(&dir).unwrap();
    store.append("notes", b"Ada prefers tea.\n", None).unwrap();
    store.append("old", b"To be deleted.\n", None).unwrap();
    let free = store.space().unwrap().available;
    assert!(free > 0);
    // A reserve above what the filesystem has left: every write is refused.
    store.set_reserve(free + (1 << 30));
    let refused = store
        .append("notes", b"Ada moved to Oslo.\n", None)
        .unwrap_err();
    assert!(matches!(refused, Error::NoSpace { .. }), "{refused}");
    let message = refused.to_string();
    assert!(message.contains(dir.to_str().unwrap()), "{message}");
    assert!(message.contains("kept free"), "{message}");
    assert!(store.space().unwrap().refusing);
    assert!(matches!(
        store.create_stream("new").unwrap_err(),
        Error::NoSpace { .. }
    ));
    let stream = store.require("notes").unwrap();
    assert!(matches!(
        store
            .add_version(&stream, GENERAL, person_version("Ada: tea."))
            .unwrap_err(),
        Error::NoSpace { .. }
    ));
    // Nothing of the refused writes was stored; reads and removals go on.
    assert_eq!(
        store.read_log(&stream, 0, stream.log_len).unwrap(),
        b"Ada prefers tea.\n"
    );
    assert!(store.stream("new").unwrap().is_none());
    assert!(store.versions(&stream, GENERAL).unwrap().is_empty());
    store.remove_stream("old").unwrap();
    // Space back: writing resumes.
    store.set_reserve(0);
    store
        .append("notes", b"Ada moved to Oslo.\n", None)
        .unwrap();
    assert!(!store.space().unwrap().refusing);
    let stream = store.require("notes").unwrap();
    assert_eq!(
        store.read_log(&stream, 0, stream.log_len).unwrap(),
        b"Ada prefers tea.\nAda moved to Oslo.\n"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_export_carries_everything_a_stream_has_and_imports_the_same() {
    let dir = scratch("export-all");
    let store = Store::open(&dir).unwrap();
    // A chat log's turns (with their provenance), a memory version, a standing answer.
    let text = b"[2026-01-15 09:00] user (Ana): I moved to Porto.\n";
    store
        .append_turns("chat", text, Some("/logs/chat.jsonl"), false, vec![(0, 3)])
        .unwrap();
    let stream = store.require("chat").unwrap();
    store
        .add_version(&stream, GENERAL, person_version("Ana lives in Porto."))
        .unwrap();
    let answer = StandingAnswer {
        question: "Where does Ana live?".to_string(),
        version: 1,
        answer: "Porto".to_string(),
        created: 1_768_467_600,
        seconds: 0.25,
    };
    store.add_answer(&stream, &answer).unwrap();

    let records = store.export("chat").unwrap();
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    let back: Vec<ExportRecord> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let copy = store.import(&back, Some("copy")).unwrap();
    assert_eq!(store.answers(&copy).unwrap(), [answer]);
    assert_eq!(
        store.questions(&copy).unwrap(),
        store.questions(&stream).unwrap()
    );
    assert_eq!(
        store.segment_at(&copy, 10).unwrap(),
        store.segment_at(&stream, 10).unwrap()
    );
    assert!(store.segment_at(&copy, 10).unwrap().is_some());
    // The copy exports the same lines but its name.
    let again: Vec<String> = store
        .export("copy")
        .unwrap()
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    assert_eq!(again[1..], lines[1..]);
    // An answer whose question comes after it names its line.
    let mut misplaced = back.clone();
    let at = misplaced
        .iter()
        .position(|r| matches!(r, ExportRecord::Answer(_)))
        .unwrap();
    let answer = misplaced.remove(at);
    misplaced.insert(1, answer);
    let refused = store.import(&misplaced, Some("broken")).unwrap_err();
    assert!(refused.to_string().contains("line 2"), "{refused}");
    assert!(store.stream("broken").unwrap().is_none());
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_key_of_the_wrong_length_is_an_error_naming_it() {
    // Found by fuzzing (tests/fuzz.rs): an export read a version key's chain at bytes
    // 8..16 of whatever key the tree held, and panicked on a short one.
    let dir = scratch("short-key");
    let store = Store::open(&dir).unwrap();
    let s = store.append("notes", b"Ada prefers tea.\n", None).unwrap();
    assert_eq!(s.log_len, 17);
    let id = store.require("notes").unwrap().id;
    store
        .raw_insert("versions", &id.to_be_bytes(), &[1, 0])
        .unwrap();
    let err = store.export("notes").unwrap_err();
    assert_corrupt(&err, "versions", "a key of 8 bytes, expected 24");
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `err` is a corrupt record of `tree` whose message says `says`.
fn assert_corrupt(err: &Error, tree: &str, says: &str) {
    assert!(
        matches!(err, Error::Corrupt { tree: t, .. } if *t == tree),
        "{err}"
    );
    assert!(err.to_string().contains(says), "{err}");
}

#[test]
fn a_long_append_reads_back_in_any_range_and_exports_in_pieces() {
    let dir = scratch("pieces");
    let store = Store::open(&dir).unwrap();
    // Two and a half pieces of text without a line break, with characters of 1 to 4
    // bytes so that the cuts fall inside them.
    let unit = "ab é ✓ 𝒥 ";
    let text = unit.repeat(memagent_store::LOG_PIECE * 5 / 2 / unit.len());
    store.append("big", b"before\n", None).unwrap();
    let appended = store.append("big", text.as_bytes(), None).unwrap();
    assert_eq!(appended.bytes, text.len() as u64);
    let stream = store.require("big").unwrap();
    assert_eq!(stream.log_len, 7 + text.len() as u64);
    let log = store.read_log(&stream, 0, stream.log_len).unwrap();
    assert_eq!(&log[..7], b"before\n");
    assert_eq!(&log[7..], text.as_bytes());
    // Any range reads back, across the pieces' edges.
    for (from, to) in [(5, 20), (1 << 20, (1 << 20) + 9), (7, stream.log_len)] {
        assert_eq!(
            store.read_log(&stream, from, to).unwrap(),
            log[from as usize..to as usize]
        );
    }
    let pieces: Vec<(u64, String)> = store
        .export("big")
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            ExportRecord::Log { offset, text } => Some((offset, text)),
            _ => None,
        })
        .collect();
    // 7 + 2.5 MiB, exported in records of at most a MiB each.
    assert_eq!(pieces.len(), 3);
    let mut at = 0;
    for (offset, piece) in &pieces {
        assert_eq!(*offset, at, "pieces are contiguous");
        assert!(piece.len() <= memagent_store::LOG_PIECE);
        at += piece.len() as u64;
    }
    assert_eq!(at, stream.log_len);
}

//! Fuzzing stored records: arbitrary bytes behind the format byte (and without it) in
//! every tree of a real sled database, under a stream's keys. Reading never panics: each
//! record decodes, or is an error naming its tree. 64 cases by default;
//! `PROPTEST_CASES=100000` for a longer run. Failing inputs are kept in
//! `proptest-regressions/` and replayed first.

use memagent_store::{StandingAnswer, Store, GENERAL};
use proptest::prelude::*;

mod support;

use support::person_version;

const TREES: [&str; 10] = [
    "streams",
    "log",
    "sources",
    "chunks",
    "versions",
    "cursors",
    "questions",
    "files",
    "answers",
    "segments",
];

/// A record's bytes: the current format byte then anything, any bytes, or nothing.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200).prop_map(|mut v| {
            v.insert(0, 1);
            v
        }),
        prop::collection::vec(any::<u8>(), 0..200),
        Just(Vec::new()),
    ]
}

proptest! {
    // Each case opens a database on disk: 64 by default.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]
    #[test]
    fn corrupt_records_in_any_tree_are_errors_not_panics(
        writes in prop::collection::vec((0..TREES.len(), 0u64..4, value()), 1..6)
    ) {
        let dir = std::env::temp_dir().join(format!(
            "memagent-store-fuzz-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        store.append_turns("notes", b"Ada likes tea.\n", Some("/n.txt"), false, vec![(0, 1)]).unwrap();
        let stream = store.require("notes").unwrap();
        store.add_version(&stream, GENERAL, person_version("Ada likes tea.")).unwrap();
        store.add_answer(&stream, &StandingAnswer {
            question: "What does Ada like?".into(),
            version: 1,
            answer: "tea".into(),
            created: 0,
            seconds: 0.0,
        }).unwrap();
        for (tree, n, value) in &writes {
            let key: Vec<u8> = match TREES[*tree] {
                "streams" => b"notes".to_vec(),
                "files" => b"/n.txt".to_vec(),
                _ => [stream.id, *n, 1].iter().flat_map(|k| k.to_be_bytes()).take(8 * (1 + (*n as usize % 3))).collect(),
            };
            store.raw_insert(TREES[*tree], &key, value).unwrap();
        }
        // Every read of the stream: a value or an error, never a panic.
        let _ = store.streams();
        let _ = store.files();
        if let Ok(Some(stream)) = store.stream("notes") {
            let _ = store.read_log(&stream, 0, stream.log_len);
            let _ = store.versions(&stream, GENERAL);
            let _ = store.latest(&stream, GENERAL);
            let _ = store.cursor(&stream, GENERAL);
            let _ = store.chunks(&stream);
            let _ = store.questions(&stream);
            let _ = store.answers(&stream);
            let _ = store.segment_at(&stream, 3);
            let _ = store.export("notes");
        }
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

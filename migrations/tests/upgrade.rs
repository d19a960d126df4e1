//! Every past schema version has a fixture database in `migrations/fixtures/`; these
//! tests upgrade copies of them. `write_v1_fixture` (ignored) is how the v1 fixture was
//! made: the v1 layout written byte by byte.

use std::path::{Path, PathBuf};

use memagent_migrations::{migrate, set_version, stored_version, Error, CURRENT};

fn fixture(version: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(format!("v{version}"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memagent-migrate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A v1 `streams` value: format byte 1, then postcard (id, name, created, log_len).
fn v1_stream(id: u64, name: &str, log_len: u64) -> Vec<u8> {
    let mut value = vec![1u8];
    value.extend(postcard::to_allocvec(&(id, name, 1_763_800_000u64, log_len)).unwrap());
    value
}

#[test]
#[ignore = "writes migrations/fixtures/v1; run by hand when the fixture must be remade"]
fn write_v1_fixture() {
    let dir = fixture(1);
    let _ = std::fs::remove_dir_all(&dir);
    let db = sled::open(&dir).unwrap();
    let streams = db.open_tree("streams").unwrap();
    let log = db.open_tree("log").unwrap();
    for (id, name, text) in [
        (1u64, "notes", "Ada prefers tea.\n"),
        (2, "chat", "user: hi\n"),
    ] {
        streams
            .insert(name.as_bytes(), v1_stream(id, name, text.len() as u64))
            .unwrap();
        let mut key = id.to_be_bytes().to_vec();
        key.extend_from_slice(&0u64.to_be_bytes());
        let mut value = vec![1u8];
        value.extend_from_slice(text.as_bytes());
        log.insert(key, value).unwrap();
    }
    set_version(&db, 1).unwrap();
    db.flush().unwrap();
}

#[test]
fn v1_database_is_upgraded_to_the_current_schema() {
    let dir = scratch("v1");
    copy_dir(&fixture(1), &dir);
    let db = sled::open(&dir).unwrap();
    assert_eq!(stored_version(&db).unwrap(), Some(1));
    assert!(db.open_tree("stream_names").unwrap().is_empty());
    assert_eq!(migrate(&db).unwrap(), CURRENT);
    assert_eq!(stored_version(&db).unwrap(), Some(CURRENT));
    let names = db.open_tree("stream_names").unwrap();
    assert_eq!(names.get(1u64.to_be_bytes()).unwrap().unwrap(), b"notes");
    assert_eq!(names.get(2u64.to_be_bytes()).unwrap().unwrap(), b"chat");
    // Running again is a no-op.
    assert_eq!(migrate(&db).unwrap(), CURRENT);
    assert_eq!(names.len(), 2);
}

#[test]
fn a_new_database_is_stamped_with_the_current_schema() {
    let dir = scratch("new");
    let db = sled::open(&dir).unwrap();
    assert_eq!(stored_version(&db).unwrap(), None);
    assert_eq!(migrate(&db).unwrap(), CURRENT);
    assert_eq!(stored_version(&db).unwrap(), Some(CURRENT));
}

#[test]
fn a_database_newer_than_the_binary_is_refused() {
    let dir = scratch("newer");
    let db = sled::open(&dir).unwrap();
    set_version(&db, CURRENT + 7).unwrap();
    let err = migrate(&db).unwrap_err();
    assert!(
        matches!(err, Error::TooNew { database, binary } if database == CURRENT + 7 && binary == CURRENT)
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("{}", CURRENT + 7)) && text.contains(&CURRENT.to_string()),
        "{text}"
    );
}

#[test]
fn a_failing_step_leaves_the_database_at_its_version() {
    let dir = scratch("bad-step");
    let db = sled::open(&dir).unwrap();
    set_version(&db, 1).unwrap();
    // A v1 stream record with an unknown format byte: the step must fail as a whole.
    db.open_tree("streams")
        .unwrap()
        .insert("broken", vec![9u8, 1, 2])
        .unwrap();
    db.open_tree("streams")
        .unwrap()
        .insert("fine", v1_stream(3, "fine", 0))
        .unwrap();
    let err = migrate(&db).unwrap_err().to_string();
    assert!(
        err.contains("streams/broken") && err.contains("v1 to v2"),
        "{err}"
    );
    assert_eq!(stored_version(&db).unwrap(), Some(1));
    assert!(
        db.open_tree("stream_names").unwrap().is_empty(),
        "nothing half-applied"
    );
}

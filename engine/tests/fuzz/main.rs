//! Fuzzing GGUF files: a small valid model file (its header, metadata and tensor table)
//! with bytes changed, inserted and cut off, opened as memctl opens a model. Never a
//! panic and never an allocation the file's sizes do not justify: the file opens, or the
//! error names it. 256 cases by default; `PROPTEST_CASES=100000` for a longer run.
//! Failing inputs are kept in `proptest-regressions/` and replayed first.

use std::path::PathBuf;
use std::sync::OnceLock;

use memagent_engine::{GgufFile, LoadOptions, LocalModel};
use proptest::prelude::*;

/// A tiny valid model file's bytes, written once per run.
fn seed() -> &'static [u8] {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = scratch("seed");
        let path = memagent_engine::testing::write_tiny_model(&dir, "llama");
        std::fs::read(path).unwrap()
    })
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "memagent-fuzz-gguf-{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Edits to a file: (where, as a share of the length, what).
#[derive(Debug, Clone)]
enum Edit {
    Set(f64, u8),
    /// A little-endian u64 written over 8 bytes: lengths and counts are u64 in GGUF.
    Count(f64, u64),
    Insert(f64, Vec<u8>),
    Cut(f64),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Most of a GGUF's structure is in its first bytes: edits lean there.
    let at = prop_oneof![0.0..0.02f64, 0.0..1.0f64];
    prop_oneof![
        (at.clone(), any::<u8>()).prop_map(|(a, b)| Edit::Set(a, b)),
        (
            at.clone(),
            prop_oneof![Just(u64::MAX), Just(1u64 << 40), Just(0), any::<u64>()]
        )
            .prop_map(|(a, n)| Edit::Count(a, n)),
        (at.clone(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(a, b)| Edit::Insert(a, b)),
        at.prop_map(Edit::Cut),
    ]
}

fn apply(bytes: &mut Vec<u8>, edit: &Edit) {
    let place = |share: f64, len: usize| ((share * len as f64) as usize).min(len);
    match edit {
        Edit::Set(a, b) => {
            let i = place(*a, bytes.len());
            if i < bytes.len() {
                bytes[i] = *b;
            }
        }
        Edit::Count(a, n) => {
            let i = place(*a, bytes.len().saturating_sub(8));
            if i + 8 <= bytes.len() {
                bytes[i..i + 8].copy_from_slice(&n.to_le_bytes());
            }
        }
        Edit::Insert(a, b) => {
            let i = place(*a, bytes.len());
            bytes.splice(i..i, b.iter().copied());
        }
        Edit::Cut(a) => {
            let i = place(*a, bytes.len());
            bytes.truncate(i);
        }
    }
}

proptest! {
    #[test]
    fn a_damaged_model_file_opens_or_says_why(edits in prop::collection::vec(edit(), 1..4)) {
        let mut bytes = seed().to_vec();
        for e in &edits {
            apply(&mut bytes, e);
        }
        let dir = scratch("case");
        let path = dir.join("damaged.gguf");
        std::fs::write(&path, &bytes).unwrap();
        if let Err(e) = GgufFile::open(&path) {
            prop_assert!(e.to_string().contains("damaged.gguf"), "{e}");
        }
        if let Err(e) = LocalModel::load(&path, &LoadOptions::default()) {
            prop_assert!(!e.to_string().is_empty());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The MemAgent templates are a protocol: the engine must produce them byte for byte.
//! The expected texts and their sha256 (from the protocol's README) are test data here.

use memagent_agent::{Template, FINAL_BOXED, FINAL_EVAL, NO_MEMORY, UPDATE};
use sha2::{Digest, Sha256};

const EXPECTED_UPDATE: &str = include_str!("../data/memagent-protocol/update.txt");
const EXPECTED_FINAL_BOXED: &str = include_str!("../data/memagent-protocol/final-boxed.txt");
const EXPECTED_FINAL_EVAL: &str = include_str!("../data/memagent-protocol/final-eval.txt");

const SHA256SUMS: &str = include_str!("../data/memagent-protocol/SHA256SUMS");

fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn expected_sha(file: &str) -> &'static str {
    SHA256SUMS
        .lines()
        .find_map(|line| {
            let (sum, name) = line.split_once("  ")?;
            (name == file).then_some(sum)
        })
        .unwrap_or_else(|| panic!("{file} is listed in SHA256SUMS"))
}

#[test]
fn templates_are_the_protocol_files_byte_for_byte() {
    for (template, file) in [
        (UPDATE.text, "update.txt"),
        (FINAL_BOXED.text, "final-boxed.txt"),
        (FINAL_EVAL.text, "final-eval.txt"),
        (NO_MEMORY, "no-memory.txt"),
    ] {
        assert_eq!(sha256(template), expected_sha(file), "{file}");
    }
    // The README's published prefixes, so that the test data itself cannot drift.
    assert!(expected_sha("update.txt").starts_with("49fa5818"));
    assert!(expected_sha("final-boxed.txt").starts_with("64632c4a"));
    assert!(expected_sha("final-eval.txt").starts_with("76c0395b"));
    assert!(expected_sha("no-memory.txt").starts_with("1dd86650"));
    assert_eq!(NO_MEMORY, "No previous memory");
}

/// Substitution as the protocol states it: each marker replaced once, every other
/// character literal.
fn reference_fill(expected: &str, prompt: &str, memory: &str, chunk: &str) -> String {
    expected
        .replacen("{prompt}", prompt, 1)
        .replacen("{memory}", memory, 1)
        .replacen("{chunk}", chunk, 1)
}

#[test]
fn filled_templates_equal_the_protocol_with_substitutions() {
    let prompt = "What is the special magic number for Zurich?";
    let memory = "The number for Zurich is 7391824.\nKeep it.";
    let chunk = "Paul wrote essays.  Tabs\tand unicode: café 日本.\n";
    let cases: [(Template, &str); 3] = [
        (UPDATE, EXPECTED_UPDATE),
        (FINAL_BOXED, EXPECTED_FINAL_BOXED),
        (FINAL_EVAL, EXPECTED_FINAL_EVAL),
    ];
    for (template, expected) in cases {
        let filled = template.fill(prompt, memory, chunk);
        assert_eq!(
            filled,
            reference_fill(expected, prompt, memory, chunk),
            "{}",
            template.id
        );
    }
    let update = UPDATE.fill(prompt, NO_MEMORY, chunk);
    assert!(update.contains("<problem> \nWhat is the special"));
    assert!(update.contains("<memory>\nNo previous memory\n</memory>"));
    assert!(update.ends_with("\n\nUpdated memory:\n"));
    let boxed = FINAL_BOXED.fill(prompt, memory, "");
    assert!(boxed.contains("put the answer in \\boxed{}."));
}

#[test]
fn templates_carry_ids_and_versions() {
    let ids: Vec<(&str, u32)> = [UPDATE, FINAL_BOXED, FINAL_EVAL]
        .iter()
        .map(|t| (t.id, t.version))
        .collect();
    assert_eq!(
        ids,
        [
            ("memagent-update", 1),
            ("memagent-final-boxed", 1),
            ("memagent-final-eval", 1)
        ]
    );
}

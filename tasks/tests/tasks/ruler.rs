//! RULER-style task generation on the real tokenizer: deterministic per seed, inserts
//! where they say, lengths within 2% of what was asked.

use memagent_agent::TextTokenizer;
use memagent_engine::Tokenizer;
use memagent_tasks::{generate, Haystack, QaItem, Sources, Task, ALL_TASKS};

use crate::support;

fn qa_items() -> Vec<QaItem> {
    (0..12)
        .map(|i| QaItem {
            question: format!("Which harbour did ship {i} sail from?"),
            answers: vec![format!("Port {i}")],
            gold: vec![format!(
                "Ship {i} sailed from Port {i} on a calm morning in spring."
            )],
            distractors: (0..3)
                .map(|j| {
                    format!(
                        "Paragraph {j} about ship {i}: the crew painted the deck and ate bread."
                    )
                })
                .collect(),
        })
        .collect()
}

#[test]
fn tasks_are_deterministic_placed_and_sized() {
    let tokenizer = Tokenizer::from_file(&support::model_path()).unwrap();
    let haystack = Haystack::from_text(
        include_str!("../../../engine/tests/data/filler.txt"),
        "filler.txt",
    )
    .unwrap();
    let qa = qa_items();
    let sources = Sources {
        haystack: &haystack,
        tokenizer: &tokenizer,
        qa: &qa,
    };
    for &task in ALL_TASKS {
        for length in [1024usize, 4096] {
            let a = generate(&sources, task, length, 3).unwrap();
            let b = generate(&sources, task, length, 3).unwrap();
            assert_eq!(
                a.document, b.document,
                "{task} at {length}: same seed, same text"
            );
            assert_eq!(a.expected, b.expected);
            let c = generate(&sources, task, length, 4).unwrap();
            assert_ne!(a.document, c.document, "{task}: another seed, another text");

            let tokens = TextTokenizer::encode(&tokenizer, &a.document)
                .unwrap()
                .len();
            assert_eq!(tokens, a.tokens);
            let off = (tokens as f64 - length as f64).abs() / length as f64;
            assert!(
                off <= 0.02,
                "{task} at {length}: {tokens} tokens ({:.1}% off)",
                off * 100.0
            );

            assert!(!a.expected.is_empty(), "{task}");
            for insert in &a.inserts {
                assert!(
                    a.document[insert.byte..].starts_with(&insert.text),
                    "{task}: `{}` is at byte {}",
                    insert.text,
                    insert.byte
                );
                let before = TextTokenizer::encode(&tokenizer, &a.document[..insert.byte])
                    .unwrap()
                    .len();
                let depth = before as f64 / tokens as f64;
                assert!(
                    (depth - insert.depth).abs() < 0.05,
                    "{task}: said depth {:.3}, found {depth:.3}",
                    insert.depth
                );
            }
            match task {
                Task::NiahSingle | Task::NiahSingleWord | Task::NiahSingleUuid => {
                    assert_eq!(a.inserts.len(), 1);
                    assert!(a.inserts[0].text.contains(&a.expected[0]));
                }
                Task::NiahMultikey => {
                    assert_eq!(a.inserts.len(), 4, "the needle and three distractors");
                    assert_eq!(a.expected.len(), 1);
                }
                Task::NiahMultivalue | Task::NiahMultiquery => {
                    assert_eq!(a.expected.len(), 4);
                    for value in &a.expected {
                        assert!(a.document.contains(value.as_str()));
                    }
                }
                Task::Vt => {
                    // The chain is in reading order and every name is in it.
                    let mut last = 0;
                    for (insert, name) in a.inserts.iter().zip(&a.expected) {
                        assert!(insert.text.starts_with(&format!("VAR {name} =")));
                        assert!(insert.byte >= last, "assignments in order");
                        last = insert.byte;
                    }
                }
                Task::Cwe | Task::Fwe => {
                    // The expected words are the most frequent ones.
                    let words: Vec<&str> = a
                        .document
                        .split_whitespace()
                        .filter(|w| w.chars().all(char::is_alphabetic))
                        .collect();
                    let count = |w: &str| words.iter().filter(|x| **x == w).count();
                    let least_expected = a.expected.iter().map(|e| count(e)).min().unwrap();
                    let others = words
                        .iter()
                        .filter(|w| !a.expected.iter().any(|e| e == *w))
                        .map(|w| count(w))
                        .max()
                        .unwrap_or(0);
                    assert!(
                        least_expected > others,
                        "{task} at {length}: {least_expected} vs {others}"
                    );
                }
                Task::Qa => {
                    let item = &qa[3 % qa.len()];
                    assert_eq!(a.question, item.question);
                    assert!(
                        a.document.contains(&item.gold[0]),
                        "the gold paragraph is in"
                    );
                }
            }
        }
    }
}

#[test]
fn the_validation_split_shares_no_sentence_key_or_seed_with_the_benchmark() {
    use memagent_tasks::{generate_split, EvalSplit};
    let tokenizer = Tokenizer::from_file(&support::model_path()).unwrap();
    let filler = memagent_tasks::training::validation_filler().unwrap();
    let sources = Sources {
        haystack: &filler,
        tokenizer: &tokenizer,
        qa: &[],
    };
    for task in [
        Task::NiahSingle,
        Task::NiahMultikey,
        Task::NiahMultivalue,
        Task::NiahMultiquery,
        Task::Vt,
    ] {
        let test = generate_split(&sources, task, 1024, 3, EvalSplit::Test).unwrap();
        assert_eq!(
            test.document,
            generate(&sources, task, 1024, 3).unwrap().document,
            "{task}: the test split is the benchmark's"
        );
        let v = generate_split(&sources, task, 1024, 3, EvalSplit::Validation).unwrap();
        let again = generate_split(&sources, task, 1024, 3, EvalSplit::Validation).unwrap();
        assert_eq!(v.document, again.document, "{task}: deterministic");
        assert_ne!(v.expected, test.expected, "{task}: other values");
        for word in ["special magic", "VAR ", "mentioned in the provided text"] {
            assert!(!v.document.contains(word), "{task}: `{word}` in validation");
            assert!(!v.question.contains(word), "{task}: `{word}` in validation");
        }
        assert!(
            !memagent_tasks::CITIES
                .iter()
                .any(|c| v.question.contains(c)),
            "{task}: a benchmark key in {}",
            v.question
        );
        for value in &v.expected {
            assert!(v.document.contains(value.as_str()), "{task}: {value}");
        }
    }
}

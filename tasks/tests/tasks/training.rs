//! Training trajectories on the real tokenizer: deterministic per seed, oracle memories
//! within the cap, planted relevant facts kept from their chunk on, distractors never in
//! memory, and validation patterns absent from the training split.

use memagent_agent::Writer;
use memagent_engine::{GgufFile, Tokenizer};
use memagent_tasks::training::{
    example, patterns, trajectory, DataConfig, Fillers, Mode, Split, EVIDENCE_FAMILIES,
    QUESTION_FAMILIES,
};

use crate::support;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(&support::model_path()).unwrap()).unwrap()
}

#[test]
fn trajectories_keep_planted_facts_and_never_distractors() {
    let tok = tokenizer();
    let config = DataConfig {
        chunk_min: 256,
        chunk_max: 400,
        ..DataConfig::default()
    };
    let train = Fillers::new(Split::Train, None).unwrap();
    let val = Fillers::new(Split::Validation, None).unwrap();
    let mut families = std::collections::BTreeSet::new();
    for (split, fillers) in [(Split::Train, &train), (Split::Validation, &val)] {
        for i in 0..40 {
            let t = trajectory(&tok, fillers, &config, split, i).unwrap();
            let again = trajectory(&tok, fillers, &config, split, i).unwrap();
            assert_eq!(
                serde_json::to_string(&t).unwrap(),
                serde_json::to_string(&again).unwrap(),
                "same seed, same trajectory"
            );
            families.insert(t.family);
            let mut planted: Vec<&str> = Vec::new();
            for (s, step) in t.steps.iter().enumerate() {
                assert!(
                    tok.encode(&step.memory_after, false).unwrap().len() <= config.memory_tokens
                );
                if s > 0 {
                    assert_eq!(step.memory_before, t.steps[s - 1].memory_after);
                }
                for d in &step.distractors {
                    assert!(
                        step.chunk.contains(d.as_str()),
                        "distractor is in its chunk"
                    );
                    for later in &t.steps[s..] {
                        assert!(
                            !later.memory_after.contains(d.as_str()),
                            "distractor {d} in memory"
                        );
                    }
                }
                if t.mode == Mode::Question {
                    for r in &step.relevant {
                        assert!(step.chunk.contains(r.as_str()));
                        planted.push(r);
                    }
                    // Every planted fact not superseded by an update is in memory from now on.
                    for r in &planted {
                        let superseded =
                            t.family == "update" && !t.memory_lines.iter().any(|l| l == r);
                        if !superseded {
                            assert!(step.memory_after.contains(*r), "{r} missing after step {s}");
                        }
                    }
                }
            }
            for line in &t.memory_lines {
                assert!(t.steps.last().unwrap().memory_after.contains(line.as_str()));
            }
            if t.mode == Mode::General {
                // Each remembered fact states values that were said in the text, and the
                // question asked of the memory expects one fact's values (or "not known").
                let text: String = t.steps.iter().map(|s| s.chunk.as_str()).collect();
                let lower = text.to_lowercase();
                assert_eq!(t.fact_values.len(), t.memory_lines.len());
                for (line, values) in t.memory_lines.iter().zip(&t.fact_values) {
                    assert!(!values.is_empty(), "{line} states no value");
                    for v in values {
                        assert!(
                            line.contains(v.as_str()) && lower.contains(&v.to_lowercase()),
                            "{v} of {line:?} in {text}"
                        );
                    }
                }
                assert!(
                    t.expected == ["not known"] || t.fact_values.contains(&t.expected),
                    "{:?}",
                    t.expected
                );
                // Acknowledgements repeat a fact in the second person.
                for l in text.lines().filter(|l| l.contains("Noted: ")) {
                    assert!(!l.contains(" my ") && !l.contains(" I "), "{l}");
                }
            }
            let e = t.examples(Writer::Rewrite);
            assert_eq!(e.len(), t.steps.len() + 1);
            assert!(e.last().unwrap().target.contains(&t.expected[0]) || t.mode == Mode::General);
            // The line writer learns only what each step adds: the lines of the memory
            // after it that were not there before, or NONE.
            if t.mode == Mode::General {
                for (step, ex) in t.steps.iter().zip(t.examples(Writer::Lines)) {
                    assert_eq!(ex.template.id, "memagent-general-lines");
                    let before: Vec<&str> = step.memory_before.lines().collect();
                    let added: Vec<&str> = step
                        .memory_after
                        .lines()
                        .filter(|l| !before.contains(l) && *l != "No facts yet.")
                        .collect();
                    if added.is_empty() {
                        assert_eq!(ex.target, "NONE");
                    } else {
                        assert_eq!(ex.target.lines().collect::<Vec<_>>(), added);
                        assert!(step.relevant.len() >= added.len());
                    }
                }
            }
        }
    }
    for f in QUESTION_FAMILIES {
        assert!(families.contains(f), "family {f} generated");
    }
}

#[test]
fn validation_patterns_are_absent_from_training() {
    let train = patterns(Split::Train);
    for p in patterns(Split::Validation) {
        assert!(
            !train.contains(&p),
            "validation pattern {p:?} is also a training pattern"
        );
    }
    // Nor any wording of one: no statement of validation shares a run of four words
    // (three of them literal, not slots) with a training statement.
    let runs = |p: &str| -> Vec<Vec<String>> {
        let words: Vec<String> = p
            .split(|c: char| !(c.is_alphanumeric() || "'{}_".contains(c)))
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect();
        words
            .windows(4)
            .filter(|w| w.iter().filter(|w| !w.starts_with('{')).count() >= 3)
            .map(<[String]>::to_vec)
            .collect()
    };
    let statements = |split| patterns(split).into_iter().filter(|p| !p.ends_with('?'));
    let seen: Vec<Vec<String>> = statements(Split::Train).flat_map(runs).collect();
    for p in statements(Split::Validation) {
        for run in runs(p) {
            assert!(
                !seen.contains(&run),
                "validation pattern {p:?} shares {run:?} with a training pattern"
            );
        }
    }
    let tok = tokenizer();
    let config = DataConfig {
        chunk_min: 256,
        chunk_max: 300,
        ..DataConfig::default()
    };
    let train_fillers = Fillers::new(Split::Train, None).unwrap();
    // No validation key appears in training trajectories.
    for i in 0..20 {
        let t = trajectory(&tok, &train_fillers, &config, Split::Train, i).unwrap();
        let text: String = t.steps.iter().map(|s| s.chunk.as_str()).collect();
        for key in memagent_tasks::training::keys(Split::Validation) {
            assert!(
                !text.contains(key),
                "validation key {key} in training trajectory {i}"
            );
        }
    }
}

/// The passage of an evidence prompt.
fn passage(message: &str) -> &str {
    message
        .split("Passage: ")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("a passage")
}

#[test]
fn evidence_examples_answer_from_their_one_passage_or_say_it_is_not_known() {
    let tok = tokenizer();
    let config = DataConfig {
        evidence_share: 1.0,
        ..DataConfig::default()
    };
    let fillers = Fillers::new(Split::Train, None).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut answered = 0;
    for i in 0..200 {
        let e = example(&tok, &fillers, &config, Split::Train, i).unwrap();
        let again = example(&tok, &fillers, &config, Split::Train, i).unwrap();
        assert_eq!((&e.message, &e.target), (&again.message, &again.target));
        assert_eq!(e.kind, "evidence");
        assert_eq!(e.template.id, "memagent-passage-answer");
        seen.insert(e.family);
        let found = passage(&e.message).to_lowercase();
        for v in &e.values {
            assert!(e.target.contains(v.as_str()), "{v} in {}", e.target);
            assert!(found.contains(&v.to_lowercase()), "{v} said in {found}");
        }
        for v in &e.stale {
            assert!(!e.target.contains(v.as_str()), "stale {v} in {}", e.target);
        }
        match e.values.len() {
            0 => assert_eq!(e.target, "not known", "{}", e.message),
            1 => answered += 1,
            n => panic!("{n} values from one passage: {}", e.message),
        }
        if e.family == "evidence-unknown" {
            assert!(e.values.is_empty(), "{}", e.target);
        }
    }
    assert!(
        (60..=140).contains(&answered),
        "{answered} of 200 examples ask a passage that answers"
    );
    for (family, _) in EVIDENCE_FAMILIES {
        assert!(seen.contains(family), "{family} generated");
    }
}

#[test]
fn dialogue_examples_answer_from_the_reply_of_the_one_asked_about_in_a_few_words() {
    let tok = tokenizer();
    let config = DataConfig {
        evidence_share: 1.0,
        dialogue_share: 1.0,
        ..DataConfig::default()
    };
    for split in [Split::Train, Split::Validation] {
        let fillers = Fillers::new(split, None).unwrap();
        let (mut answered, mut questions) = (0, std::collections::BTreeSet::new());
        for i in 0..200 {
            let e = example(&tok, &fillers, &config, split, i).unwrap();
            let again = example(&tok, &fillers, &config, split, i).unwrap();
            assert_eq!((&e.message, &e.target), (&again.message, &again.target));
            assert_eq!(e.family, "evidence-dialogue");
            assert_eq!(e.template.id, "memagent-passage-answer");
            let question = e
                .message
                .lines()
                .next()
                .unwrap()
                .trim_start_matches("Question: ");
            questions.insert(
                question
                    .split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" "),
            );
            let found = passage(&e.message);
            // Every line is a turn of a named speaker, but for a cut turn's end first; the
            // first turn alone shows the sitting's time.
            let turns: Vec<&str> = found.lines().filter(|l| l.contains("user (")).collect();
            assert!(found.lines().count() - turns.len() <= 1, "{found}");
            if let Some((first, rest)) = turns.split_first() {
                assert!(
                    first.starts_with('[') && first.contains("] user ("),
                    "{found}"
                );
                for line in rest {
                    assert!(line.starts_with("user ("), "{line}");
                }
            }
            // The one asked about is named in the question and speaks in the passage.
            let turns_of = |who: &str| {
                found
                    .lines()
                    .filter(move |l| l.contains(&format!("user ({who}):")))
                    .collect::<Vec<_>>()
            };
            let asked = found
                .lines()
                .filter_map(|l| l.split_once("user (")?.1.split_once("):"))
                .map(|(name, _)| name)
                .find(|name| question.contains(name));
            match e.values.as_slice() {
                [] => {
                    assert_eq!(e.target, "not known", "{}", e.message);
                }
                [v] => {
                    answered += 1;
                    let asked = asked.expect("the one asked about speaks");
                    assert!(
                        turns_of(asked)
                            .iter()
                            .any(|l| l.to_lowercase().contains(&v.to_lowercase())),
                        "{v} said by {asked} in {found}"
                    );
                    assert!(e.target.to_lowercase().contains(&v.to_lowercase()));
                    assert!(e.target.split_whitespace().count() <= 6, "{}", e.target);
                    for s in &e.stale {
                        assert!(!e.target.contains(s.as_str()), "stale {s} in {}", e.target);
                    }
                }
                many => panic!("{} values from one passage", many.len()),
            }
        }
        assert!(
            (110..=180).contains(&answered),
            "{answered} of 200 {split:?} examples answer"
        );
        assert!(
            questions.len() >= 8,
            "{} kinds of question",
            questions.len()
        );
    }
}

#[test]
fn the_share_of_chat_exchanges_answered_not_known_is_the_one_asked_for() {
    let tok = tokenizer();
    let fillers = Fillers::new(Split::Train, None).unwrap();
    let unknown = |share: f64| {
        let config = DataConfig {
            evidence_share: 1.0,
            dialogue_share: 1.0,
            dialogue_unknown_share: share,
            ..DataConfig::default()
        };
        let n = 400;
        let not_known = (0..n)
            .filter(|&i| {
                let e = example(&tok, &fillers, &config, Split::Train, i).unwrap();
                e.target == "not known"
            })
            .count();
        not_known as f64 / n as f64
    };
    let (none, tenth, default) = (unknown(0.0), unknown(0.1), unknown(0.2));
    assert_eq!(none, 0.0);
    assert!((0.05..0.15).contains(&tenth), "{tenth}");
    assert!((0.15..0.25).contains(&default), "{default}");
}

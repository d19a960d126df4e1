//! Bad requests on the real default model: each gets a clear result or error, never a
//! panic.

use memagent_agent::{MemoryAgent, Profile, Progress};

use crate::support;

fn agent(profile: Profile) -> MemoryAgent<'static> {
    let model = support::model();
    MemoryAgent::new(model, model.tokenizer(), profile)
}

const SMALL: Profile = Profile {
    chunk_tokens: 256,
    memory_tokens: 64,
    answer_tokens: 32,
};

#[test]
fn a_budget_over_the_context_suggests_the_largest_chunk_that_fits() {
    let profile = Profile {
        chunk_tokens: 8000,
        memory_tokens: 256,
        answer_tokens: 256,
    };
    let err = agent(profile)
        .run("some text", "What is it?", &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("8192"), "{err}");
    // The suggestion must itself pass the check.
    let largest: usize = err
        .split("--chunk-tokens ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a suggested chunk size in: {err}"));
    let fits = Profile {
        chunk_tokens: largest,
        ..profile
    };
    agent(fits).budget("What is it?").unwrap();
    let over = Profile {
        chunk_tokens: largest + 1,
        ..profile
    };
    assert!(agent(over).budget("What is it?").is_err());
}

#[test]
fn a_memory_cap_too_large_for_any_chunk_says_so() {
    let profile = Profile {
        chunk_tokens: 100,
        memory_tokens: 4100,
        answer_tokens: 64,
    };
    let err = agent(profile).budget("Q?").unwrap_err().to_string();
    assert!(err.contains("--memory-tokens"), "{err}");
}

#[test]
fn a_final_step_over_the_context_names_the_answer_cap() {
    let profile = Profile {
        chunk_tokens: 100,
        memory_tokens: 1000,
        answer_tokens: 7200,
    };
    let err = agent(profile).budget("Q?").unwrap_err().to_string();
    assert!(
        err.contains("final step") && err.contains("--answer-tokens"),
        "{err}"
    );
}

#[test]
fn an_empty_document_is_an_error() {
    let err = agent(SMALL)
        .run("", "What is it?", &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("document is empty"), "{err}");
    let err = agent(SMALL)
        .direct(" \n", "What is it?")
        .unwrap_err()
        .to_string();
    assert!(err.contains("document is empty"), "{err}");
}

#[test]
fn an_empty_question_is_an_error() {
    for question in ["", "   "] {
        let err = agent(SMALL)
            .run("Some text.", question, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("question is empty"), "{err}");
    }
    let err = agent(SMALL)
        .direct("Some text.", "")
        .unwrap_err()
        .to_string();
    assert!(err.contains("question is empty"), "{err}");
}

#[test]
fn a_document_shorter_than_one_chunk_takes_one_step() {
    let mut chunks_seen = None;
    let run = agent(SMALL)
        .run(
            "The meeting moved to Thursday at the harbour office.",
            "Where is the meeting?",
            &mut |p| {
                if let Progress::Started { chunks, .. } = p {
                    chunks_seen = Some(chunks);
                }
            },
        )
        .unwrap();
    assert_eq!(chunks_seen, Some(1));
    assert_eq!(run.steps.len(), 1);
    assert_eq!(run.steps[0].index, 1);
    assert!(run.steps[0].chunk_tokens < 256);
    assert!(run.steps[0].memory_tokens <= 64);
    assert!(!run.final_answer.reply.is_empty());
}

#[test]
fn a_document_too_long_for_direct_says_by_how_much() {
    let doc = "The tide comes in and goes out again. ".repeat(1200);
    let err = agent(SMALL)
        .direct(&doc, "What does the tide do?")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("over by") && err.contains("drop --direct"),
        "{err}"
    );
}

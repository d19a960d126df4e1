//! Batched decoding: sequences of different lengths decoded together get exactly the
//! tokens each gets alone, whether they draft, sample or stop at different times.

use memagent_agent::{GENERAL_UPDATE, NO_MEMORY, UPDATE};
use memagent_engine::{GenerateOptions, Message, SamplingParams};

use crate::support::model;

const FILLER: &str = include_str!("../../../engine/tests/data/filler.txt");

/// Update prompts of quite different lengths (a short chat, a paragraph, a long section
/// with a long memory) and one that ends quickly.
fn prompts() -> Vec<Vec<u32>> {
    let model = model();
    let paragraphs: Vec<&str> = FILLER.split("\n\n").collect();
    let memory =
        "- The harbour office opens on 14 May at 9 am.\n- Ingrid's birthday is on 3 March.";
    let texts = [
        "Say hello to Ada in five words.".to_string(),
        UPDATE.fill(
            "What is the special magic number?",
            NO_MEMORY,
            &format!(
                "{}\nThe special magic number for the river is 4417.",
                paragraphs[0]
            ),
        ),
        GENERAL_UPDATE.fill("", memory, &paragraphs[1..4].join("\n\n")),
        "Reply with the single word: yes".to_string(),
    ];
    texts
        .iter()
        .map(|t| model.chat_prompt_ids(&[Message::user(t)]).unwrap())
        .collect()
}

fn check(options: GenerateOptions, what: &str) {
    let model = model();
    let prompts = prompts();
    let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
    assert!(lengths[2] > 3 * lengths[0], "{lengths:?}");
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let together = model.generate_batch(&refs, &options).unwrap();
    assert_eq!(together.len(), prompts.len());
    let mut counts = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let alone = model.generate(prompt, &options).unwrap();
        assert_eq!(
            together[i].token_ids,
            alone.token_ids,
            "{what}: sequence {i} ({} prompt tokens) differs in a batch",
            prompt.len()
        );
        assert_eq!(together[i].stop_reason, alone.stop_reason, "{what}: {i}");
        assert_eq!(together[i].text, alone.text, "{what}: {i}");
        counts.push(alone.completion_tokens);
    }
    // The sequences stop at different times, so the batch shrinks as it goes.
    counts.sort_unstable();
    counts.dedup();
    assert!(
        counts.len() >= 2,
        "{what}: every sequence generated as much: {counts:?}"
    );
}

#[test]
fn a_batch_decodes_each_sequence_as_it_decodes_alone() {
    let greedy = GenerateOptions {
        max_new_tokens: 48,
        stop_on_repeat: Some(16),
        stop_on_repeated_line: true,
        ..GenerateOptions::default()
    };
    check(
        GenerateOptions {
            draft_tokens: 0,
            ..greedy
        },
        "greedy",
    );
    check(greedy, "greedy with drafts");
    let sampled = GenerateOptions {
        sampling: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 7,
        },
        ..greedy
    };
    check(sampled, "sampled");
}

#[test]
fn a_batch_wider_than_one_pass_is_split_and_still_exact() {
    // Nineteen sequences: more rows than one decoding pass takes.
    let model = model();
    let prompts = prompts();
    let many: Vec<&[u32]> = prompts.iter().cycle().take(19).map(Vec::as_slice).collect();
    let options = GenerateOptions {
        max_new_tokens: 12,
        ..GenerateOptions::default()
    };
    let together = model.generate_batch(&many, &options).unwrap();
    for (i, prompt) in prompts.iter().enumerate() {
        let alone = model.generate(prompt, &options).unwrap();
        for (k, generation) in together.iter().enumerate().skip(i).step_by(prompts.len()) {
            assert_eq!(
                generation.token_ids, alone.token_ids,
                "copy {k} of prompt {i}"
            );
        }
    }
}

//! Speculative decoding by prompt lookup gives exactly the tokens of plain greedy
//! decoding on the real default model, with drafts from the prompt, with drafts that
//! are all wrong and with drafts that are all right.

use memagent_agent::{GENERAL_UPDATE, NO_MEMORY, UPDATE};
use memagent_engine::{GenerateOptions, Generation, Message};

use crate::support::model;

const FILLER: &str = include_str!("../../../engine/tests/data/filler.txt");

fn plain(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        draft_tokens: 0,
        stop_on_repeat: Some(12),
        stop_on_repeated_line: true,
        ..GenerateOptions::default()
    }
}

fn speculative(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        draft_tokens: 8,
        ..plain(max_new_tokens)
    }
}

fn prompt_ids(user: &str) -> Vec<u32> {
    model().chat_prompt_ids(&[Message::user(user)]).unwrap()
}

fn same_output(a: &Generation, b: &Generation, what: &str) {
    assert_eq!(a.token_ids, b.token_ids, "{what}: tokens differ");
    assert_eq!(a.text, b.text, "{what}");
    assert_eq!(a.stop_reason, b.stop_reason, "{what}");
}

/// Memory-update prompts like the loop's: empty, short and long memories, two templates.
fn update_prompts() -> Vec<(String, Vec<u32>)> {
    let paragraphs: Vec<&str> = FILLER.split("\n\n").collect();
    let long_memory = [
        "- The harbour office opens on 14 May at 9 am.",
        "- Ada Lovelace promised to send the survey by Friday.",
        "- The gardener waters in the evening; tomatoes want heat.",
        "- The bridge washed out in 1987; floods are measured against it.",
        "- Library hours: 9 am to 6 pm, closed on Sundays.",
        "- Ingrid's birthday is on 3 March.",
    ]
    .join("\n");
    let mut prompts = Vec::new();
    for (i, chunk) in paragraphs.iter().take(3).enumerate() {
        let chunk = format!("{chunk}\nThe special magic number for the river is 4417.");
        for (name, memory) in [("empty", NO_MEMORY), ("long", long_memory.as_str())] {
            let template = if i % 2 == 0 { UPDATE } else { GENERAL_UPDATE };
            let text = template.fill("What is the special magic number?", memory, &chunk);
            prompts.push((format!("paragraph {i}, {name} memory"), prompt_ids(&text)));
        }
    }
    prompts
}

#[test]
fn speculative_decoding_matches_plain_greedy_decoding() {
    let mut drafted = 0;
    for (what, ids) in update_prompts() {
        let a = model().generate(&ids, &plain(120)).unwrap();
        let b = model().generate(&ids, &speculative(120)).unwrap();
        same_output(&a, &b, &what);
        assert_eq!(a.decoding.drafted, 0, "{what}: plain decoding drafted");
        assert_eq!(a.decoding.passes + 1, a.completion_tokens.max(1), "{what}");
        assert!(b.decoding.accepted <= b.decoding.drafted, "{what}");
        drafted += b.decoding.drafted;
    }
    assert!(
        drafted > 0,
        "prompt lookup never drafted on copy-heavy prompts"
    );
}

#[test]
fn wrong_and_right_drafts_give_the_same_tokens() {
    let (what, ids) = update_prompts().swap_remove(1);
    let want = model().generate(&ids, &plain(60)).unwrap();
    assert!(
        want.completion_tokens > 10,
        "{what}: too short a reply to test"
    );
    let vocab = model().config().vocab_size as u32;

    // Every drafted token is one the model does not choose next.
    let wrong = model()
        .generate_with_drafts(&ids, &speculative(60), |generated, max| {
            let from = generated.len();
            (0..max)
                .map(|i| {
                    let right = want.token_ids.get(from + i).copied().unwrap_or(0);
                    (right + 1) % vocab
                })
                .collect()
        })
        .unwrap();
    same_output(&want, &wrong, "all-wrong drafts");
    assert!(wrong.decoding.drafted > 0);
    assert_eq!(wrong.decoding.accepted, 0);

    // Every drafted token is the one plain decoding chose.
    let right = model()
        .generate_with_drafts(&ids, &speculative(60), |generated, max| {
            let from = generated.len().min(want.token_ids.len());
            want.token_ids[from..(from + max).min(want.token_ids.len())].to_vec()
        })
        .unwrap();
    same_output(&want, &right, "all-right drafts");
    assert!(right.decoding.drafted > 0);
    assert_eq!(right.decoding.accepted, right.decoding.drafted);
    assert!(
        right.decoding.passes * 3 < want.decoding.passes,
        "right drafts took {} passes, plain decoding {}",
        right.decoding.passes,
        want.decoding.passes
    );
}

#[test]
fn sampling_decodes_plainly() {
    let ids = prompt_ids("Write a short poem about rain.");
    let mut options = speculative(16);
    options.sampling.temperature = 1.0;
    let g = model().generate(&ids, &options).unwrap();
    assert_eq!(g.decoding.drafted, 0);
    assert_eq!(g.decoding.passes + 1, g.completion_tokens);
}

#[test]
fn ignoring_end_of_turn_runs_to_the_cap_the_same_with_drafts() {
    let model = model();
    let (_, prompt) = &update_prompts()[0];
    let ended = model.generate(prompt, &plain(96)).unwrap();
    assert_eq!(
        ended.stop_reason,
        memagent_engine::StopReason::EndOfTurn,
        "this prompt's reply ends on its own: {:?}",
        ended.text
    );
    let fixed = |options: GenerateOptions| GenerateOptions {
        ignore_eos: true,
        stop_on_repeat: None,
        stop_on_repeated_line: false,
        ..options
    };
    let plain = model.generate(prompt, &fixed(plain(96))).unwrap();
    let drafted = model.generate(prompt, &fixed(speculative(96))).unwrap();
    same_output(&plain, &drafted, "ignore_eos");
    assert_eq!(plain.completion_tokens, 96);
    assert_eq!(plain.stop_reason, memagent_engine::StopReason::MaxTokens);
    let stops = model.tokenizer().stop_ids();
    assert!(plain.token_ids.iter().all(|id| !stops.contains(id)));
    // Up to where the reply ended, the tokens are the same.
    let before_end = ended.token_ids.len() - 1;
    assert_eq!(plain.token_ids[..before_end], ended.token_ids[..before_end]);
}

//! The prefix cache on the real default model: prompts of the memory loop share the
//! template's head; reusing its keys and values gives the logits of a full prefill.

use memagent_agent::{NO_MEMORY, UPDATE};
use memagent_engine::prefix::{MAX_ENTRIES, MAX_ENTRY_TOKENS, MIN_SHARED_TOKENS};
use memagent_engine::{GenerateOptions, LoadOptions, LocalModel, Message};

use crate::support::model_path;

const FILLER: &str = include_str!("../../../engine/tests/data/filler.txt");

/// A model of its own: the cache's contents are part of what is tested.
fn fresh_model() -> LocalModel {
    LocalModel::load(&model_path(), &LoadOptions::default()).unwrap()
}

fn update_prompt(model: &LocalModel, question: &str, memory: &str, chunk: &str) -> Vec<u32> {
    let text = UPDATE.fill(question, memory, chunk);
    model.chat_prompt_ids(&[Message::user(&text)]).unwrap()
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_reused_prefix_gives_the_logits_of_a_full_prefill() {
    let model = fresh_model();
    let paragraphs: Vec<&str> = FILLER.split("\n\n").collect();
    let question = "Where did the bridge wash out?";
    let first = update_prompt(&model, question, NO_MEMORY, paragraphs[0]);
    let second = update_prompt(
        &model,
        question,
        "- Seeds go into cold soil.",
        paragraphs[1],
    );
    let head = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(
        head >= MIN_SHARED_TOKENS,
        "prompts share only {head} tokens"
    );

    let (want, reused) = model.prompt_logits(&second, false).unwrap();
    assert_eq!(reused, 0);
    assert_eq!(
        model.prefix_cache_stats().entries,
        0,
        "reuse off stored an entry"
    );

    // A miss computes everything and stores the prompt's prefix.
    let (_, reused) = model.prompt_logits(&first, true).unwrap();
    assert_eq!(reused, 0);
    let stats = model.prefix_cache_stats();
    assert_eq!(
        (stats.entries, stats.tokens),
        (1, first.len().min(MAX_ENTRY_TOKENS))
    );

    // A hit reuses the shared head, and the entry is cut back to it.
    let (got, reused) = model.prompt_logits(&second, true).unwrap();
    assert_eq!(reused, head);
    assert_eq!(model.prefix_cache_stats().tokens, head);
    let diff = max_difference(&want, &got);
    eprintln!("largest logit difference after reusing {head} tokens: {diff:e}");
    assert!(
        diff <= 1e-4,
        "logits differ by {diff} after reusing {head} tokens"
    );

    // Generation with and without the cache gives the same memory.
    let options = GenerateOptions {
        max_new_tokens: 48,
        ..GenerateOptions::default()
    };
    let cached = model.generate(&second, &options).unwrap();
    assert_eq!(cached.decoding.cached_prompt, head);
    let plain = model
        .generate(
            &second,
            &GenerateOptions {
                reuse_prefix: false,
                ..options
            },
        )
        .unwrap();
    assert_eq!(plain.decoding.cached_prompt, 0);
    assert_eq!(cached.token_ids, plain.token_ids);
}

#[test]
fn the_cache_stays_within_its_bound() {
    let model = fresh_model();
    // Prompts that share nothing long: each is a new entry, the oldest dropped.
    let words: Vec<&str> = FILLER.split_whitespace().collect();
    for i in 0..MAX_ENTRIES + 3 {
        let text: Vec<&str> = words.iter().skip(i * 7).take(60).copied().collect();
        let ids = model.tokenizer().encode(&text.join(" "), false).unwrap();
        model.prompt_logits(&ids, true).unwrap();
        let stats = model.prefix_cache_stats();
        assert!(stats.entries <= MAX_ENTRIES, "{} entries", stats.entries);
        assert!(stats.tokens <= MAX_ENTRIES * MAX_ENTRY_TOKENS);
    }
    assert_eq!(model.prefix_cache_stats().entries, MAX_ENTRIES);
    model.clear_prefix_cache();
    assert_eq!(model.prefix_cache_stats().entries, 0);
}

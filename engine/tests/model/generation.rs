//! Generation behaviour on the real default model.

use memagent_engine::{Error, GenerateOptions, Message, SamplingParams, StopReason};

use crate::support::model;

fn options(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        ..Default::default()
    }
}

#[test]
fn greedy_generation_is_identical_across_runs() {
    let messages = [Message::user("Name three colours.")];
    let a = model().generate_chat(&messages, &options(24)).unwrap();
    let b = model().generate_chat(&messages, &options(24)).unwrap();
    assert!(!a.token_ids.is_empty());
    assert_eq!(a.token_ids, b.token_ids);
    assert_eq!(a.text, b.text);
}

#[test]
fn seeded_sampling_repeats_and_differs_from_other_seeds() {
    let messages = [Message::user("Write a short poem about rain.")];
    let sampled = |seed| {
        let opts = GenerateOptions {
            max_new_tokens: 16,
            sampling: SamplingParams {
                temperature: 1.2,
                top_p: 0.95,
                seed,
            },
            ..GenerateOptions::default()
        };
        model().generate_chat(&messages, &opts).unwrap().token_ids
    };
    assert_eq!(sampled(1), sampled(1));
    assert!(
        (2..6).any(|seed| sampled(seed) != sampled(1)),
        "five seeds gave one continuation"
    );
}

#[test]
fn max_new_tokens_is_honoured() {
    let g = model()
        .generate_chat(
            &[Message::user("Write one sentence about the sea.")],
            &options(3),
        )
        .unwrap();
    assert_eq!(g.completion_tokens, 3);
    assert_eq!(g.token_ids.len(), 3);
    assert_eq!(g.stop_reason, StopReason::MaxTokens);
}

#[test]
fn generation_stops_at_end_of_turn_and_keeps_it_out_of_the_text() {
    let g = model()
        .generate_chat(
            &[Message::user(
                "What is the capital of France? Answer in one word.",
            )],
            &options(48),
        )
        .unwrap();
    assert_eq!(g.stop_reason, StopReason::EndOfTurn);
    assert_eq!(g.token_ids.last(), Some(&2), "<|im_end|> is id 2");
    assert!(g.completion_tokens < 48);
    assert!(!g.text.contains("<|im_end|>"), "{:?}", g.text);
    assert!(g.text.contains("Paris"), "{:?}", g.text);
}

#[test]
fn a_prompt_over_the_context_is_an_error_that_says_by_how_much() {
    let prompt = vec![504u32; 8_100];
    let err = model().generate(&prompt, &options(100)).unwrap_err();
    match &err {
        Error::ContextOverflow { over, context, .. } => {
            assert_eq!(*context, 8192);
            assert_eq!(*over, 8_100 + 100 - 8192);
        }
        other => panic!("expected a context error, got {other:?}"),
    }
    assert!(err.to_string().contains("over by 8"), "{err}");
    assert!(matches!(
        model().generate(&[], &options(4)),
        Err(Error::InvalidRequest(_))
    ));
}

/// Several sequences in one forward pass give each sequence's own logits, in prefill and
/// in the decode steps after it.
#[test]
fn a_batch_of_sequences_matches_each_sequence_alone() {
    let t = model().transformer();
    let tok = model().tokenizer();
    // Over 16 tokens each, so that single and batched prefill take the same (dense) path.
    let a = tok.encode("The quick brown fox jumps over the lazy dog, then runs back across the field to its den", false).unwrap();
    let b = tok.encode("Rust is a language for reliable systems code, with ownership rules checked by its compiler", false).unwrap();
    let c = tok.encode("Memory is rewritten after every chunk of text, so the prompt stays the same size forever", false).unwrap();
    let len = a.len().min(b.len()).min(c.len());
    let rows = vec![a[..len].to_vec(), b[..len].to_vec(), c[..len].to_vec()];
    let mut batch_cache = t.new_cache(3, len + 2);
    let batch = t.forward(&rows, &mut batch_cache).unwrap();
    let batch2 = t
        .forward(&[vec![30], vec![28], vec![30]], &mut batch_cache)
        .unwrap();
    for (i, row) in rows.iter().enumerate() {
        let mut cache = t.new_cache(1, len + 2);
        let single = t.forward(std::slice::from_ref(row), &mut cache).unwrap();
        let next = if i == 1 { 28 } else { 30 };
        let single2 = t.forward(&[vec![next]], &mut cache).unwrap();
        for (x, y) in [(&batch, &single), (&batch2, &single2)] {
            let x: Vec<f32> = x.get(i).unwrap().to_vec1().unwrap();
            let y: Vec<f32> = y.squeeze(0).unwrap().to_vec1().unwrap();
            let diff = x
                .iter()
                .zip(&y)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-3, "sequence {i}: max logit difference {diff}");
        }
    }
}

//! The loop on the real default model: a needle in the third of five chunks is carried
//! in memory and answered.

use memagent_agent::{chunk_text, MemoryAgent, Profile, Progress};
use memagent_tasks::{single_needle, Haystack};

use crate::support;

const CHUNK: usize = 256;

/// For each fixed seed (the seed draws the city, the 7-digit number, where the filler
/// starts and where in chunk 3 the needle goes): a ~1,240-token document of prose filler
/// (`tests/data/filler.txt`, cut in 5 chunks of 256 tokens) whose third chunk holds
/// "The special magic number for <city> is <7 digits>.", read with the default profile's
/// memory cap (M = 256) under greedy decoding. Checks that (1) the needle lies inside
/// chunk 3, (2) the memory written after reading chunk 3 holds the number, and (3) the
/// final extracted answer holds the number.
///
/// The 135M default model is weak at this: over seeds 1–16 it keeps the number after
/// chunk 3 in 7 and answers it in 4 (5, 7, 10, 13; the others mostly invent a number in
/// chunk 1 and keep it). With prefill on f32 weights instead of 8-bit products it kept 9
/// and answered 5 (seed 6 too). This test pins three of the cases it can do, so that a
/// change in prompts, chunking, memory passing or numerics that loses them is caught.
#[test]
fn needle_in_the_third_chunk_is_remembered_and_answered() {
    let model = support::model();
    let haystack = Haystack::from_text(
        include_str!("../../../engine/tests/data/filler.txt"),
        "filler.txt",
    )
    .unwrap();
    let profile = Profile {
        chunk_tokens: CHUNK,
        memory_tokens: 256,
        answer_tokens: 64,
    };
    let agent = MemoryAgent::new(model, model.tokenizer(), profile);
    for seed in [5u64, 7, 10] {
        // The needle starts inside the third chunk's tokens [512, 768), clear of its edges.
        let place = 2 * CHUNK + CHUNK / 8 + (seed as usize * 37) % (CHUNK / 2);
        let sample = single_needle(
            &haystack,
            model.tokenizer(),
            5 * CHUNK - 40,
            place as f64 / (5 * CHUNK - 60) as f64,
            seed,
        )
        .unwrap();
        let chunks = chunk_text(model.tokenizer(), &sample.document, CHUNK).unwrap();
        assert_eq!(chunks.len(), 5, "seed {seed}: 5 chunks");
        assert!(
            chunks[2].text.contains(&sample.needle),
            "seed {seed}: the needle lies in chunk 3 (needle at token {})",
            sample.needle_token
        );
        let mut memories = Vec::new();
        let run = agent
            .run(&sample.document, &sample.question, &mut |p| {
                if let Progress::Step { step, .. } = p {
                    memories.push(step.memory.clone());
                }
            })
            .unwrap();
        assert_eq!(memories.len(), 5, "seed {seed}: one memory per chunk");
        assert!(
            memories[2].contains(&sample.value),
            "seed {seed}: memory after chunk 3 holds {}: {:?}",
            sample.value,
            memories[2]
        );
        assert!(
            run.final_answer.answer.contains(&sample.value),
            "seed {seed}: final answer holds {}: {:?} (memories: {memories:#?})",
            sample.value,
            run.final_answer.reply
        );
    }
}

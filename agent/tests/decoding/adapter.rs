//! An adapter kept beside the weights, on the real default model and the shipped
//! memory-writer adapter: the calls that ask for it run the adapted model, the others
//! exactly the base model, from one load, in whatever order and however batched.

use std::path::PathBuf;

use memagent_agent::{GENERAL_LINES, NO_MEMORY};
use memagent_engine::AdapterChoice;
use memagent_engine::{GenerateOptions, LoadOptions, LocalModel, Message, Weights};

use crate::support::{model, model_path};

fn shipped_adapter() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors")
}

fn shipped_reader() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../adapters/SmolLM2-135M-Instruct.Q4_1/reader.safetensors")
}

fn prompt(model: &LocalModel, chunk: &str) -> Vec<u32> {
    let text = GENERAL_LINES.fill("", NO_MEMORY, chunk);
    model.chat_prompt_ids(&[Message::user(&text)]).unwrap()
}

#[test]
fn calls_without_the_adapter_are_exactly_the_base_model() {
    let adapted = LocalModel::load(
        &model_path(),
        &LoadOptions {
            adapter: AdapterChoice::File(shipped_adapter()),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let base = model();
    let chunks = [
        "[2026-03-21 06:04] user: Lol, classic.\n[2026-03-21 06:33] user: My sister Lucia \
         lives in Porto.\n[2026-03-21 06:55] user: Rain again, typical.",
        "[2026-03-22 09:10] user: I work as a nurse in Hobart.\n[2026-03-22 09:12] \
         assistant: Noted.",
    ];
    let with = GenerateOptions {
        max_new_tokens: 40,
        ..GenerateOptions::default()
    };
    let without = GenerateOptions {
        weights: Weights::Base,
        ..with
    };
    for chunk in chunks {
        let ids = prompt(base, chunk);
        // The adapted call first: its prompt is then in the prefix cache, which an
        // unadapted call of the same prompt must not take.
        let adapted_reply = adapted.generate(&ids, &with).unwrap();
        let plain = adapted.generate(&ids, &without).unwrap();
        let base_reply = base.generate(&ids, &with).unwrap();
        assert_eq!(
            plain.token_ids, base_reply.token_ids,
            "without the adapter: {:?}, the base model: {:?}",
            plain.text, base_reply.text
        );
        assert_ne!(
            adapted_reply.token_ids, base_reply.token_ids,
            "the adapter changed nothing: {:?}",
            adapted_reply.text
        );
        // And again with the adapter: the same reply, whatever ran between.
        assert_eq!(
            adapted.generate(&ids, &with).unwrap().token_ids,
            adapted_reply.token_ids
        );
    }
    // Batched, each sequence gets its reply alone, with and without the adapter.
    let ids: Vec<Vec<u32>> = chunks.iter().map(|c| prompt(base, c)).collect();
    let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    for options in [with, without] {
        let batch = adapted.generate_batch(&refs, &options).unwrap();
        for (one, prompt) in batch.iter().zip(&ids) {
            assert_eq!(
                one.token_ids,
                adapted.generate(prompt, &options).unwrap().token_ids
            );
        }
    }
}

#[test]
fn the_reader_beside_the_adapter_answers_as_it_does_alone_and_leaves_the_rest_alone() {
    let both = LocalModel::load(
        &model_path(),
        &LoadOptions {
            adapter: AdapterChoice::File(shipped_adapter()),
            reader: AdapterChoice::File(shipped_reader()),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let alone = |file: PathBuf| {
        LocalModel::load(
            &model_path(),
            &LoadOptions {
                adapter: AdapterChoice::File(file),
                ..LoadOptions::default()
            },
        )
        .unwrap()
    };
    let (writer, reader, base) = (alone(shipped_adapter()), alone(shipped_reader()), model());
    let passage = "[2023-05-08 13:56] user (Ana): How was your weekend?\n\
                   [2023-05-08 13:57] user (Ravi): Amazing! We drove up to Porto.";
    let question = "Where did Ravi go on the weekend?";
    let text = memagent_agent::PASSAGE_ANSWER.fill(question, "", passage);
    let ids = [
        base.chat_prompt_ids(&[Message::user(&text)]).unwrap(),
        prompt(
            base,
            "[2026-03-22 09:10] user: I work as a nurse in Hobart.",
        ),
    ];
    let options = |weights| GenerateOptions {
        max_new_tokens: 24,
        weights,
        ..GenerateOptions::default()
    };
    for ids in &ids {
        let reply = |m: &LocalModel, w| m.generate(ids, &options(w)).unwrap().token_ids;
        let read = reply(&both, Weights::Reader);
        // Each slot is the adapter loaded alone, whichever ran before it.
        assert_eq!(read, reply(&reader, Weights::Adapter));
        assert_eq!(
            reply(&both, Weights::Adapter),
            reply(&writer, Weights::Adapter)
        );
        assert_eq!(reply(&both, Weights::Base), reply(base, Weights::Adapter));
        assert_eq!(reply(&both, Weights::Reader), read);
    }
    // The reader answers the passage in its few words; the two adapters differ.
    let read = both.generate(&ids[0], &options(Weights::Reader)).unwrap();
    assert!(read.text.contains("Porto"), "{:?}", read.text);
    assert_ne!(
        read.token_ids,
        both.generate(&ids[0], &options(Weights::Adapter))
            .unwrap()
            .token_ids
    );
    // A model loaded without a reader runs the base model when asked for one.
    assert_eq!(
        writer
            .generate(&ids[0], &options(Weights::Reader))
            .unwrap()
            .token_ids,
        base.generate(&ids[0], &options(Weights::Adapter))
            .unwrap()
            .token_ids
    );
}

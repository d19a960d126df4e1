//! Prompts prefilled together: each gets the logits, keys and values it gets alone.

use memagent_engine::{Message, Transformer};

use crate::support::model;

/// The logits after running `ids` after `cache`, as a vector.
fn row(logits: candle_core::Tensor) -> Vec<f32> {
    logits.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn prompts_prefilled_together_get_the_bits_each_gets_alone() {
    let model = model();
    let t = model.transformer();
    let texts = [
        "Where did Ana fly in March?",
        "Ana: I flew to Porto yesterday to see my aunt. Ben: How was the weather there? \
         Ana: Sunny, and we walked along the river all afternoon.",
        "Reply with the single word: yes",
        "Ben: My sister's bakery opened on Friday, and the first loaves sold out by noon. \
         Ana: That is wonderful news! Ben: She plans a second shop next spring, near the \
         station, if the lease works out.",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|text| model.chat_prompt_ids(&[Message::user(*text)]).unwrap())
        .collect();
    // The last prompt continues after 20 tokens already in its cache, as a prompt
    // resumed from a cached prefix does.
    let head = 20;
    let capacity = 512;
    let start = |i: usize| {
        let mut cache = t.new_cache(1, capacity);
        if i == prompts.len() - 1 {
            t.forward(&[prompts[i][..head].to_vec()], &mut cache)
                .unwrap();
        }
        cache
    };
    let rest = |i: usize| -> &[u32] {
        match i == prompts.len() - 1 {
            true => &prompts[i][head..],
            false => &prompts[i],
        }
    };
    let alone: Vec<(Vec<f32>, memagent_engine::KvCache)> = (0..prompts.len())
        .map(|i| {
            let mut cache = start(i);
            let logits = t.forward(&[rest(i).to_vec()], &mut cache).unwrap();
            (row(logits), cache)
        })
        .collect();
    let mut caches: Vec<_> = (0..prompts.len()).map(start).collect();
    for (i, cache) in caches.iter().enumerate() {
        assert!(
            Transformer::stackable(cache.len(), rest(i).len()),
            "prompt {i}: {} tokens after {}",
            rest(i).len(),
            cache.len()
        );
    }
    let mut inputs: Vec<(&[u32], &mut memagent_engine::KvCache)> = caches
        .iter_mut()
        .enumerate()
        .map(|(i, cache)| (rest(i), cache))
        .collect();
    if !t.stacks_prefill() {
        // f32 tiles (no integer kernel on this CPU) round a row by the rows beside it.
        assert!(t.prefill_many(&mut inputs).is_err());
        return;
    }
    let together = t.prefill_many(&mut inputs).unwrap();
    assert_eq!(together.len(), prompts.len());
    for (i, (logits, (expected, alone_cache))) in together.into_iter().zip(&alone).enumerate() {
        assert_eq!(&row(logits), expected, "prompt {i}: logits differ together");
        assert_eq!(caches[i].len(), alone_cache.len(), "prompt {i}");
    }
    // The keys and values too: the next token runs the same after either cache.
    for (i, (cache, (_, alone_cache))) in caches.iter_mut().zip(alone).enumerate() {
        let mut alone_cache = alone_cache;
        let next = vec![prompts[0][1]];
        let a = row(t.forward(std::slice::from_ref(&next), cache).unwrap());
        let b = row(t.forward(&[next], &mut alone_cache).unwrap());
        assert_eq!(a, b, "prompt {i}: the next token's logits differ");
    }
}

#[test]
fn an_input_prefill_would_not_run_as_one_product_is_refused() {
    let model = model();
    let t = model.transformer();
    let prompt = model
        .chat_prompt_ids(&[Message::user("Where did Ana fly in March?")])
        .unwrap();
    let mut cache = t.new_cache(1, 512);
    // Fewer rows than prefill's products take: one-token decoding's kernels run them.
    let short = &prompt[..8];
    assert!(!Transformer::stackable(0, short.len()));
    let err = t.prefill_many(&mut [(short, &mut cache)]).unwrap_err();
    assert!(err.to_string().contains("prefill_many takes"), "{err}");
    assert_eq!(cache.len(), 0, "a refused input left its cache as it was");
    // Crossing a chunk's end: alone, the rows would be cut in two passes.
    assert!(!Transformer::stackable(500, 20));
}

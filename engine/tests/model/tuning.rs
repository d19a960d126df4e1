//! Decoding's prefetch distance on the real default model: measured once, kept and read
//! back, one of the distances measured, and without effect on a single bit the model
//! computes.

use memagent_engine::prefetch::{self, CANDIDATES, DEFAULT_AHEAD};
use memagent_engine::tuning::{tune_decode, Prefetch, Source, MIN_ROUNDS};

use super::support::{model, model_path};

/// The logits' bits of a prompt and of four tokens decoded greedily after it.
fn decoded_bits(ahead: usize) -> Vec<Vec<u32>> {
    prefetch::set_ahead(ahead);
    let model = model();
    let t = model.transformer();
    let prompt = model
        .tokenizer()
        .encode("The grass is green and the sky is", false)
        .unwrap();
    let mut cache = t.new_cache(1, prompt.len() + 8);
    let mut logits = t.forward(&[prompt], &mut cache).unwrap();
    let mut out = Vec::new();
    for _ in 0..5 {
        let row: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
        let next = memagent_engine::argmax(&row);
        out.push(row.iter().map(|v| v.to_bits()).collect());
        logits = t.forward(&[vec![next]], &mut cache).unwrap();
    }
    out
}

#[test]
fn every_prefetch_distance_decodes_the_same_bits() {
    let want = decoded_bits(DEFAULT_AHEAD);
    for ahead in CANDIDATES {
        assert!(
            decoded_bits(ahead) == want,
            "{ahead} bytes ahead changed the logits"
        );
    }
    prefetch::set_ahead(model().decode_tuning().prefetch_ahead);
}

#[test]
fn the_distance_is_measured_once_then_read_from_the_cache() {
    let dir = std::env::temp_dir().join(format!("memagent-tuning-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("decode-tuning.json");
    let t = model().transformer();
    let how = Prefetch::Measure {
        cache: Some(cache.clone()),
    };
    let first = tune_decode(t, &model_path(), &how).unwrap();
    if cfg!(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )) {
        assert_eq!(first.source, Source::Measured, "{first}");
        assert!(CANDIDATES.contains(&first.prefetch_ahead), "{first}");
        assert_eq!(first.candidates.len(), CANDIDATES.len(), "{first}");
        for c in &first.candidates {
            assert!(c.samples >= MIN_ROUNDS && c.block_ms > 0.0, "{first}");
        }
        assert_eq!(prefetch::ahead(), first.prefetch_ahead);
        assert!(cache.is_file());
        let second = tune_decode(t, &model_path(), &how).unwrap();
        assert_eq!(second.source, Source::Cached, "{second}");
        assert_eq!(second.prefetch_ahead, first.prefetch_ahead);
        assert_eq!(second.candidates, first.candidates);
        assert!(second.to_string().contains("measured before"), "{second}");
    } else {
        // Without the AVX2 products nothing prefetches, and nothing is measured.
        assert!(matches!(first.source, Source::Default(_)), "{first}");
        assert!(!cache.exists());
    }
    // A distance set by the caller is used as it is.
    let set = Prefetch::Set {
        bytes: 1024,
        by: "a test".into(),
    };
    let tuning = tune_decode(t, &model_path(), &set).unwrap();
    assert_eq!(tuning.source, Source::Set("a test".into()));
    assert_eq!((tuning.prefetch_ahead, prefetch::ahead()), (1024, 1024));
    assert_eq!(
        tuning.to_string(),
        "prefetch 1024 bytes ahead (set by a test)"
    );
    prefetch::set_ahead(model().decode_tuning().prefetch_ahead);
    let _ = std::fs::remove_dir_all(&dir);
}

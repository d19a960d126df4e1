//! Tiny GGUF files written by the test, one per supported architecture: the whole load
//! path (metadata, tokenizer, chat template, weights) and a generation, in well under a
//! second; and hostile files that must give errors, not panics.

use std::path::{Path, PathBuf};

use memagent_engine::{Error, GenerateOptions, LoadOptions, LocalModel, Message, ModelInfo};

struct Tiny {
    dir: PathBuf,
}

impl Tiny {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("memagent-tiny-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    /// Writes a random-weight model of `arch` and returns its path.
    fn write(&self, arch: &str) -> PathBuf {
        memagent_engine::testing::write_tiny_model(&self.dir, arch)
    }
}

impl Drop for Tiny {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn load(path: &Path) -> memagent_engine::Result<LocalModel> {
    LocalModel::load(path, &LoadOptions::default())
}

#[test]
fn tiny_models_of_every_architecture_load_and_generate() {
    for arch in ["llama", "qwen2", "qwen3", "phi3"] {
        let tiny = Tiny::new(arch);
        let path = tiny.write(arch);
        let info = ModelInfo::read(&path).unwrap();
        assert_eq!(info.architecture, arch);
        assert_eq!(
            (info.layers, info.heads, info.kv_heads, info.context_length),
            (2, 4, 2, 256)
        );
        let model = load(&path).unwrap();
        // A model this small stays in the caches: decoding's prefetch is not measured.
        let tuning = model.decode_tuning();
        assert!(
            matches!(&tuning.source, memagent_engine::tuning::Source::Default(why) if why.contains("fit in the caches")),
            "{tuning}"
        );
        assert_eq!(
            model.tokenizer().encode("Hello", false).unwrap(),
            vec![260, 111]
        );
        assert_eq!(
            model.chat_prompt(&[Message::user("Hi")]).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let opts = GenerateOptions {
            max_new_tokens: 20,
            ..Default::default()
        };
        // Longer than the dense-path threshold, so prefill and decode paths both run.
        let prompt = vec![72u32; 40];
        let a = model.generate(&prompt, &opts).unwrap();
        let b = model.generate(&prompt, &opts).unwrap();
        assert!(a.completion_tokens >= 1 && a.completion_tokens <= 20);
        assert_eq!(a.token_ids, b.token_ids, "{arch}: greedy is deterministic");
        assert!(a
            .token_ids
            .iter()
            .all(|&t| (t as usize) < model.config().vocab_size));
    }
}

#[test]
fn hostile_files_give_errors_that_name_the_file() {
    let tiny = Tiny::new("hostile");
    let good = tiny.write("llama");
    let bytes = std::fs::read(&good).unwrap();

    let truncated = tiny.dir.join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let err = load(&truncated).err().expect("a truncated file fails");
    assert!(err.to_string().contains("truncated.gguf"), "{err}");

    let header_only = tiny.dir.join("header.gguf");
    std::fs::write(&header_only, &bytes[..64]).unwrap();
    let err = load(&header_only).err().expect("a cut header fails");
    assert!(err.to_string().contains("header.gguf"), "{err}");

    let not_gguf = tiny.dir.join("text.gguf");
    std::fs::write(&not_gguf, b"this is not a model").unwrap();
    assert!(matches!(load(&not_gguf), Err(Error::Gguf { .. })));

    let missing = tiny.dir.join("missing.gguf");
    assert!(matches!(load(&missing), Err(Error::Io { .. })));

    // An architecture the engine does not run.
    let mut patched = bytes.clone();
    let at = patched.windows(5).position(|w| w == b"llama").unwrap();
    patched[at..at + 5].copy_from_slice(b"gpt-j");
    let other = tiny.dir.join("other.gguf");
    std::fs::write(&other, &patched).unwrap();
    match load(&other) {
        Err(Error::UnsupportedArchitecture(a)) => assert_eq!(a, "gpt-j"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("gpt-j loaded"),
    }
    // Described all the same, naming what is not supported.
    let info = ModelInfo::read(&other).unwrap();
    assert_eq!(info.architecture, "gpt-j");
    // Its keys still carry the llama prefix: dimensions unknown, the vocabulary counted.
    assert_eq!((info.layers, info.vocab_size), (0, 261), "{info:?}");
    assert_eq!(info.unsupported.len(), 1, "{info:?}");
    assert!(info.unsupported[0].contains("`gpt-j`"), "{info:?}");
    let runs = ModelInfo::read(&good).unwrap();
    assert!(runs.unsupported.is_empty(), "{runs:?}");
}

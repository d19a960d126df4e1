//! Tiny GGUF files written by the test, one per supported architecture: the whole load
//! path (metadata, tokenizer, chat template, weights) and a generation, in well under a
//! second; and hostile files that must give errors, not panics.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use memagent_engine::{Error, GenerateOptions, LoadOptions, LocalModel, Message, ModelInfo};

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// GPT-2's byte-to-character table, which byte-level BPE vocabularies are written in.
fn byte_chars() -> Vec<String> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<(u32, u32)> = printable.iter().map(|&b| (b, b)).collect();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars.push((b, 256 + extra));
            extra += 1;
        }
    }
    printable.clear();
    chars.sort();
    chars
        .into_iter()
        .map(|(_, c)| char::from_u32(c).unwrap().to_string())
        .collect()
}

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
        let dev = Device::Cpu;
        let (n_embd, n_ff, n_head, n_kv, n_layer) = (64usize, 128usize, 4u32, 2u32, 2u32);
        let mut tokens = byte_chars();
        tokens.extend(["<|im_start|>", "<|im_end|>", "He", "ll", "Hell"].map(String::from));
        let vocab = tokens.len();
        let mut types = vec![1i32; vocab];
        types[256] = 3;
        types[257] = 3;
        let merges = ["H e", "l l", "He ll"];
        let p = |k: &str| format!("{arch}.{k}");
        let meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            ("general.name".into(), Value::String(format!("tiny-{arch}"))),
            (p("block_count"), Value::U32(n_layer)),
            (p("context_length"), Value::U32(256)),
            (p("embedding_length"), Value::U32(n_embd as u32)),
            (p("feed_forward_length"), Value::U32(n_ff as u32)),
            (p("attention.head_count"), Value::U32(n_head)),
            (p("attention.head_count_kv"), Value::U32(n_kv)),
            (p("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
            (p("rope.freq_base"), Value::F32(10_000.0)),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            (
                "tokenizer.ggml.pre".into(),
                Value::String(if arch == "qwen2" { "qwen2" } else { "smollm" }.into()),
            ),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(tokens.iter().map(|t| Value::String(t.clone())).collect()),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
            ),
            (
                "tokenizer.ggml.merges".into(),
                Value::Array(
                    merges
                        .iter()
                        .map(|m| Value::String(m.to_string()))
                        .collect(),
                ),
            ),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(256)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(257)),
            (
                "tokenizer.chat_template".into(),
                Value::String(TEMPLATE.into()),
            ),
        ];
        let rand = |shape: &[usize], dtype: GgmlDType| {
            let t = Tensor::randn(0f32, 0.2, shape, &dev).unwrap();
            QTensor::quantize(&t, dtype).unwrap()
        };
        let ones = |n: usize| {
            QTensor::quantize(
                &Tensor::ones(n, candle_core::DType::F32, &dev).unwrap(),
                GgmlDType::F32,
            )
            .unwrap()
        };
        let kv_dim = n_embd / n_head as usize * n_kv as usize;
        let mut tensors: Vec<(String, QTensor)> = vec![
            (
                "token_embd.weight".into(),
                rand(&[vocab, n_embd], GgmlDType::Q8_0),
            ),
            ("output_norm.weight".into(), ones(n_embd)),
        ];
        for i in 0..n_layer {
            let b = |n: &str| format!("blk.{i}.{n}");
            tensors.push((b("attn_norm.weight"), ones(n_embd)));
            tensors.push((b("ffn_norm.weight"), ones(n_embd)));
            tensors.push((b("attn_q.weight"), rand(&[n_embd, n_embd], GgmlDType::Q4_1)));
            tensors.push((b("attn_k.weight"), rand(&[kv_dim, n_embd], GgmlDType::Q4_1)));
            tensors.push((b("attn_v.weight"), rand(&[kv_dim, n_embd], GgmlDType::Q4_1)));
            tensors.push((
                b("attn_output.weight"),
                rand(&[n_embd, n_embd], GgmlDType::Q4_1),
            ));
            tensors.push((b("ffn_gate.weight"), rand(&[n_ff, n_embd], GgmlDType::Q4_1)));
            tensors.push((b("ffn_up.weight"), rand(&[n_ff, n_embd], GgmlDType::Q4_1)));
            tensors.push((b("ffn_down.weight"), rand(&[n_embd, n_ff], GgmlDType::Q4_1)));
            if arch == "qwen2" {
                tensors.push((b("attn_q.bias"), rand(&[n_embd], GgmlDType::F32)));
                tensors.push((b("attn_k.bias"), rand(&[kv_dim], GgmlDType::F32)));
                tensors.push((b("attn_v.bias"), rand(&[kv_dim], GgmlDType::F32)));
            }
        }
        let path = self.dir.join(format!("tiny-{arch}.gguf"));
        let mut file = std::fs::File::create(&path).unwrap();
        let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
        path
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
    for arch in ["llama", "qwen2"] {
        let tiny = Tiny::new(arch);
        let path = tiny.write(arch);
        let info = ModelInfo::read(&path).unwrap();
        assert_eq!(info.architecture, arch);
        assert_eq!(
            (info.layers, info.heads, info.kv_heads, info.context_length),
            (2, 4, 2, 256)
        );
        let model = load(&path).unwrap();
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
}

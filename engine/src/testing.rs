//! Tiny random-weight GGUF models for tests (the whole load path in well under a
//! second): used by the engine's and the trainer's tests.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// GPT-2's byte-to-character table, which byte-level BPE vocabularies are written in.
pub fn byte_chars() -> Vec<String> {
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

/// The metadata of a tiny model of `arch` with these tokens, token types and sizes
/// (width, feed-forward width, heads, key/value heads, layers).
fn tiny_metadata(
    arch: &str,
    tokens: &[String],
    types: &[i32],
    (n_embd, n_ff, n_head, n_kv, n_layer): (usize, usize, u32, u32, u32),
) -> Vec<(String, Value)> {
    let gemma = arch == "gemma3";
    let merges = ["H e", "l l", "He ll"];
    let p = |k: &str| format!("{arch}.{k}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        // A name without the architecture in it: llama.cpp adjusts tokens by name.
        (
            "general.name".into(),
            Value::String("tiny random model".into()),
        ),
        (p("block_count"), Value::U32(n_layer)),
        (p("context_length"), Value::U32(256)),
        (p("embedding_length"), Value::U32(n_embd as u32)),
        (p("feed_forward_length"), Value::U32(n_ff as u32)),
        (p("attention.head_count"), Value::U32(n_head)),
        (p("attention.head_count_kv"), Value::U32(n_kv)),
        (p("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (
            p("rope.freq_base"),
            Value::F32(if gemma { 1_000_000.0 } else { 10_000.0 }),
        ),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.pre".into(),
            Value::String(
                if arch.starts_with("qwen") {
                    "qwen2"
                } else {
                    "smollm"
                }
                .into(),
            ),
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
    if gemma {
        // A window of 8 positions on the first layer (a pattern of 2: every second layer
        // global), so that the prompts' 30 tokens and their continuations pass it.
        meta.push((p("attention.sliding_window"), Value::U32(8)));
        meta.push((p("attention.sliding_window_pattern"), Value::U32(2)));
        meta.push((p("rope.freq_base_swa"), Value::F32(10_000.0)));
    }
    meta
}

/// Writes a random-weight model of `arch` (`llama`, `qwen2`, `qwen3`, `phi3`, or any other name
/// for a file of that architecture with llama's tensors) and returns its path. The
/// weights come from a fixed seed: the same file every time, so that a reference's
/// outputs for it can be committed.
pub fn write_tiny_model(dir: &Path, arch: &str) -> PathBuf {
    let dev = Device::Cpu;
    let (n_embd, n_ff, n_head, n_kv, n_layer) = (64usize, 128usize, 4u32, 2u32, 2u32);
    let gemma = arch == "gemma3";
    let mut tokens = byte_chars();
    tokens.extend(["<|im_start|>", "<|im_end|>", "He", "ll", "Hell"].map(String::from));
    let vocab = tokens.len();
    let mut types = vec![1i32; vocab];
    types[256] = 3;
    types[257] = 3;
    let meta = tiny_metadata(arch, &tokens, &types, (n_embd, n_ff, n_head, n_kv, n_layer));
    let rng = std::cell::RefCell::new(<rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7));
    let rand = |shape: &[usize], dtype: GgmlDType| {
        use rand::Rng;
        let n: usize = shape.iter().product();
        // Uniform with the spread of N(0, 0.2): sqrt(3) * 0.2.
        let values: Vec<f32> = (0..n)
            .map(|_| rng.borrow_mut().random_range(-0.3464f32..0.3464))
            .collect();
        let t = Tensor::from_vec(values, shape, &dev).unwrap();
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
        if arch == "phi3" {
            // q, k and v fused; gate and up fused, gate first.
            let qkv = n_embd + 2 * kv_dim;
            tensors.push((b("attn_qkv.weight"), rand(&[qkv, n_embd], GgmlDType::Q4_1)));
        } else {
            tensors.push((b("attn_q.weight"), rand(&[n_embd, n_embd], GgmlDType::Q4_1)));
            tensors.push((b("attn_k.weight"), rand(&[kv_dim, n_embd], GgmlDType::Q4_1)));
            tensors.push((b("attn_v.weight"), rand(&[kv_dim, n_embd], GgmlDType::Q4_1)));
        }
        tensors.push((
            b("attn_output.weight"),
            rand(&[n_embd, n_embd], GgmlDType::Q4_1),
        ));
        if arch == "phi3" {
            tensors.push((
                b("ffn_up.weight"),
                rand(&[2 * n_ff, n_embd], GgmlDType::Q4_1),
            ));
        } else {
            tensors.push((b("ffn_gate.weight"), rand(&[n_ff, n_embd], GgmlDType::Q4_1)));
            tensors.push((b("ffn_up.weight"), rand(&[n_ff, n_embd], GgmlDType::Q4_1)));
        }
        tensors.push((b("ffn_down.weight"), rand(&[n_embd, n_ff], GgmlDType::Q4_1)));
        if arch == "qwen2" {
            tensors.push((b("attn_q.bias"), rand(&[n_embd], GgmlDType::F32)));
            tensors.push((b("attn_k.bias"), rand(&[kv_dim], GgmlDType::F32)));
            tensors.push((b("attn_v.bias"), rand(&[kv_dim], GgmlDType::F32)));
        }
        // Norm weights around 1, so that they matter and stay sane.
        let norm = |rand: &dyn Fn(&[usize], GgmlDType) -> QTensor, n: usize| {
            let t = rand(&[n], GgmlDType::F32).dequantize(&dev).unwrap();
            QTensor::quantize(&(t + 1.0).unwrap(), GgmlDType::F32).unwrap()
        };
        if arch == "qwen3" || gemma {
            // Per-head norms of the queries and keys.
            let head_dim = n_embd / n_head as usize;
            tensors.push((b("attn_q_norm.weight"), norm(&rand, head_dim)));
            tensors.push((b("attn_k_norm.weight"), norm(&rand, head_dim)));
        }
        if gemma {
            tensors.push((b("post_attention_norm.weight"), norm(&rand, n_embd)));
            tensors.push((b("post_ffw_norm.weight"), norm(&rand, n_embd)));
        }
    }
    if arch == "phi3" {
        // Phi-3 files keep an output projection of their own.
        tensors.push((
            "output.weight".into(),
            rand(&[vocab, n_embd], GgmlDType::Q8_0),
        ));
    }
    let path = dir.join(format!("tiny-{arch}.gguf"));
    let mut file = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
    path
}

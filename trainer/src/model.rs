//! The base model for training: a GGUF file's weights frozen (dequantized to f32, and in
//! their own blocks for the integer products prefill runs), LoRA adapters on the chosen
//! projections, and a forward pass that returns logits only where a loss is taken (the
//! vocabulary projection is a fifth of the model's work).

use std::path::Path;

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use memagent_engine::{rope_tables, Architecture, Config, GgufFile};

use crate::error::{Error, Result};
use crate::lora::{Adapters, LoraConfig, Target};
use crate::ops::{rms_norm, rms_norm_composed, rope, swiglu, Frozen, Integer};

/// A block's frozen weights, one product each: stacking q, k, v (or gate and up) into one
/// product costs more in the backward pass, where each slice's gradient is padded to the
/// stack's width and summed, than it saves forward.
struct Block {
    attn_norm: Tensor,
    wq: Frozen,
    wk: Frozen,
    wv: Frozen,
    /// q, k, v biases (qwen2).
    bias: Option<[Tensor; 3]>,
    wo: Frozen,
    ffn_norm: Tensor,
    w_gate: Frozen,
    w_up: Frozen,
    w_down: Frozen,
}

impl Block {
    fn frozen_mut(&mut self) -> [&mut Frozen; 7] {
        [
            &mut self.wq,
            &mut self.wk,
            &mut self.wv,
            &mut self.wo,
            &mut self.w_gate,
            &mut self.w_up,
            &mut self.w_down,
        ]
    }
}

/// A model being trained.
pub struct TrainModel {
    pub config: Config,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Frozen,
    cos: Tensor,
    sin: Tensor,
    pub adapters: Adapters,
    /// Every operation composed from candle's own (matmul, element-wise ops, attention
    /// materialising its scores) instead of the fused kernels on the engine's GEMM: the
    /// reference the fused pass is compared with.
    pub reference: bool,
}

impl TrainModel {
    /// Loads `path` (llama or qwen2 GGUF) and makes fresh adapters from `seed`; the frozen
    /// products run in 8-bit integers where this CPU runs them at speed (AVX-512 VNNI),
    /// as prefill's do.
    pub fn load(path: &Path, lora: LoraConfig, seed: u64) -> Result<Self> {
        Self::load_with(path, lora, seed, memagent_engine::integer_products_fast())
    }

    /// [`TrainModel::load`], with the frozen products in integers where `integer` (and the
    /// weight's type has them), in f32 otherwise.
    pub fn load_with(path: &Path, lora: LoraConfig, seed: u64, integer: bool) -> Result<Self> {
        let dev = Device::Cpu;
        let mut gguf = GgufFile::open(path)?;
        let config = Config::from_gguf(&gguf)?;
        if !matches!(
            config.architecture,
            Architecture::Llama | Architecture::Qwen2
        ) {
            return Err(Error::Config(format!(
                "training a `{}` model is not supported yet; train a llama or qwen2 model",
                config.architecture.name()
            )));
        }
        let tied = !gguf.has_tensor("output.weight");
        let mut quantized = |name: &str| -> Result<QTensor> { Ok(gguf.tensor(name, &dev)?) };
        // A weight dequantized, with its integer products.
        let frozen = |q: &QTensor| -> Result<Frozen> {
            let w = q.dequantize(&dev)?;
            let products = if integer { Integer::new(q, &w)? } else { None };
            Ok(Frozen::with_integer(w, products))
        };
        let token_embd = quantized("token_embd.weight")?;
        let (embed, lm_head) = if tied {
            let head = frozen(&token_embd)?;
            (head.weight().clone(), head)
        } else {
            let head = frozen(&quantized("output.weight")?)?;
            (token_embd.dequantize(&dev)?, head)
        };
        let norm = quantized("output_norm.weight")?.dequantize(&dev)?;
        let mut blocks = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let mut w = |n: &str| quantized(&format!("blk.{i}.{n}"));
            let bias = if config.qkv_bias {
                Some([
                    w("attn_q.bias")?.dequantize(&dev)?,
                    w("attn_k.bias")?.dequantize(&dev)?,
                    w("attn_v.bias")?.dequantize(&dev)?,
                ])
            } else {
                None
            };
            blocks.push(Block {
                attn_norm: w("attn_norm.weight")?.dequantize(&dev)?,
                wq: frozen(&w("attn_q.weight")?)?,
                wk: frozen(&w("attn_k.weight")?)?,
                wv: frozen(&w("attn_v.weight")?)?,
                bias,
                wo: frozen(&w("attn_output.weight")?)?,
                ffn_norm: w("ffn_norm.weight")?.dequantize(&dev)?,
                w_gate: frozen(&w("ffn_gate.weight")?)?,
                w_up: frozen(&w("ffn_up.weight")?)?,
                w_down: frozen(&w("ffn_down.weight")?)?,
            });
        }
        let (cos, sin) = rope_tables(&config, &dev)?;
        let (d, ff) = (config.n_embd, config.n_ff);
        let (nq, nkv) = (
            config.n_head * config.head_dim,
            config.n_kv_head * config.head_dim,
        );
        let adapters = Adapters::new(
            lora,
            config.n_layer,
            |t| match t {
                Target::Q => (d, nq),
                Target::K | Target::V => (d, nkv),
                Target::O => (nq, d),
                Target::Gate | Target::Up => (d, ff),
                Target::Down => (ff, d),
            },
            seed,
        )?;
        Ok(Self {
            config,
            embed,
            blocks,
            norm,
            lm_head,
            cos,
            sin,
            adapters,
            reference: false,
        })
    }

    /// Logits (positions.len(), vocab) predicting the token after each of `positions`
    /// of the sequence `ids`.
    pub fn forward(&self, ids: &[u32], positions: &[usize]) -> Result<Tensor> {
        let cfg = &self.config;
        let t = ids.len();
        let dev = Device::Cpu;
        let ids_t = Tensor::from_slice(ids, t, &dev)?;
        let mut x = self.embed.index_select(&ids_t, 0)?; // (t, d)
        let cos = self.cos.narrow(0, 0, t)?;
        let sin = self.sin.narrow(0, 0, t)?;
        let hd = cfg.head_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        let reference = self.reference;
        let norm = |x: &Tensor, w: &Tensor| {
            if reference {
                rms_norm_composed(x, w, cfg.rms_eps)
            } else {
                rms_norm(x, w, cfg.rms_eps)
            }
        };
        let linear = |w: &Frozen, x: &Tensor| {
            if reference {
                w.forward_composed(x)
            } else {
                w.forward(x)
            }
        };
        for (i, block) in self.blocks.iter().enumerate() {
            // A frozen product with its adapter, if the block has one for `target`.
            let adapted = |w: &Frozen, target: Target, h: &Tensor| -> Result<Tensor> {
                match self.adapters.get(i, target) {
                    Some(l) if !reference => {
                        Ok(w.forward_adapted(h, l.a.as_tensor(), l.b.as_tensor(), l.scale)?)
                    }
                    Some(l) => Ok((linear(w, h)? + l.forward(h)?)?),
                    None => Ok(linear(w, h)?),
                }
            };
            let h = norm(&x, &block.attn_norm)?;
            let projection = |w: &Frozen, target: Target, slot: usize| -> Result<Tensor> {
                let y = adapted(w, target, &h)?;
                Ok(match &block.bias {
                    Some(b) => y.broadcast_add(&b[slot])?,
                    None => y,
                })
            };
            let q = projection(&block.wq, Target::Q, 0)?;
            let k = projection(&block.wk, Target::K, 1)?;
            let v = projection(&block.wv, Target::V, 2)?;
            let heads = |x: Tensor, n: usize| -> Result<Tensor> {
                Ok(x.reshape((1, t, n, hd))?.transpose(1, 2)?.contiguous()?)
            };
            let q = rope(&heads(q, cfg.n_head)?, &cos, &sin, cfg.rope_interleaved)?.squeeze(0)?;
            let k =
                rope(&heads(k, cfg.n_kv_head)?, &cos, &sin, cfg.rope_interleaved)?.squeeze(0)?;
            let v = heads(v, cfg.n_kv_head)?.squeeze(0)?;
            let y = if reference {
                crate::attention::reference_attention(&q, &k, &v, scale)?
            } else {
                crate::attention::causal_attention(&q, &k, &v, scale)?
            };
            x = (&x + adapted(&block.wo, Target::O, &y)?)?;
            let h = norm(&x, &block.ffn_norm)?;
            let gate = adapted(&block.w_gate, Target::Gate, &h)?;
            let up = adapted(&block.w_up, Target::Up, &h)?;
            let ff = if reference {
                (gate.silu()? * up)?
            } else {
                swiglu(&gate, &up)?
            };
            x = (&x + adapted(&block.w_down, Target::Down, &ff)?)?;
        }
        let at = Tensor::from_vec(
            positions.iter().map(|&p| p as u32).collect::<Vec<_>>(),
            positions.len(),
            &dev,
        )?;
        let h = norm(&x.index_select(&at, 0)?, &self.norm)?;
        Ok(linear(&self.lm_head, &h)?)
    }

    /// Whether every frozen product runs in 8-bit integers.
    pub fn integer_products(&self) -> bool {
        self.frozen().all(|f| f.is_integer())
    }

    /// Runs every frozen product in f32 from here on (the reference integer products are
    /// compared with).
    pub fn f32_products(&mut self) {
        self.lm_head.f32_only();
        for b in &mut self.blocks {
            for f in b.frozen_mut() {
                f.f32_only();
            }
        }
    }

    fn frozen(&self) -> impl Iterator<Item = &Frozen> {
        std::iter::once(&self.lm_head).chain(
            self.blocks
                .iter()
                .flat_map(|b| [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down]),
        )
    }

    /// Floating-point operations a training pass over a `tokens`-token sequence must do,
    /// with the loss on `targets` of them: every projection and attention product
    /// forward, the input gradients of each from the top down to the lowest adapted
    /// block, the vocabulary projection forward and back on the target rows, and the
    /// adapters' own products. Recomputation and work on masked scores do not count.
    pub fn useful_flops(&self, tokens: usize, targets: usize) -> f64 {
        let c = &self.config;
        let (t, d, ff) = (tokens as f64, c.n_embd as f64, c.n_ff as f64);
        let (nq, nkv) = (
            (c.n_head * c.head_dim) as f64,
            (c.n_kv_head * c.head_dim) as f64,
        );
        let projections = 2.0 * t * (d * (nq + 2.0 * nkv) + nq * d + 3.0 * d * ff);
        // q kᵀ and p v over the causal half: t (t + 1) / 2 pairs per head.
        let attention = 2.0 * 2.0 * (t * (t + 1.0) / 2.0) * nq;
        let adapted = (c.n_layer - self.adapters.config.first_layer(c.n_layer)) as f64;
        let rank = self.adapters.config.rank as f64;
        let lora: f64 = self
            .adapters
            .config
            .targets
            .iter()
            .map(|target| {
                let (i, o) = match target {
                    Target::Q => (d, nq),
                    Target::K | Target::V => (d, nkv),
                    Target::O => (nq, d),
                    Target::Gate | Target::Up => (d, ff),
                    Target::Down => (ff, d),
                };
                // Forward (two products), their input gradients and both weights'.
                3.0 * 2.0 * t * rank * (i + o)
            })
            .sum();
        let vocab = 2.0 * 2.0 * targets as f64 * d * c.vocab_size as f64;
        // The backward pass of attention does twice its forward products.
        c.n_layer as f64 * (projections + attention)
            + adapted * (projections + 2.0 * attention + lora)
            + vocab
    }

    /// The merged weight of one projection (for export and checks): W + scale · B A.
    pub fn frozen_weight(&self, layer: usize, target: Target) -> Result<Tensor> {
        let b = &self.blocks[layer];
        Ok(match target {
            Target::Q => &b.wq,
            Target::K => &b.wk,
            Target::V => &b.wv,
            Target::O => &b.wo,
            Target::Gate => &b.w_gate,
            Target::Up => &b.w_up,
            Target::Down => &b.w_down,
        }
        .weight()
        .clone())
    }
}

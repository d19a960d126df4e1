//! The decoder block shared by llama-like architectures (RMSNorm, rotary attention with
//! grouped key/value heads, SwiGLU feed-forward), with a key/value cache that reaches the
//! model's full context and a batch dimension throughout.

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use super::{Activation, Config};
use crate::adapter::Weights;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kernels::attention::causal_attention;
use crate::kernels::linear::{Head, Linear, WeightPlan, DENSE_MIN_ROWS};
use crate::kernels::low_rank::LowRank;

/// Prompt tokens processed per forward pass during prefill: bounds activation memory
/// whatever the prompt length (llama.cpp's default micro-batch is the same size).
pub const PREFILL_CHUNK: usize = 512;

struct Block {
    attn_norm: Tensor,
    /// q, k and v projections stacked: one matmul gives (..., q | k | v).
    wqkv: Linear,
    wo: Linear,
    ffn_norm: Tensor,
    /// gate and up projections stacked: one matmul gives (..., gate | up).
    w_gate_up: Linear,
    w_down: Linear,
    /// Per-head RMSNorm weights of the queries and keys (head_dim each), when the
    /// architecture has them.
    qk_norm: Option<(Tensor, Tensor)>,
    /// RMSNorm weights on the attention output and on the feed-forward output, before
    /// their residual adds, when the architecture has them (Gemma).
    post_norms: Option<(Tensor, Tensor)>,
}

/// A loaded model's weights. Stateless: sequences keep their state in a [`KvCache`].
pub struct Transformer {
    config: Config,
    embed: Arc<QTensor>,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Head,
    rope: Rope,
    /// The sliding-window layers' rotary angles, when they have their own base.
    local_rope: Option<Rope>,
    device: Device,
    /// Which adapters' updates sit beside the weights, by slot (the adapter, the reader).
    adapters: [bool; 2],
}

/// Keys and values of every layer for a batch of sequences of equal length.
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    batch: usize,
    len: usize,
    capacity: usize,
    /// The weights these sequences run with (their keys and values were computed with
    /// them, so every later token must be too).
    weights: Weights,
}

impl KvCache {
    /// Tokens held per sequence.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The weights these sequences run with.
    pub fn weights(&self) -> Weights {
        self.weights
    }

    /// Forgets every position from `len` on (rejected draft tokens); the buffers stay.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A separate copy of the first `len` positions, with room reserved for `capacity`,
    /// in f32 (the forward pass's type) whatever type this one keeps them in.
    pub fn fork(&self, len: usize, capacity: usize) -> Result<KvCache> {
        let len = len.min(self.len);
        let capacity = capacity.max(len);
        // Always a new buffer: the copy is written to while the original is kept.
        self.copied(len, capacity, |held| {
            let (b, h, _, d) = held.dims4()?;
            let buffer = Tensor::zeros((b, h, capacity, d), DType::F32, held.device())?;
            buffer.slice_set(&held.to_dtype(DType::F32)?.contiguous()?, 2, 0)?;
            Ok(buffer)
        })
    }

    /// The first `len` positions, in f16 and no more room than they take: to keep for
    /// later (see [`KvCache::fork`]). Exact: keys and values are rounded to f16 before
    /// they are stored.
    pub fn packed(&self, len: usize) -> Result<KvCache> {
        let len = len.min(self.len);
        self.copied(len, len, |held| {
            Ok(held.to_dtype(DType::F16)?.contiguous()?)
        })
    }

    /// A cache of the first `len` positions, each layer's keys and values (those
    /// positions) made into new tensors by `copy`, with room for `capacity`.
    fn copied(
        &self,
        len: usize,
        capacity: usize,
        copy: impl Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<KvCache> {
        let held = |t: &Tensor| copy(&t.narrow(2, 0, len)?);
        let layers = self
            .layers
            .iter()
            .map(|layer| match layer {
                Some((k, v)) if len > 0 => Ok(Some((held(k)?, held(v)?))),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            batch: self.batch,
            len,
            capacity,
            weights: self.weights,
        })
    }

    /// Bytes the keys and values take, their unused room included.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }

    /// Appends this layer's new keys/values, growing the buffers when needed, and
    /// returns views of all positions so far.
    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        let needed = self.len + t;
        let (kc, vc) = match self.layers[layer].take() {
            Some((kc, vc)) if kc.dim(2)? >= needed => (kc, vc),
            old => {
                let (b, h, _, d) = k.dims4()?;
                let cap = needed.max(self.capacity);
                let kc = Tensor::zeros((b, h, cap, d), k.dtype(), k.device())?;
                let vc = Tensor::zeros((b, h, cap, d), v.dtype(), v.device())?;
                if let Some((ok, ov)) = old {
                    kc.slice_set(&ok.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                    vc.slice_set(&ov.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
                (kc, vc)
            }
        };
        kc.slice_set(&k.contiguous()?, 2, self.len)?;
        vc.slice_set(&v.contiguous()?, 2, self.len)?;
        let out = (kc.narrow(2, 0, needed)?, vc.narrow(2, 0, needed)?);
        self.layers[layer] = Some((kc, vc));
        Ok(out)
    }
}

impl Transformer {
    /// Loads the weights of a llama-like GGUF file onto `device`.
    pub fn load(
        gguf: &mut GgufFile,
        config: Config,
        plan: WeightPlan,
        adapters: [Option<&crate::adapter::Adapter>; 2],
        device: &Device,
    ) -> Result<Self> {
        let embed = Arc::new(gguf.tensor("token_embd.weight", device)?);
        let (rows, cols) = embed.shape().dims2()?;
        if rows != config.vocab_size || cols != config.n_embd {
            return Err(gguf.gguf_error(format!(
                "token_embd.weight has shape ({rows}, {cols}), expected ({}, {})",
                config.vocab_size, config.n_embd
            )));
        }
        let lm_head = if gguf.has_tensor("output.weight") {
            Head::new(Arc::new(gguf.tensor("output.weight", device)?), device)?
        } else {
            Head::new(embed.clone(), device)?
        };
        let norm = gguf
            .tensor("output_norm.weight", device)?
            .dequantize(device)?;
        let loading = Loading {
            plan,
            adapters,
            device,
        };
        let blocks = (0..config.n_layer)
            .map(|i| load_block(gguf, &config, i, &loading))
            .collect::<Result<Vec<_>>>()?;
        let rope = Rope::new(config.rope_theta, config.rope_freq_scale, config.head_dim);
        let local_rope = config
            .sliding_window
            .map(|w| Rope::new(w.rope_theta, 1.0, config.head_dim));
        Ok(Self {
            config,
            embed,
            blocks,
            norm,
            lm_head,
            rope,
            local_rope,
            device: device.clone(),
            adapters: adapters.map(|a| a.is_some()),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty cache for `batch` sequences, with room reserved for `capacity` tokens each.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> KvCache {
        self.new_cache_with(batch, capacity, Weights::Adapter)
    }

    /// An empty cache for sequences that run with `weights` (the base model's alone when
    /// that adapter was not loaded).
    pub fn new_cache_with(&self, batch: usize, capacity: usize, weights: Weights) -> KvCache {
        KvCache {
            layers: (0..self.config.n_layer).map(|_| None).collect(),
            batch,
            len: 0,
            capacity: capacity.min(self.config.context_length),
            weights: self.loaded(weights),
        }
    }

    /// `weights` when they were loaded, else the base model's.
    pub fn loaded(&self, weights: Weights) -> Weights {
        match weights.slot() {
            Some(slot) if !self.adapters[slot] => Weights::Base,
            _ => weights,
        }
    }

    /// Runs `ids` (b, t) after what `cache` holds and returns the logits of the last
    /// position of each sequence, (b, vocab). Long inputs go through in chunks of
    /// [`PREFILL_CHUNK`] tokens.
    pub fn forward(&self, ids: &[Vec<u32>], cache: &mut KvCache) -> Result<Tensor> {
        let (b, t) = self.check_input(ids, cache)?;
        let mut logits = None;
        let mut start = 0;
        while start < t {
            // Chunks end at multiples of PREFILL_CHUNK positions, wherever the input
            // starts, so that a prompt resumed from a cached prefix is cut as a whole one is.
            let to_boundary = PREFILL_CHUNK - (cache.len % PREFILL_CHUNK);
            let len = to_boundary.min(t - start);
            let chunk: Vec<u32> = ids
                .iter()
                .flat_map(|row| row[start..start + len].iter().copied())
                .collect();
            let chunk = Tensor::from_vec(chunk, (b, len), &self.device)?;
            let want = if start + len == t {
                Logits::Last
            } else {
                Logits::None
            };
            logits = Some(self.forward_chunk(&chunk, cache, want)?);
            start += len;
        }
        Ok(logits.flatten().expect("the last chunk returns logits"))
    }

    /// Runs a few tokens `ids` (b, t) after what `cache` holds and returns the logits
    /// after every one of them, (b, t, vocab): the verification pass of speculative
    /// decoding. Up to [`Transformer::MAX_VERIFY`] tokens take the same kernels as
    /// one-token decoding, so each position's logits equal those of decoding its tokens
    /// one at a time.
    pub fn forward_all(&self, ids: &[Vec<u32>], cache: &mut KvCache) -> Result<Tensor> {
        let (b, t) = self.check_input(ids, cache)?;
        if b * t > Self::MAX_VERIFY {
            return Err(Error::InvalidRequest(format!(
                "forward_all takes at most {} tokens in all, got {b} x {t}",
                Self::MAX_VERIFY
            )));
        }
        let chunk = Tensor::from_vec(ids.concat(), (b, t), &self.device)?;
        Ok(self
            .forward_chunk(&chunk, cache, Logits::All)?
            .expect("all logits requested"))
    }

    /// The most tokens [`Transformer::forward_all`] takes at once.
    pub const MAX_VERIFY: usize = DENSE_MIN_ROWS - 1;

    /// The latest position at or before `shared` from which [`Transformer::forward`] of
    /// the rest of a `len`-token prompt computes every remaining position with the same
    /// kernels as a forward of the whole prompt (a short run of rows takes the decode
    /// kernels, a long one the prefill GEMM), so that resuming from a cached prefix gives
    /// the same numbers.
    pub fn resume_point(len: usize, shared: usize) -> usize {
        let shared = shared.min(len);
        let chunk_start = shared / PREFILL_CHUNK * PREFILL_CHUNK;
        let chunk_end = (chunk_start + PREFILL_CHUNK).min(len);
        let whole = chunk_end - chunk_start;
        let rest = chunk_end - shared;
        if shared > chunk_start && whole >= DENSE_MIN_ROWS && rest < DENSE_MIN_ROWS {
            chunk_end - DENSE_MIN_ROWS
        } else {
            shared
        }
    }

    /// Runs a few tokens of several sequences in one pass, each after what its own cache
    /// (of one sequence) holds: the projections see every row at once (each weight row is
    /// read once for the whole batch), attention runs per sequence. Returns the logits
    /// after every token of each sequence, (t_i, vocab). Up to
    /// [`Transformer::MAX_VERIFY`] rows in all take the kernels of one-token decoding, so
    /// each sequence gets exactly the logits it would get alone.
    pub fn forward_many(&self, inputs: &mut [(&[u32], &mut KvCache)]) -> Result<Vec<Tensor>> {
        let total = self.check_many(inputs)?;
        if total > Self::MAX_VERIFY {
            return Err(Error::InvalidRequest(format!(
                "forward_many takes 1 to {} tokens in all, got {total}",
                Self::MAX_VERIFY
            )));
        }
        let x = self.blocks_many(inputs, total)?;
        let cfg = &self.config;
        let x = crate::kernels::rowwise::rms_norm(&x, &self.norm, cfg.rms_eps)?;
        let logits = self
            .lm_head
            .forward(&x)?
            .to_dtype(DType::F32)?
            .reshape((total, cfg.vocab_size))?;
        let mut at = 0;
        inputs
            .iter()
            .map(|(ids, _)| {
                let rows = logits.narrow(0, at, ids.len())?;
                at += ids.len();
                Ok(rows)
            })
            .collect()
    }

    /// Prefills several prompts in one pass, each after what its own cache (of one
    /// sequence) holds, and returns the logits after each one's last token, (1, vocab):
    /// the projections multiply every prompt's rows as one matrix (each weight row is
    /// read once for all of them; short prompts alone make small, slow products),
    /// attention runs per prompt. Only where each row's product does not depend on the
    /// rows beside it ([`Transformer::stacks_prefill`]), and only for inputs that
    /// [`Transformer::forward`] would run alone as one chunk of
    /// [`DENSE_MIN_ROWS`] rows or more ([`Transformer::stackable`]): then each prompt gets
    /// exactly the logits, keys and values it gets alone.
    pub fn prefill_many(&self, inputs: &mut [(&[u32], &mut KvCache)]) -> Result<Vec<Tensor>> {
        let total = self.check_many(inputs)?;
        if let Some((ids, cache)) = inputs
            .iter()
            .find(|(ids, cache)| !Self::stackable(cache.len, ids.len()))
        {
            return Err(Error::InvalidRequest(format!(
                "prefill_many takes inputs of {DENSE_MIN_ROWS} or more tokens within one \
                 {PREFILL_CHUNK}-token chunk, got {} after {}",
                ids.len(),
                cache.len
            )));
        }
        if !self.stacks_prefill() {
            return Err(Error::InvalidRequest(
                "this model's prefill products are not row-exact: prompts prefill one at a time"
                    .to_string(),
            ));
        }
        let x = self.blocks_many(inputs, total)?;
        let mut last = Vec::with_capacity(inputs.len());
        let mut at = 0;
        for (ids, _) in inputs.iter() {
            at += ids.len();
            last.push(x.narrow(1, at - 1, 1)?);
        }
        // The last rows through the output head a few at a time: fewer than
        // DENSE_MIN_ROWS rows take the kernels a prompt's one last row takes alone.
        let cfg = &self.config;
        let mut out = Vec::with_capacity(last.len());
        for rows in last.chunks(Self::MAX_VERIFY) {
            let x = Tensor::cat(rows, 1)?;
            let x = crate::kernels::rowwise::rms_norm(&x, &self.norm, cfg.rms_eps)?;
            let logits = self
                .lm_head
                .forward(&x)?
                .to_dtype(DType::F32)?
                .reshape((rows.len(), cfg.vocab_size))?;
            for i in 0..rows.len() {
                out.push(logits.narrow(0, i, 1)?);
            }
        }
        Ok(out)
    }

    /// Whether [`Transformer::prefill_many`] takes `t` tokens after `len` cached ones:
    /// [`Transformer::forward`] would run them as one chunk of at least
    /// [`DENSE_MIN_ROWS`] rows, through the prefill products.
    pub fn stackable(len: usize, t: usize) -> bool {
        t >= DENSE_MIN_ROWS && len % PREFILL_CHUNK + t <= PREFILL_CHUNK
    }

    /// Whether every projection's prefill product gives a row the same bits whatever
    /// rows share it (the integer kernels, on the CPU), so that prompts can prefill
    /// together ([`Transformer::prefill_many`]).
    pub fn stacks_prefill(&self) -> bool {
        self.device.is_cpu()
            && self.blocks.iter().all(|b| {
                [&b.wqkv, &b.wo, &b.w_gate_up, &b.w_down]
                    .iter()
                    .all(|l| l.prefill_rows_independent())
            })
    }

    /// The rows of several sequences' inputs in all, checked: one or more sequences,
    /// each of one cache, all with the same weights.
    fn check_many(&self, inputs: &[(&[u32], &mut KvCache)]) -> Result<usize> {
        let weights = inputs.first().map(|(_, cache)| cache.weights);
        if inputs
            .iter()
            .any(|(_, cache)| Some(cache.weights) != weights)
        {
            return Err(Error::InvalidRequest(
                "several sequences run together only with the same weights".to_string(),
            ));
        }
        let mut total = 0;
        for (ids, cache) in inputs.iter() {
            let (b, t) = self.check_input(&[ids.to_vec()], cache)?;
            debug_assert_eq!(b, 1);
            total += t;
        }
        if inputs.is_empty() {
            return Err(Error::InvalidRequest("no sequence to run".to_string()));
        }
        Ok(total)
    }

    /// Every block over several sequences' inputs (`total` rows in all) side by side:
    /// the projections on all rows at once, attention per sequence in its own cache.
    /// Returns the hidden states (1, total, n_embd) before the final norm.
    fn blocks_many(&self, inputs: &mut [(&[u32], &mut KvCache)], total: usize) -> Result<Tensor> {
        let cfg = &self.config;
        let adapted = inputs.first().and_then(|(_, cache)| cache.weights.slot());
        let all: Vec<u32> = inputs
            .iter()
            .flat_map(|(ids, _)| ids.iter().copied())
            .collect();
        let ids = Tensor::from_vec(all, (1, total), &self.device)?;
        let tables = inputs
            .iter()
            .map(|(ids, cache)| self.angles(cache.len, ids.len()))
            .collect::<Result<Vec<_>>>()?;
        let mut x = self.embed_tokens(&ids)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let h = crate::kernels::rowwise::rms_norm(&x, &block.attn_norm, cfg.rms_eps)?;
            let qkv = block.wqkv.forward(&h, adapted)?;
            let mut ys = Vec::with_capacity(inputs.len());
            let mut at = 0;
            for ((ids, cache), angles) in inputs.iter_mut().zip(&tables) {
                let t = ids.len();
                let part = qkv.narrow(1, at, t)?;
                let offset = cache.len;
                ys.push(self.attention(i, &part, cache, offset, angles)?);
                at += t;
            }
            let y = Tensor::cat(&ys, 1)?;
            x = self.rest_of_block(block, x, &y, adapted)?;
        }
        for (ids, cache) in inputs.iter_mut() {
            cache.len += ids.len();
        }
        Ok(x)
    }

    /// Self-attention of layer `layer` for the fused q/k/v projections `qkv` (b, t, ·) of
    /// tokens that follow the `offset` positions `cache` holds: rotary positions,
    /// keys and values appended to the cache, (b, t, heads * head_dim) out.
    fn attention(
        &self,
        layer: usize,
        qkv: &Tensor,
        cache: &mut KvCache,
        offset: usize,
        angles: &Angles,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let window = cfg.window(layer);
        let (cos, sin) = match (&angles.local, window) {
            (Some((cos, sin)), Some(_)) => (cos, sin),
            _ => (&angles.cos, &angles.sin),
        };
        let (b, t, _) = qkv.dims3()?;
        let nq = cfg.n_head * cfg.head_dim;
        let nkv = cfg.n_kv_head * cfg.head_dim;
        let heads = |from: usize, n: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(2, from, n * cfg.head_dim)?
                .reshape((b, t, n, cfg.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let mut q = heads(0, cfg.n_head)?;
        let mut k = heads(nq, cfg.n_kv_head)?;
        let v = heads(nq + nkv, cfg.n_kv_head)?;
        if let Some((qn, kn)) = &self.blocks[layer].qk_norm {
            q = crate::kernels::rowwise::rms_norm(&q, qn, cfg.rms_eps)?;
            k = crate::kernels::rowwise::rms_norm(&k, kn, cfg.rms_eps)?;
        }
        let (q, k) = if cfg.rope_interleaved {
            (
                candle_nn::rotary_emb::rope_i(&q, cos, sin)?,
                candle_nn::rotary_emb::rope_i(&k, cos, sin)?,
            )
        } else {
            (
                candle_nn::rotary_emb::rope(&q, cos, sin)?,
                candle_nn::rotary_emb::rope(&k, cos, sin)?,
            )
        };
        // Scores scaled otherwise than by 1/sqrt(head_dim): the queries carry the
        // difference, as llama.cpp scales them.
        let q = match cfg.attention_scale {
            Some(scale) => (q * f64::from(scale * (cfg.head_dim as f32).sqrt()))?,
            None => q,
        };
        // llama.cpp keeps keys and values in f16 and rounds queries to f16 for the
        // products; rounding the same way keeps greedy choices at near-ties aligned.
        let (q, k, v) = (round_f16(&q)?, round_f16(&k)?, round_f16(&v)?);
        let (k, v) = cache.append(layer, &k, &v)?;
        let y = causal_attention(&q, &k, &v, offset, window)?;
        Ok(y.transpose(1, 2)?
            .reshape((b, t, cfg.n_head * cfg.head_dim))?)
    }

    /// Prefill's matrix products alone: every projection of every block (q/k/v, output,
    /// gate/up, down) on `rows` rows of random inputs, timed without making the inputs.
    /// Returns the floating-point operations done and the seconds they took.
    pub fn time_projections(&self, rows: usize) -> Result<(f64, f64)> {
        let cfg = &self.config;
        let attn = cfg.n_head * cfg.head_dim;
        let qkv = attn + 2 * cfg.n_kv_head * cfg.head_dim;
        let input = |cols: usize| Tensor::rand(-1f32, 1f32, (rows, cols), &self.device);
        let (x, a, ff) = (input(cfg.n_embd)?, input(attn)?, input(cfg.n_ff)?);
        let start = std::time::Instant::now();
        for block in &self.blocks {
            block.wqkv.forward(&x, Some(0))?;
            block.wo.forward(&a, Some(0))?;
            block.w_gate_up.forward(&x, Some(0))?;
            block.w_down.forward(&ff, Some(0))?;
        }
        let seconds = start.elapsed().as_secs_f64();
        let macs = cfg.n_embd * (qkv + 2 * cfg.n_ff) + (attn + cfg.n_ff) * cfg.n_embd;
        Ok((2.0 * (rows * macs * cfg.n_layer) as f64, seconds))
    }

    /// One decoded token's matrix products alone, in `blocks` (a range of the model's
    /// blocks): every projection of each on one row of random inputs, made before the
    /// clock starts. Returns the seconds they took.
    pub fn time_decode_products(&self, blocks: std::ops::Range<usize>) -> Result<f64> {
        let cfg = &self.config;
        let attn = cfg.n_head * cfg.head_dim;
        let input = |cols: usize| Tensor::rand(-1f32, 1f32, (1, cols), &self.device);
        let (x, a, ff) = (input(cfg.n_embd)?, input(attn)?, input(cfg.n_ff)?);
        let start = std::time::Instant::now();
        for block in &self.blocks[blocks] {
            block.wqkv.forward(&x, None)?;
            block.wo.forward(&a, None)?;
            block.w_gate_up.forward(&x, None)?;
            block.w_down.forward(&ff, None)?;
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Whether the model runs on the CPU.
    pub fn on_cpu(&self) -> bool {
        self.device.is_cpu()
    }

    /// The number of blocks (layers).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    fn check_input(&self, ids: &[Vec<u32>], cache: &KvCache) -> Result<(usize, usize)> {
        let b = ids.len();
        let t = ids.first().map_or(0, Vec::len);
        if b == 0 || t == 0 || ids.iter().any(|row| row.len() != t) {
            return Err(Error::InvalidRequest(format!(
                "a forward pass needs one or more sequences of the same non-zero length, got {:?}",
                ids.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        if b != cache.batch {
            return Err(Error::InvalidRequest(format!(
                "batch of {b} sequences given to a cache made for {}",
                cache.batch
            )));
        }
        if cache.len + t > self.config.context_length {
            return Err(Error::ContextOverflow {
                prompt: cache.len + t,
                max_new: 0,
                total: cache.len + t,
                context: self.config.context_length,
                over: cache.len + t - self.config.context_length,
            });
        }
        if let Some(bad) = ids
            .iter()
            .flatten()
            .find(|&&id| id as usize >= self.config.vocab_size)
        {
            return Err(Error::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.config.vocab_size
            )));
        }
        Ok((b, t))
    }

    fn forward_chunk(
        &self,
        ids: &Tensor,
        cache: &mut KvCache,
        want: Logits,
    ) -> Result<Option<Tensor>> {
        let (b, t) = ids.dims2()?;
        let cfg = &self.config;
        let offset = cache.len;
        let angles = self.angles(offset, t)?;
        let mut x = self.embed_tokens(ids)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let h = crate::kernels::rowwise::rms_norm(&x, &block.attn_norm, cfg.rms_eps)?;
            let adapted = cache.weights.slot();
            let qkv = block.wqkv.forward(&h, adapted)?;
            let y = self.attention(i, &qkv, cache, offset, &angles)?;
            x = self.rest_of_block(block, x, &y, adapted)?;
        }
        cache.len += t;
        let x = match want {
            Logits::None => return Ok(None),
            Logits::Last => x.narrow(1, t - 1, 1)?.contiguous()?,
            Logits::All => x,
        };
        let rows = x.dim(1)?;
        let x = crate::kernels::rowwise::rms_norm(&x, &self.norm, cfg.rms_eps)?;
        let logits = self.lm_head.forward(&x)?.to_dtype(DType::F32)?;
        Ok(Some(match want {
            Logits::All => logits.reshape((b, rows, cfg.vocab_size))?,
            _ => logits.reshape((b, cfg.vocab_size))?,
        }))
    }
}

impl Transformer {
    /// Embeddings of `ids`, scaled where the architecture scales them.
    fn embed_tokens(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.embed.embedding(ids)?;
        Ok(match self.config.embed_scale {
            Some(scale) => (x * f64::from(scale))?,
            None => x,
        })
    }

    /// Rotary tables of `len` positions from `offset`, for global and windowed layers.
    fn angles(&self, offset: usize, len: usize) -> Result<Angles> {
        let local = match &self.local_rope {
            Some(rope) => Some(rope.tables(offset, len, &self.device)?),
            None => None,
        };
        let (cos, sin) = self.rope.tables(offset, len, &self.device)?;
        Ok(Angles { cos, sin, local })
    }

    /// A block after its attention `y`: the output projection and the feed-forward, each
    /// added to the residual stream `x` (after its own norm where the architecture has
    /// post-norms).
    fn rest_of_block(
        &self,
        block: &Block,
        x: Tensor,
        y: &Tensor,
        adapted: Option<usize>,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let post = |t: Tensor, which: fn(&(Tensor, Tensor)) -> &Tensor| -> Result<Tensor> {
            match &block.post_norms {
                Some(norms) => crate::kernels::rowwise::rms_norm(&t, which(norms), cfg.rms_eps),
                None => Ok(t),
            }
        };
        let a = post(block.wo.forward(y, adapted)?, |n| &n.0)?;
        let x = (x + a)?;
        let h = crate::kernels::rowwise::rms_norm(&x, &block.ffn_norm, cfg.rms_eps)?;
        let gate_up = block.w_gate_up.forward(&h, adapted)?;
        let ff = match cfg.activation {
            Activation::Silu => crate::kernels::rowwise::swiglu(&gate_up)?,
            Activation::GeluTanh => crate::kernels::rowwise::geglu(&gate_up)?,
        };
        let d = post(block.w_down.forward(&ff, adapted)?, |n| &n.1)?;
        Ok((x + d)?)
    }
}

/// Rotary tables of the positions of one forward pass.
struct Angles {
    cos: Tensor,
    sin: Tensor,
    /// The sliding-window layers' own, where their base differs.
    local: Option<(Tensor, Tensor)>,
}

/// Which positions of a forward pass produce logits.
#[derive(Clone, Copy)]
enum Logits {
    None,
    Last,
    All,
}

/// `t` with every value rounded to the nearest f16, in place on CPU. Callers pass
/// tensors made in the current step whose storage nothing else reads afterwards (for a
/// single token, `v` may still share the fused q/k/v output, which is dead by then).
fn round_f16(t: &Tensor) -> Result<Tensor> {
    if t.device().is_cpu() && t.is_contiguous() {
        t.inplace_op1(&RoundF16)?;
        Ok(t.clone())
    } else {
        Ok(t.to_dtype(DType::F16)?.to_dtype(DType::F32)?)
    }
}

struct RoundF16;

impl candle_core::InplaceOp1 for RoundF16 {
    fn name(&self) -> &'static str {
        "round-f16"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        let candle_core::CpuStorage::F32(data) = storage else {
            candle_core::bail!("round-f16 expects f32")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("round-f16 expects a contiguous tensor")
        };
        for v in &mut data[start..end] {
            *v = half::f16::from_f32(*v).to_f32();
        }
        Ok(())
    }
}

/// Cosine and sine tables (positions, head_dim / 2) for every position of the model's
/// context (the trainer's forward pass uses the same values).
pub fn rope_tables(cfg: &Config, device: &Device) -> Result<(Tensor, Tensor)> {
    Rope::new(cfg.rope_theta, cfg.rope_freq_scale, cfg.head_dim).tables(
        0,
        cfg.context_length,
        device,
    )
}

/// Rotary angles for base `theta`, positions multiplied by `freq_scale` (linear rope
/// scaling). Each forward pass makes the tables of its own positions: tables of a whole
/// context would take 64 MiB for Gemma 3's 32K positions and their two bases, and four
/// times that at 128K.
struct Rope {
    inv_freq: Vec<f32>,
    freq_scale: f32,
}

impl Rope {
    fn new(theta: f32, freq_scale: f32, head_dim: usize) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        Self {
            inv_freq,
            freq_scale,
        }
    }

    /// Cosine and sine tables (len, head_dim / 2) of positions `offset..offset + len`.
    fn tables(&self, offset: usize, len: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        let mut angles = Vec::with_capacity(len * self.inv_freq.len());
        for pos in offset..offset + len {
            angles.extend(
                self.inv_freq
                    .iter()
                    .map(|f| pos as f32 * f * self.freq_scale),
            );
        }
        let angles = Tensor::from_vec(angles, (len, self.inv_freq.len()), device)?;
        Ok((angles.cos()?, angles.sin()?))
    }
}

/// How a block's projections are loaded: the weight plan, the adapters kept beside them
/// (by slot), the device.
struct Loading<'a> {
    plan: WeightPlan,
    adapters: [Option<&'a crate::adapter::Adapter>; 2],
    device: &'a Device,
}

/// Block `i` of a llama-like GGUF file: its norms, then its projections (fused as the
/// engine runs them), each with the adapter's update where there is one.
fn load_block(
    gguf: &mut GgufFile,
    config: &Config,
    i: usize,
    loading: &Loading<'_>,
) -> Result<Block> {
    let device = loading.device;
    let mut dense = |name: &str| -> Result<Tensor> {
        Ok(gguf
            .tensor(&format!("blk.{i}.{name}"), device)?
            .dequantize(device)?)
    };
    let attn_norm = dense("attn_norm.weight")?;
    let ffn_norm = dense("ffn_norm.weight")?;
    let post_norms = match config.post_norms {
        true => Some((
            dense("post_attention_norm.weight")?,
            dense("post_ffw_norm.weight")?,
        )),
        false => None,
    };
    let qk_norm = match config.qk_norm {
        true => Some((dense("attn_q_norm.weight")?, dense("attn_k_norm.weight")?)),
        false => None,
    };
    if let Some((qn, kn)) = &qk_norm {
        if qn.dims() != [config.head_dim] || kn.dims() != [config.head_dim] {
            return Err(gguf.gguf_error(format!(
                "blk.{i}.attn_q_norm/attn_k_norm have shapes {:?} and {:?}, expected \
                 ({},) each",
                qn.dims(),
                kn.dims(),
                config.head_dim
            )));
        }
    }
    let biases = match config.qkv_bias {
        true => Some([
            dense("attn_q.bias")?,
            dense("attn_k.bias")?,
            dense("attn_v.bias")?,
        ]),
        false => None,
    };
    let p = Projections::load(gguf, config, i, biases, device)?;
    let layer = |parts, names: &[&str]| adapted_linear(loading, i, parts, names);
    Ok(Block {
        attn_norm,
        ffn_norm,
        qk_norm,
        post_norms,
        wqkv: layer(p.qkv, p.qkv_names)?,
        wo: layer(vec![(p.wo, None)], &["attn_output"])?,
        w_gate_up: layer(p.gate_up, p.gate_up_names)?,
        w_down: layer(vec![(p.w_down, None)], &["ffn_down"])?,
    })
}

/// A block's quantized projections, with the names the file (and an adapter) gives
/// them.
struct Projections {
    qkv: Vec<(QTensor, Option<Tensor>)>,
    qkv_names: &'static [&'static str],
    gate_up: Vec<(QTensor, Option<Tensor>)>,
    gate_up_names: &'static [&'static str],
    wo: QTensor,
    w_down: QTensor,
}

impl Projections {
    /// Block `i`'s projections; files that fuse q/k/v (`attn_qkv`) or gate/up (`ffn_up`
    /// alone, gate first) hold the stacks this engine builds.
    fn load(
        gguf: &mut GgufFile,
        config: &Config,
        i: usize,
        biases: Option<[Tensor; 3]>,
        device: &Device,
    ) -> Result<Self> {
        let fused_qkv = gguf.has_tensor(&format!("blk.{i}.attn_qkv.weight"));
        let fused_gate_up = !gguf.has_tensor(&format!("blk.{i}.ffn_gate.weight"));
        let mut weight = |name: &str| gguf.tensor(&format!("blk.{i}.{name}.weight"), device);
        let (qkv, qkv_names) = match (fused_qkv, biases) {
            (true, _) => (vec![(weight("attn_qkv")?, None)], &["attn_qkv"][..]),
            (false, biases) => {
                let [bq, bk, bv] = biases.map_or([None, None, None], |b| b.map(Some));
                (
                    vec![
                        (weight("attn_q")?, bq),
                        (weight("attn_k")?, bk),
                        (weight("attn_v")?, bv),
                    ],
                    &["attn_q", "attn_k", "attn_v"][..],
                )
            }
        };
        let (gate_up, gate_up_names) = match fused_gate_up {
            true => (vec![(weight("ffn_up")?, None)], &["ffn_up"][..]),
            false => (
                vec![(weight("ffn_gate")?, None), (weight("ffn_up")?, None)],
                &["ffn_gate", "ffn_up"][..],
            ),
        };
        let (wo, w_down) = (weight("attn_output")?, weight("ffn_down")?);
        let rows = |parts: &[(QTensor, Option<Tensor>)]| -> usize {
            parts.iter().map(|(w, _)| w.shape().dims()[0]).sum()
        };
        let want_qkv = (config.n_head + 2 * config.n_kv_head) * config.head_dim;
        if rows(&qkv) != want_qkv || rows(&gate_up) != 2 * config.n_ff {
            return Err(gguf.gguf_error(format!(
                "blk.{i}: q/k/v projections have {} rows and gate/up {}, expected {want_qkv} \
                 and {}",
                rows(&qkv),
                rows(&gate_up),
                2 * config.n_ff
            )));
        }
        Ok(Self {
            qkv,
            qkv_names,
            gate_up,
            gate_up_names,
            wo,
            w_down,
        })
    }
}

/// A projection of block `i` (its `parts` stacked), with the adapter's update kept beside
/// the weights, so that one load serves both the calls it was trained for and the base
/// model's: on the CPU its factors A and B sit beside the quantized weights; on a GPU the
/// projection keeps W and W + B A in f32, both made on the CPU (see
/// `Linear::dense_pair`).
fn adapted_linear(
    loading: &Loading<'_>,
    i: usize,
    parts: Vec<(QTensor, Option<Tensor>)>,
    names: &[&str],
) -> Result<Linear> {
    let (plan, device) = (loading.plan, loading.device);
    if loading.adapters.iter().all(Option::is_none) {
        return Linear::fused(parts, plan, device);
    }
    if device.is_cpu() {
        let rows: Vec<usize> = parts.iter().map(|(w, _)| w.shape().dims()[0]).collect();
        let k = parts[0].0.shape().dims()[1];
        let mut updates = [None, None];
        for (slot, adapter) in loading.adapters.iter().enumerate() {
            if let Some(adapter) = adapter {
                let parts = names
                    .iter()
                    .map(|name| adapter.low_rank(i, name))
                    .collect::<Result<Vec<_>>>()?;
                updates[slot] = LowRank::new(k, &rows, parts)?;
            }
        }
        return Ok(Linear::fused(parts, plan, device)?.with_low_rank(updates));
    }
    let cpu = &Device::Cpu;
    let bias = crate::kernels::linear::fused_bias(&parts, device)?;
    let base: Vec<Tensor> = parts
        .iter()
        .map(|(w, _)| w.dequantize(cpu))
        .collect::<candle_core::Result<_>>()?;
    let mut merged = [None, None];
    for (slot, adapter) in loading.adapters.iter().enumerate() {
        let Some(adapter) = adapter else { continue };
        let mut rows = Vec::with_capacity(base.len());
        for (w, name) in base.iter().zip(names) {
            rows.push(match adapter.delta(i, name, cpu)? {
                Some(delta) => (w + delta)?,
                None => w.clone(),
            });
        }
        merged[slot] = Some(Tensor::cat(&rows, 0)?);
    }
    Linear::dense_pair(Tensor::cat(&base, 0)?, merged, bias, device)
}

#[cfg(test)]
mod tests {
    use super::Transformer;

    #[test]
    fn resuming_keeps_every_row_on_the_kernels_of_a_whole_prefill() {
        // A long first chunk would end with 12 rows: resume 16 rows before its end.
        assert_eq!(Transformer::resume_point(1000, 500), 496);
        assert_eq!(Transformer::resume_point(1000, 100), 100);
        // A prompt of 40 tokens: its last row alone would take the decode kernels.
        assert_eq!(Transformer::resume_point(40, 39), 24);
        // Short final chunks take the decode kernels either way.
        assert_eq!(Transformer::resume_point(10, 9), 9);
        assert_eq!(Transformer::resume_point(520, 515), 515);
        assert_eq!(Transformer::resume_point(600, 520), 520);
        // A boundary is always safe.
        assert_eq!(Transformer::resume_point(1000, 512), 512);
    }
}

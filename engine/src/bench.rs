//! Engine benchmark: prefill and decode speed with peak memory, in the shape of
//! llama.cpp's `llama-bench` (pp N: prompt processing of N tokens; tg N: N generated tokens).

use std::time::Instant;

use serde::Serialize;

use crate::chat::Message;
use crate::error::{Error, Result};
use crate::model::{DecodeStats, GenerateOptions, LocalModel};
use crate::sampling::argmax;

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// `pp512`, `tg256`, ...
    pub test: String,
    pub tokens: usize,
    /// Seconds of each repetition.
    pub seconds: Vec<f64>,
    /// Tokens per second of the median repetition.
    pub tokens_per_second: f64,
    /// Peak resident memory of the process during this case, in bytes (Linux only).
    pub peak_rss_bytes: Option<u64>,
    /// Forward passes and drafting of the generation (memory-rewrite cases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoding: Option<DecodeStats>,
    /// Floating-point operations per second of the median repetition, in billions
    /// (projection cases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflop_per_second: Option<f64>,
}

/// The processor's model name (Linux's /proc/cpuinfo; empty elsewhere), recorded with
/// every benchmark.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}

/// The processor's family, model and stepping as /proc/cpuinfo numbers them ("family 25
/// model 1 stepping 1": a Zen 3, where "family 25 model 17" is a Zen 4 that a VM may name
/// the same); empty where it does not.
pub fn cpu_id() -> String {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return String::new();
    };
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    match (field("cpu family"), field("model"), field("stepping")) {
        (Some(f), Some(m), Some(s)) => format!("family {f} model {m} stepping {s}"),
        _ => String::new(),
    }
}

/// The machine a benchmark ran on, recorded with every result so that figures of
/// different machines are not compared by mistake.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// The processor's model name ([`cpu_name`]).
    pub cpu: String,
    /// Its family, model and stepping ([`cpu_id`]).
    pub cpu_id: String,
    pub arch: &'static str,
    /// The vector instruction sets the build compiled in (`-C target-cpu`, `-C
    /// target-feature`): what candle's kernels and the engine's own use.
    pub build_features: &'static str,
    /// The integer products' kernel chosen at run time ("AVX-512 VNNI", "AVX2" or
    /// "portable").
    pub integer_kernel: &'static str,
    /// Threads the engine computes with (`RAYON_NUM_THREADS`, else every CPU).
    pub threads: usize,
    /// The build's profile and optimisation level.
    pub build_profile: &'static str,
    /// The `RUSTFLAGS` of the build ("" for none).
    pub build_flags: &'static str,
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cpu = if self.cpu.is_empty() {
            "unknown CPU"
        } else {
            &self.cpu
        };
        let features = if self.build_features.is_empty() {
            "no vector extensions"
        } else {
            self.build_features
        };
        let flags = if self.build_flags.is_empty() {
            "no RUSTFLAGS"
        } else {
            self.build_flags
        };
        let id = if self.cpu_id.is_empty() {
            String::new()
        } else {
            format!(", {}", self.cpu_id)
        };
        write!(
            f,
            "{cpu} ({}{id}; built for {features}; integer kernel {}) · {} threads · {}, {flags}",
            self.arch, self.integer_kernel, self.threads, self.build_profile
        )
    }
}

/// This machine and this build (see [`Machine`]).
pub fn machine() -> Machine {
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    Machine {
        cpu: cpu_name(),
        cpu_id: cpu_id(),
        arch: std::env::consts::ARCH,
        build_features: env!("MEMAGENT_BUILD_FEATURES"),
        integer_kernel: crate::integer_prefill_kernel().unwrap_or("portable"),
        threads,
        build_profile: env!("MEMAGENT_BUILD_PROFILE"),
        build_flags: env!("MEMAGENT_BUILD_FLAGS").trim(),
    }
}

/// Prefill of `tokens` prompt tokens (from `filler`), `repeats` times, median reported.
pub fn bench_prefill(
    model: &LocalModel,
    filler: &[u32],
    tokens: usize,
    repeats: usize,
) -> Result<BenchResult> {
    if filler.len() < tokens {
        return Err(Error::InvalidRequest(format!(
            "benchmark filler has {} tokens, {tokens} needed",
            filler.len()
        )));
    }
    let prompt = filler[..tokens].to_vec();
    let transformer = model.transformer();
    measure(format!("pp{tokens}"), tokens, repeats, || {
        let mut cache = transformer.new_cache(1, tokens);
        transformer.forward(std::slice::from_ref(&prompt), &mut cache)?;
        Ok(())
    })
}

/// `n` short prompts of `tokens` tokens each (different slices of `filler`, no prefix
/// cache), prefilled one after another (`pp{tokens}x{n}-alone`) and then together as
/// [`LocalModel::generate_batch`] prefills them (`pp{tokens}x{n}`), each up to its
/// first token, with a check that every prompt got the same token both ways. `None`
/// where the model's prefill is not row-exact and prompts prefill one at a time
/// ([`crate::Transformer::stacks_prefill`]).
pub fn bench_stacked_prefill(
    model: &LocalModel,
    filler: &[u32],
    n: usize,
    tokens: usize,
    repeats: usize,
) -> Result<Option<(BenchResult, BenchResult)>> {
    if !model.transformer().stacks_prefill() {
        return Ok(None);
    }
    if filler.len() < tokens + n {
        return Err(Error::InvalidRequest(format!(
            "benchmark filler has {} tokens, {} needed",
            filler.len(),
            tokens + n
        )));
    }
    let prompts: Vec<&[u32]> = (0..n).map(|i| &filler[i..i + tokens]).collect();
    let options = GenerateOptions {
        max_new_tokens: 1,
        reuse_prefix: false,
        ..GenerateOptions::default()
    };
    let mut firsts = Vec::new();
    let alone = measure(format!("pp{tokens}x{n}-alone"), n * tokens, repeats, || {
        firsts = prompts
            .iter()
            .map(|p| Ok(model.generate(p, &options)?.token_ids))
            .collect::<Result<Vec<_>>>()?;
        Ok(())
    })?;
    let mut together_firsts = Vec::new();
    let together = measure(format!("pp{tokens}x{n}"), n * tokens, repeats, || {
        together_firsts = model
            .generate_batch(&prompts, &options)?
            .into_iter()
            .map(|g| g.token_ids)
            .collect();
        Ok(())
    })?;
    if let Some(i) = (0..n).find(|&i| firsts[i] != together_firsts[i]) {
        return Err(Error::InvalidRequest(format!(
            "prompt {i} prefilled together gave another token than alone: not exact"
        )));
    }
    Ok(Some((alone, together)))
}

/// The model's projections alone on `rows` rows (`mm{rows}`): every matrix product of a
/// prefill of that many tokens without its attention and element-wise work, so tokens per
/// second is the ceiling those products put on prefill, reported with their GFLOP/s.
pub fn bench_projections(model: &LocalModel, rows: usize, repeats: usize) -> Result<BenchResult> {
    let transformer = model.transformer();
    reset_peak_rss();
    let mut runs = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        runs.push(transformer.time_projections(rows)?);
    }
    let seconds: Vec<f64> = runs.iter().map(|r| r.1).collect();
    let mut sorted = runs.clone();
    sorted.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (flops, median) = sorted[sorted.len() / 2];
    Ok(BenchResult {
        test: format!("mm{rows}"),
        tokens: rows,
        seconds,
        tokens_per_second: rows as f64 / median.max(f64::EPSILON),
        peak_rss_bytes: peak_rss(),
        decoding: None,
        gflop_per_second: Some(flops / median.max(f64::EPSILON) / 1e9),
    })
}

/// Greedy decode of `tokens` tokens after a one-token prompt, end-of-turn ignored
/// (`tg{tokens}`); also returns the tokens.
pub fn bench_decode(
    model: &LocalModel,
    start: u32,
    tokens: usize,
    repeats: usize,
) -> Result<(BenchResult, Vec<u32>)> {
    let (result, mut decoded) = bench_decode_batch(model, &[start], tokens, repeats)?;
    let ids = decoded.pop().unwrap_or_default();
    Ok((
        BenchResult {
            test: format!("tg{tokens}"),
            ..result
        },
        ids,
    ))
}

/// `starts.len()` sequences, each a one-token prompt, decoded greedily `tokens` tokens
/// each as one batch, end-of-turn ignored (`tg{tokens}x{n}`): every pass multiplies the
/// weights once for all of them. Tokens per second counts every sequence's tokens. Also
/// returns each sequence's tokens.
pub fn bench_decode_batch(
    model: &LocalModel,
    starts: &[u32],
    tokens: usize,
    repeats: usize,
) -> Result<(BenchResult, Vec<Vec<u32>>)> {
    let transformer = model.transformer();
    let n = starts.len();
    let mut decoded = vec![Vec::with_capacity(tokens); n];
    let result = measure(format!("tg{tokens}x{n}"), tokens * n, repeats, || {
        let mut cache = transformer.new_cache(n, tokens + 1);
        let mut next: Vec<u32> = starts.to_vec();
        for seq in decoded.iter_mut() {
            seq.clear();
        }
        for _ in 0..tokens {
            let ids: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
            let logits = transformer.forward(&ids, &mut cache)?;
            for (i, (t, seq)) in next.iter_mut().zip(decoded.iter_mut()).enumerate() {
                *t = argmax(&logits.get(i)?.to_vec1::<f32>()?);
                seq.push(*t);
            }
        }
        Ok(())
    })?;
    Ok((result, decoded))
}

/// A memory rewrite: the loop's update prompt with a previous memory of about
/// `memory_tokens` tokens (sentences of `filler`) and a section of the filler, decoded
/// greedily up to `max_tokens` with at most `draft_tokens` drafted per pass (0: one token
/// per pass). Reported as `rw{memory_tokens}` or `rw{memory_tokens}-d{draft_tokens}`, with
/// decode seconds per repetition; the generated tokens are returned so that callers can
/// check that both decodings agree.
pub fn bench_rewrite(
    model: &LocalModel,
    work: &RewriteWork<'_>,
    memory_tokens: usize,
    max_tokens: usize,
    draft_tokens: usize,
    repeats: usize,
) -> Result<(BenchResult, Vec<u32>)> {
    let prompt = rewrite_prompt(model, work, memory_tokens, 0)?;
    let options = rewrite_options(work, max_tokens, draft_tokens);
    reset_peak_rss();
    let mut seconds = Vec::with_capacity(repeats);
    let mut generation = None;
    for _ in 0..repeats.max(1) {
        let g = model.generate(&prompt, &options)?;
        seconds.push(g.decode_seconds);
        generation = Some(g);
    }
    let generation = generation.expect("at least one repetition");
    let mut sorted = seconds.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let result = BenchResult {
        test: match draft_tokens {
            0 => format!("rw{memory_tokens}"),
            d => format!("rw{memory_tokens}-d{d}"),
        },
        tokens: generation.completion_tokens,
        seconds,
        // Decode speed: the tokens after the first (which comes out of the prefill).
        tokens_per_second: generation.completion_tokens.saturating_sub(1) as f64
            / median.max(f64::EPSILON),
        peak_rss_bytes: peak_rss(),
        decoding: Some(generation.decoding),
        gflop_per_second: None,
    };
    Ok((result, generation.token_ids))
}

/// What a memory rewrite is made of: the text its memory and chunk are cut from, the
/// caller's update prompt (`fill(memory, chunk)`) and the span of its repeat guard
/// ([`GenerateOptions::stop_on_repeat`]).
pub struct RewriteWork<'a> {
    pub filler: &'a str,
    pub fill: &'a dyn Fn(&str, &str) -> String,
    pub repeat_guard: usize,
}

/// The loop's update prompt with a previous memory of about `memory_tokens` tokens
/// (sentences of `filler`) and a section of `filler`; `variant` picks which sentences and
/// which section, so that the prompts of a batch differ.
fn rewrite_prompt(
    model: &LocalModel,
    work: &RewriteWork<'_>,
    memory_tokens: usize,
    variant: usize,
) -> Result<Vec<u32>> {
    let (tokenizer, filler) = (model.tokenizer(), work.filler);
    let sentences: Vec<&str> = filler.split_inclusive(". ").collect();
    let mut memory = String::new();
    for sentence in sentences.iter().cycle().skip(variant * 7).take(10_000) {
        if tokenizer.encode(&memory, false)?.len() >= memory_tokens {
            break;
        }
        memory.push_str("- ");
        memory.push_str(sentence.trim());
        memory.push('\n');
    }
    // The last 2,000 characters, rotated by `variant` sentences.
    let chars: Vec<char> = filler.chars().collect();
    let section = &chars[chars.len().saturating_sub(2000)..];
    let shift = sentences
        .iter()
        .take(variant % sentences.len().max(1))
        .map(|s| s.chars().count())
        .sum::<usize>()
        % section.len().max(1);
    let chunk: String = section[shift..].iter().chain(&section[..shift]).collect();
    let text = (work.fill)(memory.trim_end(), &chunk);
    model.chat_prompt_ids(&[Message::user(&text)])
}

/// How the loop decodes a memory rewrite: greedy, with its loop stops.
fn rewrite_options(
    work: &RewriteWork<'_>,
    max_tokens: usize,
    draft_tokens: usize,
) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: max_tokens,
        stop_on_repeat: Some(work.repeat_guard),
        stop_on_repeated_line: true,
        draft_tokens,
        ..GenerateOptions::default()
    }
}

/// `sequences` different memory rewrites (memories of about `memory_tokens` tokens),
/// decoded one after another and then as one batch ([`LocalModel::generate_batch`]):
/// decode tokens per second of all of them each way (`bw{n}-alone`, `bw{n}`), with a
/// check that every sequence got the same tokens both ways.
pub fn bench_batch(
    model: &LocalModel,
    work: &RewriteWork<'_>,
    sequences: usize,
    memory_tokens: usize,
    max_tokens: usize,
    draft_tokens: usize,
) -> Result<(BenchResult, BenchResult)> {
    let prompts = (0..sequences.max(1))
        .map(|i| rewrite_prompt(model, work, memory_tokens, i))
        .collect::<Result<Vec<_>>>()?;
    let options = rewrite_options(work, max_tokens, draft_tokens);
    // Decode tokens: all but each sequence's first, which comes out of its prefill.
    let decoded = |gs: &[crate::model::Generation]| -> usize {
        gs.iter()
            .map(|g| g.completion_tokens.saturating_sub(1))
            .sum()
    };
    reset_peak_rss();
    let alone = prompts
        .iter()
        .map(|p| model.generate(p, &options))
        .collect::<Result<Vec<_>>>()?;
    let alone_seconds: f64 = alone.iter().map(|g| g.decode_seconds).sum();
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let start = Instant::now();
    let together = model.generate_batch(&refs, &options)?;
    let together_seconds =
        start.elapsed().as_secs_f64() - together.iter().map(|g| g.prefill_seconds).sum::<f64>();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        if a.token_ids != b.token_ids {
            return Err(crate::Error::InvalidRequest(format!(
                "sequence {i} decoded differently in a batch: the batch is not exact"
            )));
        }
    }
    let n = prompts.len();
    let result = |test: String, seconds: f64| BenchResult {
        test,
        tokens: decoded(&alone),
        seconds: vec![seconds],
        tokens_per_second: decoded(&alone) as f64 / seconds.max(f64::EPSILON),
        peak_rss_bytes: peak_rss(),
        decoding: None,
        gflop_per_second: None,
    };
    Ok((
        result(format!("bw{n}-alone"), alone_seconds),
        result(format!("bw{n}"), together_seconds),
    ))
}

fn measure(
    test: String,
    tokens: usize,
    repeats: usize,
    mut run: impl FnMut() -> Result<()>,
) -> Result<BenchResult> {
    reset_peak_rss();
    let mut seconds = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        run()?;
        seconds.push(start.elapsed().as_secs_f64());
    }
    let mut sorted = seconds.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    Ok(BenchResult {
        test,
        tokens,
        seconds,
        tokens_per_second: tokens as f64 / median,
        peak_rss_bytes: peak_rss(),
        decoding: None,
        gflop_per_second: None,
    })
}

/// Resets the kernel's peak-RSS mark for this process (Linux: `clear_refs` value 5).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set size (VmHWM) in bytes, where the platform reports it.
pub fn peak_rss() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_names_the_cpu_the_build_and_the_kernels() {
        let m = machine();
        let shown = m.to_string();
        if cfg!(target_os = "linux") {
            assert!(!m.cpu.is_empty(), "{shown}");
            assert!(shown.starts_with(&m.cpu), "{shown}");
        }
        // On x86 Linux the family and model tell CPUs apart that share a name (a VM's
        // "AMD EPYC" is a Zen 3 or a Zen 4).
        if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            assert!(m.cpu_id.starts_with("family "), "{shown}");
            assert!(shown.contains(&m.cpu_id), "{shown}");
        }
        assert!(m.threads >= 1);
        assert!(m.build_profile.contains("opt-level"), "{shown}");
        // The kernels compiled in are the build's: an AVX2 build says so.
        if cfg!(x86_avx2) {
            assert!(m.build_features.split(' ').any(|f| f == "avx2"), "{shown}");
            assert!(m.build_features.split(' ').any(|f| f == "fma"), "{shown}");
        }
        assert_eq!(
            m.integer_kernel,
            crate::integer_prefill_kernel().unwrap_or("portable")
        );
        let json = serde_json::to_value(&m).unwrap();
        for key in [
            "cpu",
            "cpu_id",
            "arch",
            "build_features",
            "integer_kernel",
            "threads",
        ] {
            assert!(!json[key].is_null(), "{key} missing from {json}");
        }
    }
}

//! `memctl bench recall`: embedding and indexing speed, search latency, index size.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use memagent_recall::{Embedder, Recall};
use serde_json::json;

use crate::commands::recall::{index_text, load_embedder};
use crate::commands::{print_json, ModelBackend};
use crate::settings::Settings;

/// Text of about `tokens` tokens in paragraphs of ~120 words and lines of ~20, each
/// paragraph numbered so that none repeats.
fn bench_text(haystack: &memagent_tasks::Haystack, tokens: usize) -> String {
    // English prose runs about 0.75 words per token.
    let words_wanted = tokens * 3 / 4;
    let text = haystack.text(words_wanted * 6);
    let mut out = String::with_capacity(words_wanted * 7);
    for (i, word) in text.split(' ').take(words_wanted).enumerate() {
        if i % 120 == 0 {
            out.push_str(&format!("\n\nNote {}. ", i / 120));
        } else if i % 20 == 0 {
            out.push('\n');
        } else {
            out.push(' ');
        }
        out.push_str(word);
    }
    out.push('\n');
    out
}

fn median_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// `memctl bench recall`.
pub fn bench(global: &Settings, args: &crate::cli::BenchRecallArgs) -> Result<()> {
    let embedder = load_embedder(global)?
        .context("bench recall times the embedder: do not pass --embedder none")?;
    let haystack = super::bench::haystack(None)?;
    let cpu = memagent_engine::bench::cpu_name();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut report =
        json!({"cpu": cpu, "threads": threads, "machine": memagent_engine::bench::machine()});

    // 1. Embedding throughput beside the engine's projections in the same run.
    let sample = bench_text(&haystack, 60_000);
    report["embedding"] = embedding_speed(global, &embedder, &sample)?;
    // 2. Indexing one chunk against the memory step that reads it.
    report["chunk"] = chunk_share(global, args, &embedder, &sample)?;
    // 3. Search latency, index size and indexing speed on large streams.
    let sizes = args
        .millions
        .iter()
        .map(|&millions| large_stream(args, &embedder, &haystack, millions))
        .collect::<Result<Vec<_>>>()?;
    report["streams"] = json!(sizes);
    report["peak_rss_bytes"] = json!(memagent_engine::bench::peak_rss());
    if args.json {
        return print_json(&report);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

/// Embedding throughput, beside the engine's projections in the same run.
fn embedding_speed(
    global: &Settings,
    embedder: &Embedder,
    sample: &str,
) -> Result<serde_json::Value> {
    let cut = memagent_recall::passages::cut(sample);
    let texts: Vec<&str> = cut
        .closed
        .iter()
        .take(256)
        .map(|s| &sample[s.start..s.end])
        .collect();
    embedder.embed(&texts[..8])?;
    let (_, stats) = embedder.embed_with_stats(&texts)?;
    let embed_gflops = stats.flops / stats.seconds / 1e9;
    eprintln!(
        "embedding: {} passages, {} tokens in {:.2}s: {:.0} tokens/s, {:.1} GFLOP/s",
        stats.texts,
        stats.tokens,
        stats.seconds,
        stats.tokens as f64 / stats.seconds,
        embed_gflops
    );
    let model = crate::commands::load_model(global)?;
    let projections = memagent_engine::bench::bench_projections(&model, 512, 3)?;
    let gemm_gflops = projections.gflop_per_second.unwrap_or(0.0);
    eprintln!("engine projections (mm512): {gemm_gflops:.1} GFLOP/s");
    Ok(json!({
        "passages": stats.texts, "tokens": stats.tokens, "seconds": stats.seconds,
        "tokens_per_second": stats.tokens as f64 / stats.seconds,
        "gflops": embed_gflops, "engine_projections_gflops": gemm_gflops,
        "share_of_engine_gemm": embed_gflops / gemm_gflops.max(f64::EPSILON),
    }))
}

/// A chunk indexed, against the memory step that reads it.
fn chunk_share(
    global: &Settings,
    args: &crate::cli::BenchRecallArgs,
    embedder: &Arc<Embedder>,
    sample: &str,
) -> Result<serde_json::Value> {
    let backend = ModelBackend::open(global, &args.run)?;
    let (index_seconds, step_seconds, chunk_tokens) = backend.with_agent(|agent| {
        let c = agent.profile.chunk_tokens;
        let ids = agent.tokenizer().encode(sample)?;
        let chunk_text = agent.tokenizer().decode(&ids[c..2 * c])?;
        let mut times = Vec::new();
        for round in 0..3 {
            let dir = std::env::temp_dir()
                .join(format!("memctl-bench-chunk-{}-{round}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let recall = Recall::open(&dir, Some(embedder.clone()))?;
            let started = Instant::now();
            index_text(&recall, "bench", &chunk_text, &mut |_| {})?;
            times.push(started.elapsed().as_secs_f64());
            drop(recall);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let chunk = memagent_agent::Chunk {
            text: chunk_text.clone(),
            tokens: c,
        };
        let started = Instant::now();
        agent.update_with(
            memagent_agent::GENERAL_UPDATE,
            "",
            memagent_agent::NO_MEMORY,
            &chunk,
        )?;
        let step = started.elapsed().as_secs_f64();
        Ok((median_p99(times).0, step, c))
    })?;
    eprintln!(
        "a {chunk_tokens}-token chunk: indexed in {:.3}s, its memory step {:.2}s ({:.1}%)",
        index_seconds,
        step_seconds,
        100.0 * index_seconds / step_seconds
    );
    Ok(json!({
        "tokens": chunk_tokens, "index_seconds": index_seconds, "step_seconds": step_seconds,
        "share": index_seconds / step_seconds,
    }))
}

/// Indexing speed, index size and search latency on a stream of `millions` of tokens.
fn large_stream(
    args: &crate::cli::BenchRecallArgs,
    embedder: &Arc<Embedder>,
    haystack: &memagent_tasks::Haystack,
    millions: f64,
) -> Result<serde_json::Value> {
    let tokens = (millions * 1e6) as usize;
    let text = bench_text(haystack, tokens);
    let dir = std::env::temp_dir().join(format!(
        "memctl-bench-recall-{}-{millions}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let vectors = match (args.words_only, args.random_vectors) {
        (true, _) => None,
        (false, true) => Some(Arc::new(Embedder::hashed(embedder.dimensions()))),
        (false, false) => Some(embedder.clone()),
    };
    let recall = Recall::open(&dir, vectors)?;
    let bytes = text.as_bytes();
    let started = Instant::now();
    let mut last = Instant::now();
    let synced = index_text(&recall, "bench", &text, &mut |at| {
        if last.elapsed().as_secs() >= 30 {
            eprintln!(
                "  indexed {:.0}% of {millions}M tokens",
                100.0 * at as f64 / bytes.len() as f64
            );
            last = Instant::now();
        }
    })?;
    let index_seconds = started.elapsed().as_secs_f64();
    // Queries: five words from random places of the text.
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut latencies = Vec::new();
    for i in 0..args.searches {
        let at = (i * 7919 * 131) % (words.len() - 5);
        let query = words[at..at + 5].join(" ");
        let started = Instant::now();
        if args.random_vectors {
            // What the question's real embedding costs; the index embeds it again,
            // by hash, in no time.
            embedder.embed(&[&query])?;
        }
        recall.search(&memagent_recall::SearchRequest {
            text: &query,
            streams: Some(&[1]),
            k: 8,
        })?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    // The first search reads the vectors of new segments; it is reported apart.
    let first = latencies[0];
    let (p50, p99) = median_p99(latencies[1..].to_vec());
    let size = recall.size_on_disk();
    eprintln!(
        "{millions}M tokens ({} bytes, {} passages): indexed in {index_seconds:.0}s; \
         search p50 {p50:.2} ms, p99 {p99:.2} ms (first {first:.0} ms); index {:.1} MB ({:.1} MB per 1M tokens){}",
        bytes.len(),
        synced.passages,
        size as f64 / 1e6,
        size as f64 / 1e6 / millions,
        match (args.words_only, args.random_vectors) {
            (true, _) => "; words only",
            (false, true) => "; random vectors, the question embedded for real",
            (false, false) => "",
        }
    );
    let row = json!({
        "million_tokens": millions, "bytes": bytes.len(), "passages": synced.passages,
        "words_only": args.words_only, "random_vectors": args.random_vectors,
        "index_seconds": index_seconds,
        "search_ms_p50": p50, "search_ms_p99": p99, "first_search_ms": first,
        "index_bytes": size, "index_mb_per_million_tokens": size as f64 / 1e6 / millions,
    });
    drop(recall);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(row)
}

use std::io::Write;

use anyhow::{Context, Result};
use memagent_engine::bench::{bench_decode, bench_prefill, BenchResult};

use crate::cli::{BenchEngineArgs, GlobalArgs};

/// Sentences cycled to make benchmark prompts of any length (content does not affect speed).
const FILLER: &str = "The grass is green. The sky is blue. The sun is yellow. Here we go. \
There and back again. A long memory is a list of small facts, kept in order and rewritten \
as new text arrives. Numbers such as 1234 and 56.78 appear now and then. ";

pub fn engine(global: &GlobalArgs, args: &BenchEngineArgs) -> Result<()> {
    let model = super::load_model(global)?;
    let longest = args.prefill.iter().copied().max().unwrap_or(0);
    if longest > model.context_length() {
        anyhow::bail!(
            "prefill size {longest} exceeds the model's context of {} tokens",
            model.context_length()
        );
    }
    let unit = model.tokenizer().encode(FILLER, false)?;
    let filler: Vec<u32> = unit.iter().copied().cycle().take(longest).collect();
    let mut results: Vec<BenchResult> = Vec::new();
    for &n in &args.prefill {
        let r =
            bench_prefill(&model, &filler, n, args.repeats).with_context(|| format!("pp{n}"))?;
        report_progress(&r);
        results.push(r);
    }
    if args.decode > 0 {
        let r = bench_decode(&model, unit[0], args.decode, args.repeats)?;
        report_progress(&r);
        results.push(r);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = std::io::stdout().lock();
    if args.json {
        let value = serde_json::json!({
            "model": model.path(),
            "device": global.device,
            "threads": threads,
            "results": results,
        });
        serde_json::to_writer_pretty(&mut out, &value)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "model: {}  device: {}  threads: {threads}  repeats: {}",
        model.path().display(),
        global.device,
        args.repeats
    )?;
    writeln!(
        out,
        "{:<8} {:>10} {:>12} {:>14}",
        "test", "tokens", "tok/s", "peak RSS MiB"
    )?;
    for r in &results {
        let rss = r.peak_rss_bytes.map_or("-".to_string(), |b| {
            format!("{:.0}", b as f64 / (1024.0 * 1024.0))
        });
        writeln!(
            out,
            "{:<8} {:>10} {:>12.1} {:>14}",
            r.test, r.tokens, r.tokens_per_second, rss
        )?;
    }
    Ok(())
}

fn report_progress(r: &BenchResult) {
    tracing::info!(
        "{}: {:.1} tok/s ({:?} s)",
        r.test,
        r.tokens_per_second,
        r.seconds
    );
}

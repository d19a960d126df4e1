//! Times the training forward and backward passes on one sequence of a model, beside the
//! plain f32 GEMM rate of the same shapes (the ceiling of the frozen projections).
//!
//! `cargo run --release -p memagent-trainer --example step_bench -- MODEL.gguf [TOKENS]`
//! (`TARGETS=q,v` limits the adapted projections; `TARGETS=` times the forward pass alone)
use std::time::Instant;

use memagent_trainer::{LoraConfig, TrainModel};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().ok_or("usage: step_bench MODEL.gguf [TOKENS]")?;
    let t: usize = args.next().map_or(Ok(1300), |s| s.parse())?;
    let mut lora = LoraConfig::default();
    if let Ok(t) = std::env::var("TARGETS") {
        lora.targets = t
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
    }
    let m = TrainModel::load(model.as_ref(), lora, 7)?;
    {
        let (d, ff) = (m.config.n_embd, m.config.n_ff);
        let a = candle_core::Tensor::randn(0f32, 1.0, (t, d), &candle_core::Device::Cpu)?;
        let w = candle_core::Tensor::randn(0f32, 1.0, (ff, d), &candle_core::Device::Cpu)?;
        let s = Instant::now();
        for _ in 0..10 {
            let _ = a.matmul(&w.t()?)?;
        }
        let e = s.elapsed().as_secs_f64();
        println!(
            "matmul ({t},{d})x({d},{ff}): {:.1} GFLOP/s",
            10.0 * 2.0 * (t * d * ff) as f64 / e / 1e9
        );
    }
    let ids: Vec<u32> = (0..t as u32).map(|i| 100 + (i * 7919) % 40000).collect();
    let positions: Vec<usize> = (t - 100..t - 1).collect();
    for round in 0..3 {
        let s = Instant::now();
        let logits = m.forward(&ids, &positions)?;
        let loss = logits.sqr()?.mean_all()?;
        let f = s.elapsed().as_secs_f64();
        let s = Instant::now();
        let grads = loss.backward()?;
        let b = s.elapsed().as_secs_f64();
        drop(grads);
        println!(
            "round {round}: forward {f:.2} s, backward {b:.2} s, {:.1} tokens/s",
            t as f64 / (f + b)
        );
    }
    Ok(())
}

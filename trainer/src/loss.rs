//! The training loss: a per-token weighted negative log-likelihood over the tokens a
//! model is taught to generate. Supervised training weighs every target token 1; a
//! policy-gradient stage can pass advantages as weights through the same function.

use candle_core::{Tensor, D};

use crate::error::Result;

/// Σ_t w_t · (−log p(target_t)) / `normalizer`, from `logits` (n, vocab).
pub fn weighted_nll(
    logits: &Tensor,
    targets: &[u32],
    weights: &[f32],
    normalizer: f64,
) -> Result<Tensor> {
    let n = targets.len();
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let idx = Tensor::from_slice(targets, (n, 1), logits.device())?;
    let picked = log_probs.gather(&idx, 1)?.squeeze(1)?;
    let w = Tensor::from_slice(weights, n, logits.device())?;
    Ok(((picked * w)?.sum_all()? * (-1.0 / normalizer))?)
}

/// Targets the logits rank first (teacher-forced token accuracy).
pub fn correct_tokens(logits: &Tensor, targets: &[u32]) -> Result<usize> {
    let best: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
    Ok(best.iter().zip(targets).filter(|(a, b)| a == b).count())
}

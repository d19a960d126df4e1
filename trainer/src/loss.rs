//! The training loss: a per-token weighted negative log-likelihood over the tokens a
//! model is taught to generate. Supervised training weighs every target token 1; a
//! policy-gradient stage can pass advantages as weights through the same function.

use candle_core::{Tensor, D};

use crate::error::Result;

/// Σ_t w_t · (−log p(target_t)) / `normalizer`, from `logits` (n, vocab); each row's
/// log-probability in one fused pass on the CPU.
pub fn weighted_nll(
    logits: &Tensor,
    targets: &[u32],
    weights: &[f32],
    normalizer: f64,
) -> Result<Tensor> {
    if !logits.device().is_cpu() || logits.dtype() != candle_core::DType::F32 {
        return weighted_nll_composed(logits, targets, weights, normalizer);
    }
    let nll = crate::ops::nll_rows(logits, targets)?;
    let w = Tensor::from_slice(weights, targets.len(), logits.device())?;
    Ok(((nll * w)?.sum_all()? * (1.0 / normalizer))?)
}

/// [`weighted_nll`] from candle's log-softmax and gather (off the CPU, and the reference
/// the fused pass is compared with).
pub fn weighted_nll_composed(
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

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::ops::nll_rows;
    use crate::ops::tests::close;

    #[test]
    fn fused_nll_equals_log_softmax_and_gather_with_its_gradient() {
        let dev = Device::Cpu;
        let logits = Var::randn(0f32, 3.0, (9, 301), &dev).unwrap();
        let targets: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 301).collect();
        let weights: Vec<f32> = (0..9).map(|i| 0.5 + i as f32 / 9.0).collect();
        let run = |fused: bool| {
            let loss = if fused {
                weighted_nll(logits.as_tensor(), &targets, &weights, 7.0)
            } else {
                weighted_nll_composed(logits.as_tensor(), &targets, &weights, 7.0)
            }
            .unwrap();
            let grads = loss.backward().unwrap();
            let g = grads.get(&logits).unwrap().flatten_all().unwrap();
            (
                loss.to_scalar::<f32>().unwrap(),
                g.to_vec1::<f32>().unwrap(),
            )
        };
        let (fused, composed) = (run(true), run(false));
        close(&[fused.0], &[composed.0], "nll");
        close(&fused.1, &composed.1, "nll dlogits");
        assert!(nll_rows(logits.as_tensor(), &[0; 8]).is_err());
        assert!(nll_rows(logits.as_tensor(), &[301; 9]).is_err());
    }
}

//! AdamW with decoupled weight decay, its state kept as plain tensors so a checkpoint
//! can save and restore it exactly; warm-up + cosine learning rate; gradient clipping
//! by global norm.

use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

pub struct AdamW {
    pub config: AdamWConfig,
    /// Updates applied so far.
    pub step: u64,
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

impl AdamW {
    pub fn new(config: AdamWConfig, vars: &[Var]) -> Result<Self> {
        Ok(Self {
            config,
            step: 0,
            m: vars
                .iter()
                .map(|v| v.zeros_like())
                .collect::<Result<_, _>>()?,
            v: vars
                .iter()
                .map(|v| v.zeros_like())
                .collect::<Result<_, _>>()?,
        })
    }

    /// One update of every variable with its gradient at learning rate `lr`.
    pub fn update(&mut self, vars: &[Var], grads: &[Tensor], lr: f64) -> Result<()> {
        let c = self.config;
        self.step += 1;
        let t = self.step as i32;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for (i, (var, g)) in vars.iter().zip(grads).enumerate() {
            let m = ((&self.m[i] * c.beta1)? + (g * (1.0 - c.beta1))?)?;
            let v = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let step = ((&m / bc1)? / ((&v / bc2)?.sqrt()? + c.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - lr * c.weight_decay))?;
            var.set(&(decayed - (step * lr)?)?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }
}

/// Linear warm-up over `warmup` updates, then a cosine down to `min_ratio` · `peak` at
/// update `total`.
pub fn learning_rate(step: u64, peak: f64, warmup: u64, total: u64, min_ratio: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    peak * (min_ratio + (1.0 - min_ratio) * cosine)
}

/// Scales `grads` so their global L2 norm is at most `max_norm`; returns the norm before.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64> {
    let mut sq = 0f64;
    for g in grads.iter() {
        sq += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
    }
    let norm = sq.sqrt();
    if max_norm > 0.0 && norm > max_norm {
        let k = max_norm / (norm + 1e-6);
        for g in grads.iter_mut() {
            *g = (&*g * k)?;
        }
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let lr = |s| learning_rate(s, 1.0, 10, 110, 0.1);
        assert!((lr(0) - 0.1).abs() < 1e-12);
        assert!((lr(9) - 1.0).abs() < 1e-12);
        assert!((lr(10) - 1.0).abs() < 1e-12);
        assert!(lr(60) < 0.6 && lr(60) > 0.5);
        assert!((lr(110) - 0.1).abs() < 1e-12);
        assert!((lr(500) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn adamw_moves_against_the_gradient_and_clipping_bounds_the_norm() {
        let dev = candle_core::Device::Cpu;
        let var = Var::new(&[1.0f32, -1.0], &dev).unwrap();
        let mut opt = AdamW::new(AdamWConfig::default(), std::slice::from_ref(&var)).unwrap();
        let mut grads = vec![Tensor::new(&[3.0f32, -4.0], &dev).unwrap()];
        let norm = clip_grad_norm(&mut grads, 1.0).unwrap();
        assert!((norm - 5.0).abs() < 1e-6);
        let clipped: Vec<f32> = grads[0].to_vec1().unwrap();
        assert!((clipped[0] - 0.6).abs() < 1e-5 && (clipped[1] + 0.8).abs() < 1e-5);
        opt.update(std::slice::from_ref(&var), &grads, 0.1).unwrap();
        let v: Vec<f32> = var.as_tensor().to_vec1().unwrap();
        // The first Adam step moves each coordinate by lr against its gradient's sign.
        assert!(
            (v[0] - 0.9).abs() < 1e-4 && (v[1] + 0.9).abs() < 1e-4,
            "{v:?}"
        );
    }
}

//! Choosing the next token from logits: greedy by default, or temperature with nucleus
//! (top-p) sampling from a seeded generator.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (always the most likely token).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 299_792_458,
        }
    }
}

pub(crate) struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub(crate) fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: StdRng::seed_from_u64(params.seed),
        }
    }

    pub(crate) fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((l - max) / self.params.temperature).exp()))
            .collect();
        let total: f32 = probs.iter().map(|p| p.1).sum();
        probs.iter_mut().for_each(|p| p.1 /= total);
        if self.params.top_p < 1.0 {
            probs.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    mass += p.1;
                    mass >= self.params.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let kept: f32 = probs.iter().map(|p| p.1).sum();
        let mut r = self.rng.random::<f32>() * kept;
        for &(id, p) in &probs {
            if r < p {
                return id;
            }
            r -= p;
        }
        probs.last().map_or(0, |p| p.0)
    }
}

/// Index of the largest logit; the first one on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The natural log-probability of `token` under the softmax of `logits`.
pub fn log_probability(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    f64::from(logits[token as usize] - max) - total.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probability_is_the_log_softmax() {
        // Two equal logits and one far below: each of the two holds half the mass.
        let logits = [2.0, 2.0, -40.0];
        assert!((log_probability(&logits, 0) - 0.5f64.ln()).abs() < 1e-9);
        assert!(log_probability(&logits, 2) < -40.0);
        let mass: f64 = (0..3).map(|t| log_probability(&logits, t).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-9);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn same_seed_same_choices_and_top_p_excludes_the_tail() {
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: 7,
        };
        // Token 2 holds most of the mass; with top_p 0.5 it is the only candidate.
        let logits = [0.0, 0.0, 5.0, 0.0];
        let mut a = Sampler::new(params);
        assert!((0..50).all(|_| a.sample(&logits) == 2));
        let flat = [1.0; 16];
        let mut a = Sampler::new(SamplingParams {
            top_p: 1.0,
            ..params
        });
        let mut b = Sampler::new(SamplingParams {
            top_p: 1.0,
            ..params
        });
        let xs: Vec<u32> = (0..32).map(|_| a.sample(&flat)).collect();
        let ys: Vec<u32> = (0..32).map(|_| b.sample(&flat)).collect();
        assert_eq!(xs, ys);
        assert!(
            xs.iter().any(|&x| x != xs[0]),
            "sampling flat logits varies"
        );
    }
}

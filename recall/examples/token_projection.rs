//! Fits the projection the index keeps token states in (`recall/src/token-projection.bin`):
//! the embedder's telling tokens' states over a folder of prose, cut into passages as the
//! index cuts them, and the [`TOKEN_DIMENSIONS`] leading eigenvectors of their second
//! moment (the directions that keep their dot products best), found by subspace
//! iteration.
//!
//! ```text
//! cargo run --release -p memagent-recall --example token_projection -- \
//!     ../shared/data/haystack/paul-graham-essays recall/src/token-projection.bin
//! ```
//!
//! The embedder is `models/all-MiniLM-L6-v2`, or `$MEMAGENT_EMBEDDER`.

use std::path::PathBuf;

use memagent_recall::{passages, Embedder, TOKEN_DIMENSIONS};

/// Rounds of subspace iteration: the leading directions' share of the states' energy
/// stops changing in the fifth digit well before.
const ROUNDS: usize = 300;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(folder), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: token_projection FOLDER OUT (a folder of .txt files)".into());
    };
    let embedder_dir = std::env::var_os("MEMAGENT_EMBEDDER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models/all-MiniLM-L6-v2"));
    let embedder = Embedder::load(&embedder_dir)?.without_token_projection();
    let dims = embedder.dimensions();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "txt"));
    files.sort();
    // The states' second moment, Σ s sᵀ.
    let mut moment = vec![0f64; dims * dims];
    let mut states = 0usize;
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        let cut = passages::cut(&text);
        let texts: Vec<&str> = cut
            .closed
            .iter()
            .chain(&cut.open)
            .map(|s| &text[s.start..s.end])
            .collect();
        for batch in texts.chunks(32) {
            for embedded in embedder.embed_tokens_with_stats(batch)?.0 {
                for s in &embedded.tokens {
                    for (i, &a) in s.iter().enumerate() {
                        let row = &mut moment[i * dims..(i + 1) * dims];
                        for (m, &b) in row.iter_mut().zip(s) {
                            *m += f64::from(a) * f64::from(b);
                        }
                    }
                    states += 1;
                }
            }
        }
    }
    if states == 0 {
        return Err(format!("no token states in the .txt files of {folder}").into());
    }
    // Subspace iteration from fixed pseudo-random columns: Q ← orthonormal(M Q).
    let k = TOKEN_DIMENSIONS;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut q: Vec<Vec<f64>> = (0..k)
        .map(|_| {
            (0..dims)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
                })
                .collect()
        })
        .collect();
    orthonormalise(&mut q);
    for _ in 0..ROUNDS {
        q = q.iter().map(|v| times(&moment, v)).collect();
        orthonormalise(&mut q);
    }
    let energy: f64 = q.iter().map(|v| dot(v, &times(&moment, v))).sum();
    let total: f64 = (0..dims).map(|i| moment[i * dims + i]).sum();
    let bytes: Vec<u8> = q
        .iter()
        .flatten()
        .flat_map(|&x| (x as f32).to_le_bytes())
        .collect();
    std::fs::write(&out, bytes)?;
    println!(
        "{} files, {states} token states: {k} of {dims} directions hold {:.1}% of their energy; wrote {out}",
        files.len(),
        100.0 * energy / total
    );
    Ok(())
}

/// `m v` for a square row-major `m`.
fn times(m: &[f64], v: &[f64]) -> Vec<f64> {
    m.chunks_exact(v.len()).map(|row| dot(row, v)).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Modified Gram-Schmidt, in order: each vector made orthogonal to those before it, then
/// of unit length.
fn orthonormalise(vs: &mut [Vec<f64>]) {
    for i in 0..vs.len() {
        let (done, rest) = vs.split_at_mut(i);
        let v = &mut rest[0];
        for u in done.iter() {
            let d = dot(u, v);
            v.iter_mut().zip(u).for_each(|(x, y)| *x -= d * y);
        }
        let norm = dot(v, v).sqrt().max(1e-300);
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

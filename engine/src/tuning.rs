//! Decoding's CPU-dependent setting, chosen by measurement when a model loads: how far
//! ahead the block products ask for the weights' bytes ([`kernels::prefetch`]). The
//! best distance differs between CPUs (a Xeon's is not a Zen's), and it changes when
//! bytes arrive, never a result's bits, so it is measured here rather than fixed.
//!
//! Each distance decodes windows of the model's own blocks (one token's products on
//! one row), windows taken in turn around the model so that none is still in the cache
//! from the window before; the distances take turns within each round, in a rotated
//! order, until [`BUDGET`] is spent. The fastest by median replaces the default only
//! when it is [`MARGIN`] faster. The choice is kept per CPU, thread count, build and
//! model file in a small JSON file the caller names ([`Prefetch::Measure`]), so later
//! loads measure nothing; a caller may also set the distance ([`Prefetch::Set`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::kernels::prefetch::{self, CANDIDATES, DEFAULT_AHEAD};
use crate::Transformer;

/// Time the measurement may take at most.
pub const BUDGET: std::time::Duration = std::time::Duration::from_millis(150);

/// How much faster (by median) a distance must decode than the default to replace it.
pub const MARGIN: f64 = 0.03;

/// Rounds of every distance measured before a choice is made, even past [`BUDGET`]
/// (up to [`GIVE_UP`]).
pub const MIN_ROUNDS: usize = 3;

/// Rounds measured at most.
const MAX_ROUNDS: usize = 25;

/// Past this, with fewer than [`MIN_ROUNDS`] rounds measured, the default stays.
const GIVE_UP: std::time::Duration = std::time::Duration::from_millis(600);

/// Weight bytes of the windows measured, about: past a CPU's private caches, and short.
const WINDOW_BYTES: u64 = 8 << 20;

/// A model file under this size is not measured (nor cached): its weights stay in the
/// CPU's caches from one token to the next, so no distance makes a difference.
pub const SMALLEST_MODEL: u64 = 4 * WINDOW_BYTES;

/// How a model's loader gets the prefetch distance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prefetch {
    /// Measured, and kept in the cache file when one is named (read from it when it
    /// holds this CPU, build and model file).
    Measure { cache: Option<PathBuf> },
    /// This many bytes ahead, without measuring; `by` says who set it (for messages).
    Set { bytes: usize, by: String },
}

impl Default for Prefetch {
    fn default() -> Self {
        Self::Measure { cache: None }
    }
}

/// How the distance in use was chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Measured in this process.
    Measured,
    /// Measured before, for this CPU, build and model file, and read from the cache.
    Cached,
    /// Set by the caller (what set it: an environment variable, an option).
    Set(String),
    /// Not measured, with the reason.
    Default(String),
}

/// One distance's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Bytes ahead.
    pub ahead: usize,
    /// Median milliseconds one block's products took, over `samples` windows.
    pub block_ms: f64,
    pub samples: usize,
}

/// The distance chosen, how, and what was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeTuning {
    pub prefetch_ahead: usize,
    pub source: Source,
    /// Each distance measured (when measured, here or before).
    pub candidates: Vec<Candidate>,
    /// Milliseconds this load spent choosing (measuring, or reading the cache).
    pub ms: f64,
}

impl std::fmt::Display for DecodeTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "prefetch {} bytes ahead", self.prefetch_ahead)?;
        match &self.source {
            Source::Measured => write!(f, " (measured in {:.0} ms", self.ms)?,
            Source::Cached => write!(f, " (measured before, read in {:.1} ms", self.ms)?,
            Source::Set(by) => return write!(f, " (set by {by})"),
            Source::Default(why) => return write!(f, " (the default: {why})"),
        }
        let shown: Vec<String> = self
            .candidates
            .iter()
            .map(|c| format!("{}: {:.3}", c.ahead, c.block_ms))
            .collect();
        write!(f, "; ms a block by distance: {})", shown.join(", "))
    }
}

/// What a choice is kept under: the CPU (its name and, on x86, family, model and
/// stepping), the threads, the build and the model file (name, size and modification
/// time).
fn cache_key(model_file: &Path, file: Option<&std::fs::Metadata>) -> String {
    let machine = crate::bench::machine();
    let modified = file
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    format!(
        "{} [{}] · {} threads · {} {} {} · {} ({} bytes, modified {modified})",
        machine.cpu,
        machine.cpu_id,
        machine.threads,
        env!("CARGO_PKG_VERSION"),
        machine.build_profile,
        machine.build_features,
        model_file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        file.map_or(0, |m| m.len()),
    )
}

fn read_cache(path: &Path) -> BTreeMap<String, DecodeTuning> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Adds `tuning` under `key`, written whole to a temporary file and renamed over the
/// cache, so a reader never sees half a file. A failure is logged, never an error: the
/// next load measures again.
fn write_cache(path: &Path, key: String, tuning: &DecodeTuning) {
    let mut all = read_cache(path);
    all.insert(key, tuning.clone());
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&all).unwrap_or_default())?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        tracing::debug!("decode tuning: cannot write {}: {e}", path.display());
    }
}

/// Chooses and sets the prefetch distance for `transformer` (loaded from `model_file`)
/// as `how` asks: as set, from the cache when it holds this CPU, build and file, else by
/// measuring (and keeping the result in the cache).
pub fn tune_decode(
    transformer: &Transformer,
    model_file: &Path,
    how: &Prefetch,
) -> Result<DecodeTuning> {
    let started = Instant::now();
    let chosen = |source: Source, ahead: usize, candidates: Vec<Candidate>| {
        prefetch::set_ahead(ahead);
        DecodeTuning {
            prefetch_ahead: ahead,
            source,
            candidates,
            ms: started.elapsed().as_secs_f64() * 1e3,
        }
    };
    let cache = match how {
        Prefetch::Set { bytes, by } => {
            return Ok(chosen(Source::Set(by.clone()), *bytes, Vec::new()))
        }
        Prefetch::Measure { cache } => cache.as_deref(),
    };
    if !cfg!(x86_avx2) {
        let why = "this build's products do not prefetch (no AVX2)".to_string();
        return Ok(chosen(Source::Default(why), DEFAULT_AHEAD, Vec::new()));
    }
    if !transformer.on_cpu() {
        let why = "the model runs on a GPU".to_string();
        return Ok(chosen(Source::Default(why), DEFAULT_AHEAD, Vec::new()));
    }
    let file = std::fs::metadata(model_file).ok();
    let model_bytes = file.as_ref().map_or(0, |m| m.len());
    if model_bytes < SMALLEST_MODEL {
        let why = format!(
            "its {:.1} MB fit in the caches: decoding does not wait on memory",
            model_bytes as f64 / 1e6
        );
        return Ok(chosen(Source::Default(why), DEFAULT_AHEAD, Vec::new()));
    }
    let key = cache_key(model_file, file.as_ref());
    if let Some(found) = cache.and_then(|c| read_cache(c).remove(&key)) {
        return Ok(chosen(
            Source::Cached,
            found.prefetch_ahead,
            found.candidates,
        ));
    }
    let (ahead, candidates, why) = measure(transformer, model_bytes)?;
    let tuning = match why {
        Some(why) => chosen(Source::Default(why), ahead, candidates),
        None => chosen(Source::Measured, ahead, candidates),
    };
    if let (Some(cache), Source::Measured) = (cache, &tuning.source) {
        write_cache(cache, key, &tuning);
    }
    Ok(tuning)
}

/// Measures every distance (see the module's documentation): the distance to use, what
/// each gave, and why the default stays when too few rounds fit the budget.
fn measure(
    transformer: &Transformer,
    model_bytes: u64,
) -> Result<(usize, Vec<Candidate>, Option<String>)> {
    let layers = transformer.blocks();
    if layers == 0 {
        return Ok((
            DEFAULT_AHEAD,
            Vec::new(),
            Some("the model has no blocks".into()),
        ));
    }
    // Blocks a window holds: about WINDOW_BYTES of weights, the file's bytes shared out
    // among the blocks (its embeddings counted in: a window is never shorter than that).
    let block_bytes = (model_bytes / layers as u64).max(1);
    let width = (WINDOW_BYTES.div_ceil(block_bytes) as usize).clamp(1, layers);
    let windows = (layers / width).max(1);
    let mut next = 0usize;
    let mut window = || {
        let start = (next % windows) * width;
        next += 1;
        start..(start + width).min(layers)
    };
    // The threads started and the code paged in before anything is timed.
    transformer.time_decode_products(window())?;
    let started = Instant::now();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); CANDIDATES.len()];
    let mut rounds = 0;
    loop {
        let spent = started.elapsed();
        let enough = rounds >= MIN_ROUNDS && spent >= BUDGET;
        // A CPU this busy measures nothing worth keeping.
        let hopeless = rounds < MIN_ROUNDS && spent >= GIVE_UP;
        if rounds == MAX_ROUNDS || enough || hopeless {
            break;
        }
        for turn in 0..CANDIDATES.len() {
            let i = (turn + rounds) % CANDIDATES.len();
            prefetch::set_ahead(CANDIDATES[i]);
            let blocks = window();
            let n = blocks.len() as f64;
            samples[i].push(transformer.time_decode_products(blocks)? * 1e3 / n);
        }
        rounds += 1;
    }
    let candidates: Vec<Candidate> = CANDIDATES
        .iter()
        .zip(&mut samples)
        .map(|(&ahead, s)| Candidate {
            ahead,
            block_ms: median(s),
            samples: s.len(),
        })
        .collect();
    if rounds < MIN_ROUNDS {
        let why = format!(
            "only {rounds} of {MIN_ROUNDS} rounds measured in {} ms",
            GIVE_UP.as_millis()
        );
        return Ok((DEFAULT_AHEAD, candidates, Some(why)));
    }
    Ok((pick(&candidates), candidates, None))
}

/// The fastest distance by median, when it beats the default's by [`MARGIN`]; else the
/// default.
pub fn pick(candidates: &[Candidate]) -> usize {
    let default = candidates.iter().find(|c| c.ahead == DEFAULT_AHEAD);
    let best = candidates
        .iter()
        .filter(|c| c.block_ms.is_finite())
        .min_by(|a, b| a.block_ms.total_cmp(&b.block_ms));
    match (best, default) {
        (Some(best), Some(default)) if best.block_ms <= default.block_ms * (1.0 - MARGIN) => {
            best.ahead
        }
        (Some(best), None) => best.ahead,
        _ => DEFAULT_AHEAD,
    }
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(ahead: usize, block_ms: f64) -> Candidate {
        Candidate {
            ahead,
            block_ms,
            samples: 3,
        }
    }

    #[test]
    fn the_default_stays_unless_another_distance_is_clearly_faster() {
        let close = [candidate(0, 1.00), candidate(DEFAULT_AHEAD, 1.01)];
        assert_eq!(pick(&close), DEFAULT_AHEAD, "1% faster is noise");
        let clear = [candidate(1024, 0.90), candidate(DEFAULT_AHEAD, 1.0)];
        assert_eq!(pick(&clear), 1024);
        let slower = [candidate(6144, 1.2), candidate(DEFAULT_AHEAD, 1.0)];
        assert_eq!(pick(&slower), DEFAULT_AHEAD);
        assert_eq!(pick(&[]), DEFAULT_AHEAD);
    }

    #[test]
    fn medians_ignore_an_outlier() {
        assert_eq!(median(&mut [1.0, 9.0, 1.2]), 1.2);
        assert_eq!(median(&mut [1.0, 2.0]), 1.5);
        assert!(median(&mut []).is_nan());
    }
}

//! What the daemon reports about each stream: pending work, lag and throughput.

use std::collections::{HashMap, VecDeque};
use std::time::{Instant, SystemTime};

use memagent_memory::StepOutcome;

/// The daemon's resident memory now and at its peak, in bytes (`VmRSS` and `VmHWM` of
/// /proc/self/status; `None` where the system has no such file).
pub(crate) fn resident_memory() -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (None, None);
    };
    let kib = |field: &str| -> Option<u64> {
        let rest = status.lines().find_map(|l| l.strip_prefix(field))?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// Lags kept per stream for the percentiles.
const LAG_SAMPLES: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct StreamStats {
    /// Tokens of the next chunk as last measured (at most C).
    pub pending_tokens: Option<u32>,
    /// Appends not yet read into memory: the log's length after each, and when.
    arrivals: VecDeque<(u64, Instant)>,
    /// Seconds from append to memory updated, most recent last.
    pub lags: VecDeque<f64>,
    pub steps: u64,
    pub tokens: u64,
    pub seconds: f64,
    /// Seconds since the epoch of the last memory update.
    pub last_update: Option<u64>,
    pub last_error: Option<String>,
}

impl StreamStats {
    /// Seconds the oldest append not yet in memory has waited.
    pub fn lag(&self) -> f64 {
        self.arrivals
            .front()
            .map_or(0.0, |(_, at)| at.elapsed().as_secs_f64())
    }

    pub fn lag_percentile(&self, p: f64) -> Option<f64> {
        if self.lags.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = self.lags.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
        Some(sorted[rank])
    }
}

#[derive(Debug)]
pub(crate) struct Stats {
    pub started: Instant,
    pub streams: HashMap<String, StreamStats>,
    pub files: usize,
    /// The stream the engine is reading now.
    pub busy: Option<String>,
    pub scans: u64,
    /// Why the store is degraded: a write that did not finish within the deadline.
    /// Cleared by the next write that finishes.
    pub degraded: Option<String>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            streams: HashMap::new(),
            files: 0,
            busy: None,
            scans: 0,
            degraded: None,
        }
    }
}

impl Stats {
    pub fn arrived(&mut self, stream: &str, log_len: u64, at: Instant) {
        self.streams
            .entry(stream.to_string())
            .or_default()
            .arrivals
            .push_back((log_len, at));
    }

    pub fn stepped(&mut self, stream: &str, outcome: &StepOutcome) {
        let s = self.streams.entry(stream.to_string()).or_default();
        let now = Instant::now();
        while let Some(&(end, at)) = s.arrivals.front() {
            if end > outcome.chunk.end {
                break;
            }
            s.arrivals.pop_front();
            s.lags.push_back(now.duration_since(at).as_secs_f64());
            if s.lags.len() > LAG_SAMPLES {
                s.lags.pop_front();
            }
        }
        s.steps += 1;
        s.tokens += u64::from(outcome.chunk.tokens);
        s.seconds += outcome.version.seconds;
        s.pending_tokens = None;
        s.last_error = None;
        s.last_update = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs());
    }
}

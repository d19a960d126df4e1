//! How far ahead of the block being read decoding's block products ask for the weights'
//! bytes. Decoding reads every weight once a token, from memory: the hardware
//! prefetchers stop at each 4 KiB page and one thread alone waits on its loads. On a
//! Sapphire Rapids Xeon (about 4.5 GB/s a thread without it) asking 2-4 KiB ahead gave
//! 8-11 GB/s and one decoded sequence 1.3x the tokens per second; the best distance is
//! the CPU's, so each process sets the one measured fastest on its CPU
//! ([`crate::tuning`]). The distance changes when bytes arrive, never a result's bits.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The distance the products use until one is chosen: the Xeon's.
pub const DEFAULT_AHEAD: usize = 3072;

/// The distances measured, in bytes (0: the block being read, no look ahead).
pub const CANDIDATES: [usize; 6] = [0, 1024, 2048, 3072, 4096, 6144];

static AHEAD: AtomicUsize = AtomicUsize::new(DEFAULT_AHEAD);

/// The distance in use.
pub fn ahead() -> usize {
    AHEAD.load(Ordering::Relaxed)
}

/// Sets the distance for every product of the process from now on.
pub fn set_ahead(bytes: usize) {
    AHEAD.store(bytes, Ordering::Relaxed);
}

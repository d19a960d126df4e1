//! How the engine's CPU kernels share out their work: over candle's barrier pool while its
//! workers keep up, on the calling thread alone while they do not.
//!
//! A barrier-pool call returns only when every worker has finished its part. When the
//! machine's other cores are busy (another program, a second daemon), a worker that has
//! taken a part may wait a whole OS time slice before it runs again, and the calling
//! thread waits with it: a decoding pass runs hundreds of kernels, and decoding slowed to
//! under a third of its speed where a lone thread runs at half. So each call times how
//! long the calling thread waited after its own last part; after [`LATE_CALLS`] calls in
//! a row that waited longer than they worked, the next [`INLINE_CALLS`] run on the
//! calling thread without waking the pool, and then the workers are tried again. On an
//! idle machine the workers finish with the caller and nothing changes.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Calls in a row that waited on the workers before kernels run inline.
const LATE_CALLS: u32 = 8;
/// Calls run inline before the pool's workers are tried again.
const INLINE_CALLS: u32 = 4096;
/// A wait shorter than this is a worker finishing its last part, not a late one.
const LATE_WAIT: Duration = Duration::from_micros(100);

static LATE: AtomicU32 = AtomicU32::new(0);
static INLINE_LEFT: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// On the thread that calls the pool, for the length of the call: when its last
    /// part ended.
    static CALLER: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `f` over `0..n`, in ranges handed out to the pool's threads (the caller among
/// them) or, while the workers lag, in one range on the calling thread.
pub fn for_chunks(n: usize, f: impl Fn(Range<usize>) + Sync) {
    if n == 0 {
        return;
    }
    let pool = candle_core::utils::barrier_pool();
    if n == 1 || pool.n_workers() == 0 || CALLER.with(Cell::get).is_some() {
        f(0..n);
        return;
    }
    let left = INLINE_LEFT.load(Ordering::Relaxed);
    if left > 0 {
        INLINE_LEFT.store(left - 1, Ordering::Relaxed);
        f(0..n);
        return;
    }
    let start = Instant::now();
    CALLER.with(|c| c.set(Some(start)));
    pool.execute_chunked(n, |range| {
        f(range);
        CALLER.with(|c| {
            if c.get().is_some() {
                c.set(Some(Instant::now()));
            }
        });
    });
    let end = Instant::now();
    let own_end = CALLER.with(|c| c.take()).unwrap_or(start);
    let waited = end - own_end;
    if waited < LATE_WAIT || waited < own_end - start {
        LATE.store(0, Ordering::Relaxed);
    } else if LATE.fetch_add(1, Ordering::Relaxed) + 1 >= LATE_CALLS {
        LATE.store(0, Ordering::Relaxed);
        INLINE_LEFT.store(INLINE_CALLS, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn every_item_is_visited_once_pooled_or_inline() {
        for n in [0, 1, 5, 8, 100, 1000] {
            let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for_chunks(n, |range| {
                for i in range {
                    seen[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(
                seen.iter().all(|s| s.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
        // Nested calls run inline instead of waiting on the pool they are part of.
        let total = AtomicUsize::new(0);
        for_chunks(64, |outer| {
            for _ in outer {
                for_chunks(4, |inner| {
                    total.fetch_add(inner.len(), Ordering::Relaxed);
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 64 * 4);
    }

    #[test]
    fn workers_that_keep_the_caller_waiting_are_left_out_for_a_while() {
        if candle_core::utils::barrier_pool().n_workers() == 0 {
            return; // one core: every call runs inline anyway
        }
        let caller = std::thread::current().id();
        let busy = |d: Duration| {
            let until = Instant::now() + d;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        };
        // A worker that takes a part sleeps far longer than the caller works. (Other
        // tests' calls may interleave and reset the count; enough calls get through.)
        let mut inline = false;
        for _ in 0..200 {
            let visited = AtomicUsize::new(0);
            for_chunks(32, |range| {
                visited.fetch_add(range.len(), Ordering::Relaxed);
                if std::thread::current().id() == caller {
                    busy(Duration::from_micros(50));
                } else {
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            assert_eq!(visited.load(Ordering::Relaxed), 32);
            if INLINE_LEFT.load(Ordering::Relaxed) > 0 {
                inline = true;
                break;
            }
        }
        assert!(inline, "late workers were never left out");
    }
}

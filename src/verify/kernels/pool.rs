//! The kernels' thread pool, built to degrade smoothly when another process takes a core.
//!
//! A forward pass is hundreds of parallel operations of tens of microseconds each, so
//! a pool that waits for every thread at every operation (candle's barrier pool, which
//! the kernels used before) stalls for a whole scheduler time slice whenever one of its
//! threads is descheduled: with one busy process beside a 2-thread pool on 2 cores, a
//! decoding step went from 6 ms to 200 ms. Here:
//! - A worker joins an operation only if it arrives while the operation is open; the
//!   calling thread never waits for a worker that has not started. Items are claimed from
//!   a shared cursor in shrinking chunks, so whoever runs does the work.
//! - The caller waits only for workers that hold claimed items, and after a short spin it
//!   sleeps, which frees its core: the kernel then moves the descheduled worker there
//!   (an idle core pulls runnable threads) instead of the caller burning the slice.
//! - Idle workers spin briefly for the next operation (they come back to back within a
//!   step), then park.
//!
//! Which thread computes an item never changes its bits: each item is computed whole by
//! one thread, with the same instructions on every thread.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next operation before it parks: operations
/// within a step follow each other within microseconds, and waking a parked worker
/// costs more than that.
const WORKER_SPIN: Duration = Duration::from_micros(200);
/// How long the caller spins for the last workers before it sleeps: a worker that has
/// not finished by then was most likely descheduled, which lasts milliseconds. (50 µs
/// here and for the workers was as fast under contention and up to 10% slower idle.)
const CALLER_SPIN: Duration = Duration::from_micros(200);

/// The operation in progress: a type-erased `&dyn Fn(Range<usize>)` and its item count.
#[derive(Clone, Copy)]
struct Operation {
    run: *const (dyn Fn(std::ops::Range<usize>) + Sync),
    items: usize,
    split: usize,
}

/// What the caller and the workers share.
struct Shared {
    /// Bumped for every operation; workers wait for it to change.
    generation: AtomicU64,
    /// The generation workers may still join; 0 once the caller has closed it.
    open: AtomicU64,
    /// The operation of the open generation.
    operation: std::sync::Mutex<Option<Operation>>,
    /// Next unclaimed item.
    cursor: AtomicUsize,
    /// Workers inside the current operation.
    active: AtomicUsize,
    /// The caller sleeps until `active` is 0; the last worker out wakes it.
    caller_sleeping: AtomicBool,
    caller: std::sync::Mutex<Option<std::thread::Thread>>,
    /// A worker's part of the operation panicked: the caller panics too.
    worker_panicked: AtomicBool,
    /// Threads of the pool, the caller included (for chunk sizes).
    threads: usize,
}

// SAFETY: the operation pointer is only dereferenced by workers registered in `active`
// while its generation is open, and the caller keeps the closure alive until `active`
// is 0 after closing it.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// A pool of `threads - 1` workers plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<std::thread::Thread>,
    /// One operation at a time.
    calls: std::sync::Mutex<()>,
}

impl Pool {
    fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            open: AtomicU64::new(0),
            operation: std::sync::Mutex::new(None),
            cursor: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            caller_sleeping: AtomicBool::new(false),
            caller: std::sync::Mutex::new(None),
            worker_panicked: AtomicBool::new(false),
            threads: threads.max(1),
        });
        let workers = (1..threads.max(1))
            .filter_map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("suffixd-kernel-{i}"))
                    .spawn(move || worker(&shared))
                    .map(|h| h.thread().clone())
                    .map_err(|e| tracing::warn!("kernel thread {i} not started: {e}"))
                    .ok()
            })
            .collect();
        Pool {
            shared,
            workers,
            calls: std::sync::Mutex::new(()),
        }
    }

    /// Threads that work on an operation, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `f` over `0..items` on the calling thread and the workers that join, each
    /// taking ranges from a shared cursor; returns when every item is done.
    pub fn run(&self, items: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
        if items == 0 {
            return;
        }
        if self.workers.is_empty() || items == 1 {
            return f(0..items);
        }
        let _one = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let run: &(dyn Fn(std::ops::Range<usize>) + Sync) = &f;
        // SAFETY: only the lifetime is erased; see `Shared`'s Sync.
        let run: *const (dyn Fn(std::ops::Range<usize>) + Sync) =
            unsafe { std::mem::transmute(run) };
        // Chunks of half of what is left per thread. Finer ones leave a descheduled
        // worker holding less, but cost more in claims than they save: an eighth cost 15%
        // of idle decoding speed here, and did not help under contention either once
        // the caller sleeps instead of spinning.
        let split = 2;
        *s.operation.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Operation { run, items, split });
        *s.caller.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
        s.cursor.store(0, Ordering::SeqCst);
        let generation = s.generation.load(Ordering::Relaxed) + 1;
        s.open.store(generation, Ordering::SeqCst);
        s.generation.store(generation, Ordering::SeqCst);
        for w in &self.workers {
            // An atomic swap, unless the worker is parked.
            w.unpark();
        }
        // Closes the operation and waits for the workers in it, also if `f` panics here.
        let _drain = Drain(s);
        claim_and_run(s, items, &f, self.threads(), split);
    }
}

/// Closes the open operation and waits until no worker is inside it, so that the closure
/// may go.
struct Drain<'a>(&'a Shared);

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        let s = self.0;
        // A worker that registers from now on backs out without touching the closure.
        s.open.store(0, Ordering::SeqCst);
        let spun = Instant::now();
        while s.active.load(Ordering::SeqCst) != 0 {
            if spun.elapsed() < CALLER_SPIN {
                std::hint::spin_loop();
                continue;
            }
            // A worker holding items was descheduled: sleep, so this core is free for it.
            s.caller_sleeping.store(true, Ordering::SeqCst);
            if s.active.load(Ordering::SeqCst) != 0 {
                std::thread::park_timeout(Duration::from_millis(1));
            }
            s.caller_sleeping.store(false, Ordering::SeqCst);
        }
        *s.operation.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if s.worker_panicked.swap(false, Ordering::SeqCst) && !std::thread::panicking() {
            panic!("a kernel panicked on a pool thread");
        }
    }
}

/// Claim chunks of `1 / split` of what is left per thread (at least one item) until none
/// are left: the chunks shrink towards the end (guided scheduling), so threads finish
/// together.
fn claim_and_run(
    s: &Shared,
    items: usize,
    f: &(dyn Fn(std::ops::Range<usize>) + Sync),
    threads: usize,
    split: usize,
) {
    let mut start = s.cursor.load(Ordering::Relaxed);
    while start < items {
        let take = ((items - start) / (split * threads)).max(1);
        match s.cursor.compare_exchange_weak(
            start,
            start + take,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                f(start..start + take);
                start = s.cursor.load(Ordering::Relaxed);
            }
            Err(now) => start = now,
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Wait for a new operation: spin briefly, then park.
        let spun = Instant::now();
        let generation = loop {
            let g = s.generation.load(Ordering::SeqCst);
            if g != seen {
                break g;
            }
            if spun.elapsed() < WORKER_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(Duration::from_millis(100));
            }
        };
        seen = generation;
        // Register, then check that the operation is still open (the caller closes it,
        // then waits for `active` to drain: one of the two sees the other).
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.open.load(Ordering::SeqCst) == generation {
            let operation = *s.operation.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(op) = operation {
                // SAFETY: registered while open: the caller keeps the closure alive
                // until `active` drains.
                let run = unsafe { &*op.run };
                let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    claim_and_run(s, op.items, run, s.threads, op.split)
                }));
                if caught.is_err() {
                    s.worker_panicked.store(true, Ordering::SeqCst);
                }
            }
        }
        if s.active.fetch_sub(1, Ordering::SeqCst) == 1
            && s.caller_sleeping.load(Ordering::SeqCst)
            && let Some(caller) = s.caller.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
        {
            caller.unpark();
        }
    }
}

/// The kernels' pool: `CANDLE_NUM_THREADS` threads (the machine's cores by default),
/// the caller included.
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::env::var("CANDLE_NUM_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(candle_core::utils::get_num_threads);
        Pool::new(threads)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_exactly_once() {
        let pool = Pool::new(3);
        for items in [1, 2, 7, 100, 10_000] {
            let counts: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(items, |range| {
                    for i in range {
                        counts[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 50));
        }
    }

    /// A worker that is slow (as a descheduled one is) delays the caller only by the
    /// chunk it holds: the caller takes everything else, and the worker gets no second
    /// chunk.
    #[test]
    fn the_caller_does_the_work_of_a_worker_that_does_not_come() {
        let pool = Pool::new(2);
        let caller = std::thread::current().id();
        let (by_caller, worker_chunks) = (AtomicUsize::new(0), AtomicUsize::new(0));
        pool.run(1000, |range| {
            if std::thread::current().id() == caller {
                by_caller.fetch_add(range.len(), Ordering::Relaxed);
            } else {
                worker_chunks.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        // The largest chunk a thread can claim: half of the items over two threads.
        assert!(by_caller.load(Ordering::Relaxed) >= 750, "{by_caller:?}");
        assert!(
            worker_chunks.load(Ordering::Relaxed) <= 1,
            "{worker_chunks:?}"
        );
    }
}

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
//! - When the caller keeps having to sleep for workers (another process holds a core),
//!   the pool runs operations on the calling thread alone for a while ([`Adaptive`]):
//!   one thread beside one busy process gets a core of its own, while two threads share
//!   one and a half and wait for each other. Measured here: 108.6 tok/s alone against
//!   68.1 with both threads (163.3 idle with both). It tries the workers again after a
//!   while, and waits twice as long each time they still stall.
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
/// Operations per window in which the pool judges whether it runs well with its workers.
const WINDOW: u32 = 32;
/// Stalls (the caller slept for a descheduled worker) in one window that send the pool to
/// the calling thread alone: idle, a stall is rare (an interrupt, a page fault); beside a
/// busy process, several per window.
const STALLS_TO_GO_SOLO: u32 = 3;
/// The share of a window's wall time the calling thread must get on a CPU: beside a busy
/// process it is descheduled for whole time slices, while its workers spin for it.
/// Idle, it runs (or spins) all the time.
const LEAST_CPU_SHARE: f64 = 0.75;
/// A gap between operations longer than this starts a new window: the caller was doing
/// something else (waiting for requests), which says nothing about the pool.
const LONGEST_GAP: Duration = Duration::from_millis(1);
/// How long the first spell on the calling thread alone lasts; each spell after which
/// the workers still do not pay lasts twice as long, up to `LONGEST_SOLO`. Short, because
/// an idle machine sees a spell now and then (a window spent paging in the weights, a
/// burst of another tenant): 50 ms cost 3% of idle decoding here.
const FIRST_SOLO: Duration = Duration::from_millis(10);
const LONGEST_SOLO: Duration = Duration::from_secs(1);

/// When to run operations on the calling thread alone: after a window of operations in
/// which the caller repeatedly slept for a descheduled worker, or was itself off the CPU
/// for a quarter of the time, for a spell that doubles while that goes on and falls back
/// to [`FIRST_SOLO`] once a window runs well.
#[derive(Debug)]
struct Adaptive {
    /// The window: the thread that calls, and when it began (wall and that thread's CPU
    /// time, if the clock can be read).
    window: Option<(std::thread::ThreadId, Instant, Option<Duration>)>,
    operations: u32,
    stalls: u32,
    /// Time the caller slept for workers in this window (off the CPU by its own choice).
    parked: Duration,
    last_end: Option<Instant>,
    solo_until: Option<Instant>,
    next_spell: Duration,
    /// Spells so far (for tests and the curious).
    spells: u64,
}

impl Adaptive {
    fn new() -> Self {
        Adaptive {
            window: None,
            operations: 0,
            stalls: 0,
            parked: Duration::ZERO,
            last_end: None,
            solo_until: None,
            next_spell: FIRST_SOLO,
            spells: 0,
        }
    }

    /// True while operations run on the calling thread alone.
    fn solo(&mut self, now: Instant) -> bool {
        match self.solo_until {
            Some(until) if now < until => true,
            Some(_) => {
                // The spell is over: the next window tries the workers again.
                self.solo_until = None;
                self.window = None;
                false
            }
            None => false,
        }
    }

    /// An operation with the workers ran from `start` to `end` on `thread`, and the
    /// caller slept `parked` of it for a worker. `thread_cpu` reads the calling thread's CPU time
    /// (`None`: not known); it is called only when a window starts or ends, as a read
    /// costs about a microsecond, as much as a small operation.
    fn observe(
        &mut self,
        thread: std::thread::ThreadId,
        start: Instant,
        end: Instant,
        parked: Duration,
        thread_cpu: impl FnOnce() -> Option<Duration>,
    ) {
        let gap = self
            .last_end
            .map_or(Duration::MAX, |last| start.saturating_duration_since(last));
        self.last_end = Some(end);
        let continues = matches!(self.window, Some((t, _, _)) if t == thread && gap <= LONGEST_GAP);
        if !continues {
            // A new window starts after this operation.
            self.open_window(Some((thread, end, thread_cpu())));
            return;
        }
        self.parked += parked;
        if self.count_stall(!parked.is_zero(), end) {
            return;
        }
        self.operations += 1;
        if self.operations < WINDOW {
            return;
        }
        let (_, wall_start, cpu_start) = self.window.expect("a window is open");
        let cpu = thread_cpu();
        // Time it chose to sleep is not time it was kept off the CPU.
        let wall = end.duration_since(wall_start).saturating_sub(self.parked);
        self.open_window(Some((thread, end, cpu)));
        // Without a CPU clock, stalls alone decide.
        let descheduled = match (cpu_start, cpu) {
            (Some(before), Some(now)) => {
                now.saturating_sub(before).as_secs_f64() < LEAST_CPU_SHARE * wall.as_secs_f64()
            }
            _ => false,
        };
        if descheduled {
            self.go_solo(end);
        } else {
            self.next_spell = FIRST_SOLO;
        }
    }

    /// Count a stall; go solo (and say so) when the window has had enough.
    fn count_stall(&mut self, stalled: bool, now: Instant) -> bool {
        self.stalls += u32::from(stalled);
        if self.stalls >= STALLS_TO_GO_SOLO {
            self.go_solo(now);
            return true;
        }
        false
    }

    fn go_solo(&mut self, now: Instant) {
        self.solo_until = Some(now + self.next_spell);
        self.next_spell = (self.next_spell * 2).min(LONGEST_SOLO);
        self.spells += 1;
        self.open_window(None);
    }

    /// Start counting a new window (None: at the next operation).
    fn open_window(&mut self, window: Option<(std::thread::ThreadId, Instant, Option<Duration>)>) {
        self.window = window;
        self.operations = 0;
        self.stalls = 0;
        self.parked = Duration::ZERO;
    }
}

/// CPU time the calling thread has run; `None` where the clock cannot be read.
fn thread_cpu_time() -> Option<Duration> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid pointer to a timespec that lives through the call.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

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
    /// One operation at a time; and whether to run it on the calling thread alone.
    calls: std::sync::Mutex<Adaptive>,
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
            calls: std::sync::Mutex::new(Adaptive::new()),
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
        let mut adaptive = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let started = Instant::now();
        if adaptive.solo(started) {
            return f(0..items);
        }
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
        let caller = std::thread::current();
        let caller_id = caller.id();
        *s.caller.lock().unwrap_or_else(|e| e.into_inner()) = Some(caller);
        s.cursor.store(0, Ordering::SeqCst);
        let generation = s.generation.load(Ordering::Relaxed) + 1;
        s.open.store(generation, Ordering::SeqCst);
        s.generation.store(generation, Ordering::SeqCst);
        for w in &self.workers {
            // An atomic swap, unless the worker is parked.
            w.unpark();
        }
        // Closes the operation and waits for the workers in it, also if `f` panics here.
        let drain = Drain {
            shared: s,
            parked: Duration::ZERO,
            done: false,
        };
        claim_and_run(s, items, &f, self.threads(), split);
        let parked = drain.finish();
        adaptive.observe(caller_id, started, Instant::now(), parked, thread_cpu_time);
    }

    /// Spells the pool has run on the calling thread alone.
    #[cfg(test)]
    fn solo_spells(&self) -> u64 {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).spells
    }
}

/// Closes the open operation and waits until no worker is inside it, so that the closure
/// may go: at [`Drain::finish`], or when dropped (if `f` panicked on the caller).
struct Drain<'a> {
    shared: &'a Shared,
    /// How long the caller slept for a worker.
    parked: Duration,
    /// Drained already.
    done: bool,
}

impl Drain<'_> {
    /// Drain, and say how long the caller slept for a worker.
    fn finish(mut self) -> Duration {
        self.drain();
        let parked = self.parked;
        drop(self);
        parked
    }

    fn drain(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let s = self.shared;
        // A worker that registers from now on backs out without touching the closure.
        s.open.store(0, Ordering::SeqCst);
        let spun = Instant::now();
        while s.active.load(Ordering::SeqCst) != 0 {
            if spun.elapsed() < CALLER_SPIN {
                std::hint::spin_loop();
                continue;
            }
            // A worker holding items was descheduled: sleep, so this core is free for it.
            let slept = Instant::now();
            s.caller_sleeping.store(true, Ordering::SeqCst);
            if s.active.load(Ordering::SeqCst) != 0 {
                std::thread::park_timeout(Duration::from_millis(1));
            }
            s.caller_sleeping.store(false, Ordering::SeqCst);
            self.parked += slept.elapsed();
        }
        *s.operation.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if s.worker_panicked.swap(false, Ordering::SeqCst) && !std::thread::panicking() {
            panic!("a kernel panicked on a pool thread");
        }
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        self.drain();
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

    /// Operations of 20 µs back to back from `*t`, on a thread that gets `share` of the
    /// wall time on a CPU; every `stall_every`-th caller sleeps for a worker.
    fn operations(
        a: &mut Adaptive,
        t: &mut Instant,
        cpu: &mut Duration,
        n: u32,
        share: f64,
        stall_every: u32,
    ) {
        let me = std::thread::current().id();
        let step = Duration::from_micros(20);
        for i in 0..n {
            let start = *t;
            *t += step;
            *cpu += step.mul_f64(share);
            let now_cpu = *cpu;
            let parked = if i % stall_every == stall_every - 1 {
                Duration::from_micros(1)
            } else {
                Duration::ZERO
            };
            a.observe(me, start, *t, parked, || Some(now_cpu));
        }
    }

    #[test]
    fn stalls_or_a_descheduled_caller_send_the_pool_solo_for_spells_that_double_and_reset() {
        let mut a = Adaptive::new();
        let (mut t, mut cpu) = (Instant::now(), Duration::ZERO);
        // Idle: on the CPU all the time, a stall now and then: never solo.
        operations(&mut a, &mut t, &mut cpu, 20 * WINDOW, 1.0, WINDOW);
        assert!(!a.solo(t));
        assert_eq!(a.spells, 0);
        // Beside a busy process: the caller is off the CPU half the time.
        operations(&mut a, &mut t, &mut cpu, 2 * WINDOW, 0.5, u32::MAX);
        assert!(a.solo(t));
        assert!(a.solo(t + FIRST_SOLO / 2));
        t += FIRST_SOLO;
        assert!(!a.solo(t), "the spell ends");
        // Still so: the next spell is twice as long.
        operations(&mut a, &mut t, &mut cpu, 2 * WINDOW, 0.5, u32::MAX);
        assert!(a.solo(t + FIRST_SOLO * 3 / 2));
        t += FIRST_SOLO * 2;
        assert!(!a.solo(t));
        // A window that runs well: the next spell is short again; stalls in a row start it.
        // (One operation opens the window, WINDOW more close it.)
        operations(&mut a, &mut t, &mut cpu, WINDOW + 1, 1.0, u32::MAX);
        operations(&mut a, &mut t, &mut cpu, STALLS_TO_GO_SOLO, 1.0, 1);
        assert!(a.solo(t + FIRST_SOLO / 2));
        assert!(!a.solo(t + FIRST_SOLO));
        assert_eq!(a.spells, 3);
        // A gap (the caller waited for requests) is not time off the CPU.
        let mut b = Adaptive::new();
        operations(&mut b, &mut t, &mut cpu, WINDOW / 2, 1.0, u32::MAX);
        t += Duration::from_secs(1);
        operations(&mut b, &mut t, &mut cpu, 4 * WINDOW, 1.0, u32::MAX);
        assert_eq!(b.spells, 0);
    }

    /// A worker that keeps being late (as a descheduled one is) sends the pool to the
    /// calling thread alone: then the caller computes every item.
    #[test]
    fn a_worker_that_keeps_stalling_is_left_out_for_a_while() {
        let pool = Pool::new(2);
        let caller = std::thread::current().id();
        let by_worker = AtomicUsize::new(0);
        // The caller's chunks take a while too, so that the worker arrives in time to
        // take one.
        let slow_worker = |range: std::ops::Range<usize>| {
            if std::thread::current().id() != caller {
                by_worker.fetch_add(range.len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        };
        let mut runs = 0;
        while pool.solo_spells() == 0 {
            pool.run(1000, slow_worker);
            runs += 1;
            assert!(runs < 100, "stalls never sent the pool solo");
        }
        let before = by_worker.load(Ordering::Relaxed);
        pool.run(1000, slow_worker);
        assert_eq!(
            by_worker.load(Ordering::Relaxed),
            before,
            "the worker was left out"
        );
    }

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

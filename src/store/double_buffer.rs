//! Two copies of the store's state, so that speculation never waits for a writer
//! (the left-right pattern). Readers take the active copy; a writer changes the inactive
//! copy, makes it the active one, then waits for the last readers of the other copy and
//! changes it the same way. Every change is therefore applied twice and must be
//! deterministic; memory is twice the mutable part (the mmapped base is shared).
//!
//! Why not the `left-right` crate: its read handles belong to one thread each, while the
//! store is read through `&Store` from any thread (model thread, admin handlers,
//! snapshot jobs). Two `RwLock`s and an index give the same guarantee here: a reader
//! only ever `try_read`s, and a copy is write-locked only while it is inactive, so a
//! failed attempt means the active copy has just changed and the next attempt takes it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, TryLockError};

/// A value readers never wait for.
pub struct DoubleBuffered<T> {
    copies: [RwLock<T>; 2],
    active: AtomicUsize,
    writer: Mutex<()>,
}

impl<T: Clone> DoubleBuffered<T> {
    /// Two copies of `value`.
    pub fn new(value: T) -> Self {
        DoubleBuffered {
            copies: [RwLock::new(value.clone()), RwLock::new(value)],
            active: AtomicUsize::new(0),
            writer: Mutex::new(()),
        }
    }
}

impl<T> DoubleBuffered<T> {
    /// The current value, without waiting for writers (a change in progress is either
    /// wholly visible or not at all).
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        loop {
            let i = self.active.load(Ordering::Acquire);
            match self.copies[i].try_read() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                // The writer holds this copy, so it is no longer the active one.
                Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
            }
        }
    }

    /// Exclusive right to change the value; writers wait for each other (not readers).
    pub fn writer(&self) -> Writer<'_, T> {
        Writer {
            cell: self,
            _lock: self.writer.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }
}

/// Held by the one writer; see [`DoubleBuffered::writer`].
pub struct Writer<'a, T> {
    cell: &'a DoubleBuffered<T>,
    _lock: MutexGuard<'a, ()>,
}

impl<T> Writer<'_, T> {
    /// The current value; nothing changes it while this writer is held.
    pub fn get(&self) -> RwLockReadGuard<'_, T> {
        self.cell.read()
    }

    /// Apply `change` to both copies, the inactive one first; readers see it once this
    /// returns (some already during the call). `change` must do the same to both
    /// copies; the first call's result is returned.
    pub fn apply<R>(&mut self, mut change: impl FnMut(&mut T) -> R) -> R {
        let old = self.cell.active.load(Ordering::Acquire);
        let new = 1 - old;
        let result = {
            let mut copy = self.cell.copies[new]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            change(&mut copy)
        };
        self.cell.active.store(new, Ordering::Release);
        {
            // Waits only for readers that took the old copy before the switch.
            let mut copy = self.cell.copies[old]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            change(&mut copy);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A reader gets an answer while a writer is stopped in the middle of a change,
    /// and sees the change once the write returns.
    #[test]
    fn readers_never_wait_for_a_writer() {
        let cell = Arc::new(DoubleBuffered::new(1u64));
        let (inside_tx, inside_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let writer = {
            let cell = cell.clone();
            std::thread::spawn(move || {
                let mut first = true;
                cell.writer().apply(|v| {
                    if first {
                        first = false;
                        inside_tx.send(()).unwrap();
                        release_rx.recv().unwrap();
                    }
                    *v += 1;
                })
            })
        };
        inside_rx.recv().unwrap();
        // The writer holds the inactive copy's lock and waits: a read must not block.
        let (got_tx, got_rx) = mpsc::channel();
        {
            let cell = cell.clone();
            std::thread::spawn(move || got_tx.send(*cell.read()).unwrap());
        }
        let seen = got_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a reader waited for the writer");
        assert_eq!(seen, 1);
        release_tx.send(()).unwrap();
        writer.join().unwrap();
        assert_eq!(*cell.read(), 2);
        // Both copies changed: the next write starts from 2 on either side.
        cell.writer().apply(|v| *v *= 10);
        assert_eq!(*cell.read(), 20);
        cell.writer().apply(|v| *v += 1);
        assert_eq!(*cell.read(), 21);
    }

    /// A reader holding the old copy delays the writer's second half, not other readers.
    #[test]
    fn a_slow_reader_delays_only_the_writer() {
        let cell = Arc::new(DoubleBuffered::new(0u64));
        let slow = cell.read();
        let writer = {
            let cell = cell.clone();
            std::thread::spawn(move || cell.writer().apply(|v| *v += 1))
        };
        // The new value becomes readable while the slow reader still holds the old one.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while *cell.read() != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the change never became visible"
            );
            std::thread::yield_now();
        }
        assert_eq!(*slow, 0);
        // Its second half waits for the slow reader, however long.
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !writer.is_finished(),
            "the writer changed a copy that was being read"
        );
        drop(slow);
        writer.join().unwrap();
        assert_eq!(*cell.read(), 1);
    }
}

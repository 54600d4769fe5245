//! Weights in memory backed by transparent huge pages, where the OS offers them.
//!
//! A decoding step streams every weight once: about 110 MiB for the default model. With
//! 4 KiB pages that is some 28,000 TLB misses per step, each a page-table walk the
//! hardware prefetchers do not hide; with 2 MiB pages it is about 60. Linux gives huge
//! pages to anonymous memory only when asked (`madvise(MADV_HUGEPAGE)`) under the
//! common `transparent_hugepage=madvise` setting (Debian's and Ubuntu's default), and a
//! `Vec` is never asked. On this project's 2-core machine a one-row pass of the default
//! model takes about 10% less time (docs/cpu-kernels.md, "Huge pages").
//!
//! Buffers are copied, once at load, into shared chunks of anonymous memory aligned to
//! 2 MiB and advised for huge pages: a model's ~200 matrices mostly measure a few
//! hundred KiB, far below one huge page each, so they share chunks. A chunk is freed with
//! the last buffer in it. Where the mapping fails, or on other systems, a buffer stays on
//! the heap: the bytes and the kernels' results are the same either way.

use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// The huge page size the chunks align to (x86_64 and aarch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;
/// Bytes of one shared chunk. A buffer over a quarter of this gets a mapping of its own.
const CHUNK: usize = 32 << 20;
/// Alignment of each buffer inside a chunk: a cache line, so that the kernels' vector
/// loads of a column never straddle one more line than they must.
const ALIGN: usize = 64;

/// Element types that may live in a [`HugeSlice`]: plain numbers with no padding and no
/// drop, so their bytes can be copied into raw memory. Sealed: only these three.
pub trait Plain: sealed::Sealed + Copy + Send + Sync + 'static {}
impl Plain for u8 {}
impl Plain for i8 {}
impl Plain for u16 {}
impl Plain for f32 {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for i8 {}
    impl Sealed for u16 {}
    impl Sealed for f32 {}
}

/// An immutable slice of weights, in a huge-page chunk or (as a fallback) on the heap.
pub struct HugeSlice<T: Plain> {
    storage: Storage<T>,
}

enum Storage<T> {
    Heap(Box<[T]>),
    /// `len` values at byte `offset` of `chunk`, written once before this was made.
    Mapped {
        chunk: Arc<Chunk>,
        offset: usize,
        len: usize,
    },
}

impl<T: Plain> HugeSlice<T> {
    /// The values, copied into huge-page memory where that can be had.
    pub fn copy_of(values: &[T]) -> Self {
        let bytes = std::mem::size_of_val(values);
        if bytes == 0 || !cfg!(target_os = "linux") || !wanted() {
            return Self::heap(values);
        }
        match place(bytes) {
            Some((chunk, offset)) => {
                // SAFETY: `place` reserved `bytes` at `offset` of the chunk for this buffer
                // alone, inside the mapping, aligned to ALIGN (≥ T's alignment); nothing
                // reads them before this write, and they are never written again.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        values.as_ptr().cast::<u8>(),
                        chunk.base.as_ptr().add(offset),
                        bytes,
                    );
                }
                HugeSlice {
                    storage: Storage::Mapped {
                        chunk,
                        offset,
                        len: values.len(),
                    },
                }
            }
            None => Self::heap(values),
        }
    }

    fn heap(values: &[T]) -> Self {
        HugeSlice {
            storage: Storage::Heap(values.into()),
        }
    }

    /// True when the values live in a huge-page chunk (for tests and the curious).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }
}

impl<T: Plain> Deref for HugeSlice<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.storage {
            Storage::Heap(values) => values,
            // SAFETY: the chunk lives as long as `self` (the Arc), the range was written
            // whole in `copy_of` and is never written again, and it is aligned for T.
            Storage::Mapped { chunk, offset, len } => unsafe {
                std::slice::from_raw_parts(chunk.base.as_ptr().add(*offset).cast::<T>(), *len)
            },
        }
    }
}

impl<T: Plain> Clone for HugeSlice<T> {
    fn clone(&self) -> Self {
        HugeSlice {
            storage: match &self.storage {
                Storage::Heap(values) => Storage::Heap(values.clone()),
                Storage::Mapped { chunk, offset, len } => Storage::Mapped {
                    chunk: Arc::clone(chunk),
                    offset: *offset,
                    len: *len,
                },
            },
        }
    }
}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for HugeSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugeSlice")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl<T: Plain> From<Vec<T>> for HugeSlice<T> {
    fn from(values: Vec<T>) -> Self {
        Self::copy_of(&values)
    }
}

/// One anonymous mapping, 2 MiB aligned at `base`, advised for huge pages.
struct Chunk {
    /// Kept for its Drop (the unmapping).
    _map: memmap2::MmapMut,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a chunk's bytes are written only through `copy_of`, each range once, by the
// thread that reserved it under the arena's lock, before any reader can see the range;
// afterwards they are only read.
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl Chunk {
    /// At least `len` bytes, or None where the system will not map them.
    fn map(len: usize) -> Option<Chunk> {
        let len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        // Map one huge page more, to start at a 2 MiB boundary wherever the mapping lands.
        let mut map = memmap2::MmapOptions::new()
            .len(len + HUGE_PAGE)
            .map_anon()
            .ok()?;
        let start = map.as_ptr() as usize;
        let skip = start.next_multiple_of(HUGE_PAGE) - start;
        #[cfg(target_os = "linux")]
        {
            // Advice, not a demand: where huge pages are off, this fails or does nothing,
            // and 4 KiB pages serve as before.
            let _ = map.advise_range(memmap2::Advice::HugePage, skip, len);
        }
        // SAFETY: `skip < HUGE_PAGE`, so `skip + len` lies inside the mapping.
        let base = NonNull::new(unsafe { map.as_mut_ptr().add(skip) })?;
        Some(Chunk {
            _map: map,
            base,
            len,
        })
    }
}

/// False when `SUFFIXD_HUGEPAGES=off` (or `0`) asks for the heap: for comparisons, and
/// for hosts where huge pages are known to hurt (a memory-starved machine compacting).
fn wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| {
        !matches!(
            std::env::var("SUFFIXD_HUGEPAGES").as_deref(),
            Ok("off" | "0" | "false" | "no")
        )
    })
}

/// The chunk small buffers are being placed in, and its first free byte.
static OPEN_CHUNK: Mutex<Option<(Arc<Chunk>, usize)>> = Mutex::new(None);

/// Reserve `bytes` (ALIGN-aligned) in a chunk: the open one, a new shared one, or, for a
/// large buffer, a mapping of its own.
fn place(bytes: usize) -> Option<(Arc<Chunk>, usize)> {
    if bytes > CHUNK / 4 {
        return Some((Arc::new(Chunk::map(bytes)?), 0));
    }
    let mut open = OPEN_CHUNK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((chunk, used)) = open.as_mut() {
        let offset = used.next_multiple_of(ALIGN);
        if offset + bytes <= chunk.len {
            *used = offset + bytes;
            return Some((Arc::clone(chunk), offset));
        }
    }
    let chunk = Arc::new(Chunk::map(CHUNK)?);
    *open = Some((Arc::clone(&chunk), bytes));
    Some((chunk, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_reads_back_the_same_values_whatever_its_size() {
        // Small buffers share a chunk, a large one gets its own mapping; both read back
        // exactly what went in, aligned for their type.
        for n in [1usize, 3, 1000, 100_000, 3 << 20] {
            let floats: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
            let bytes: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            let (f, b) = (HugeSlice::copy_of(&floats), HugeSlice::copy_of(&bytes));
            assert_eq!(&*f, floats.as_slice());
            assert_eq!(&*b, bytes.as_slice());
            assert_eq!(f.as_ptr() as usize % ALIGN, 0, "{n} floats aligned");
            if cfg!(target_os = "linux") {
                assert!(f.is_mapped() && b.is_mapped(), "{n}: mapped on Linux");
            }
            let copy = f.clone();
            drop(f);
            assert_eq!(&*copy, floats.as_slice(), "a clone outlives its original");
        }
        assert!(HugeSlice::<f32>::copy_of(&[]).is_empty());
    }

    #[test]
    fn buffers_placed_side_by_side_do_not_overlap() {
        let slices: Vec<HugeSlice<u8>> = (0..200u8)
            .map(|i| HugeSlice::copy_of(&vec![i; 1 + i as usize * 997]))
            .collect();
        for (i, s) in slices.iter().enumerate() {
            assert!(s.iter().all(|&v| v == i as u8), "buffer {i} intact");
        }
    }
}

//! A speculation call for a path draft (the default shape) does not allocate, the first
//! one included: its scratch space is reserved when the `Speculator` is built (growing
//! it had cost the first call of a process 97 reallocations and about half its time).
//! Counted with a global allocator that counts this thread's allocations while a call
//! runs. Tree drafts (`tree: true`) still allocate their best-first heap per draft: its
//! items hold the cursor type of each tree, so one buffer cannot serve all three.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use suffixd::speculate::{SpecParams, Speculator};
use suffixd::tree::{GlobalTree, RequestTree};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by this thread while `f` runs.
fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn speculation_calls_do_not_allocate() {
    // A global tree of a few responses that share phrases, and a request whose prompt
    // quotes one of them and whose reply goes on with another: both trees draft.
    let responses: Vec<Vec<u32>> = (0..40u32)
        .map(|i| {
            (0..60u32)
                .map(|j| (i * 7 + j * 13) % 50 + (j % 3))
                .collect()
        })
        .collect();
    let mut global = GlobalTree::new(24).unwrap();
    for (i, r) in responses.iter().enumerate() {
        global.insert(i as u64, r).unwrap();
    }
    let prompt: Vec<u32> = (100..400u32)
        .chain(responses[3][..30].iter().copied())
        .collect();
    let reply = &responses[5][..40];
    for params in [
        SpecParams::default(),
        SpecParams {
            mode: suffixd::speculate::SpecMode::Paper,
            ..SpecParams::default()
        },
    ] {
        let mut request = RequestTree::new(&prompt, params.request_depth());
        let mut context = prompt.clone();
        let mut speculator = Speculator::new();
        for (step, &next) in reply.iter().enumerate() {
            let mut drafted = 0;
            let n = allocations_in(|| {
                drafted = speculator
                    .speculate_in_place(Some(&request), &global, &context, &params)
                    .len();
            });
            assert_eq!(n, 0, "call {step} ({:?}) allocated {n} times", params.mode);
            assert!(
                step > 0 || drafted > 0,
                "the first call drafts from the prompt"
            );
            request.extend(&[next]);
            context.push(next);
        }
    }
}

//! The requests waiting for a slot in the batch, taken in turn by namespace: a tenant
//! with many requests waiting does not hold back one with a single request, which
//! first-come-first-served would put behind all of them. Within a namespace the order
//! is arrival's; with one namespace this is first-come-first-served.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Items waiting, by namespace, each namespace's oldest first; namespaces take turns.
pub struct FairQueue<T> {
    /// The namespaces with items waiting, the one whose turn is next first.
    turns: VecDeque<(String, VecDeque<T>)>,
    len: usize,
    /// How many are waiting, for the handlers (`--max-queued`, `/metrics`).
    published: Arc<AtomicUsize>,
}

impl<T> FairQueue<T> {
    /// An empty queue that keeps `published` at its length.
    pub fn new(published: Arc<AtomicUsize>) -> Self {
        published.store(0, Ordering::Relaxed);
        FairQueue {
            turns: VecDeque::new(),
            len: 0,
            published,
        }
    }

    /// Queue `item` of `namespace` behind that namespace's others. A namespace new to
    /// the queue takes its turn after those already waiting.
    pub fn push(&mut self, namespace: &str, item: T) {
        match self.turns.iter_mut().find(|(ns, _)| ns == namespace) {
            Some((_, items)) => items.push_back(item),
            None => self
                .turns
                .push_back((namespace.to_string(), VecDeque::from([item]))),
        }
        self.len += 1;
        self.published.store(self.len, Ordering::Relaxed);
    }

    /// The oldest item of the namespace whose turn it is; that namespace's next turn
    /// comes after every other namespace waiting.
    pub fn pop(&mut self) -> Option<T> {
        let (namespace, mut items) = self.turns.pop_front()?;
        let item = items.pop_front();
        if !items.is_empty() {
            self.turns.push_back((namespace, items));
        }
        self.len -= usize::from(item.is_some());
        self.published.store(self.len, Ordering::Relaxed);
        item
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How many requests each namespace has waiting for the model thread, for the handlers'
/// admission: a full queue still takes a request from a namespace holding less than its
/// share of it, so one tenant filling the queue does not lock the others out.
#[derive(Debug, Default)]
pub struct WaitingCounts {
    by_namespace: Mutex<HashMap<String, usize>>,
}

impl WaitingCounts {
    /// Count one more request of `namespace` until the ticket is dropped (when its job
    /// gets a slot in the batch, or is dropped unserved).
    pub fn ticket(self: &Arc<Self>, namespace: &str) -> WaitingTicket {
        *self.counts().entry(namespace.to_string()).or_default() += 1;
        WaitingTicket {
            counts: Arc::clone(self),
            namespace: namespace.to_string(),
        }
    }

    /// How many `namespace` has waiting, and how many namespaces would share the queue
    /// with one more request of it (those waiting, and it).
    pub fn share_of(&self, namespace: &str) -> (usize, usize) {
        let counts = self.counts();
        let mine = counts.get(namespace).copied().unwrap_or(0);
        (mine, counts.len() + usize::from(mine == 0))
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        // A count is whole after every statement: a panic elsewhere leaves it usable.
        self.by_namespace
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One waiting request's place in [`WaitingCounts`], given back when dropped.
#[derive(Debug)]
pub struct WaitingTicket {
    counts: Arc<WaitingCounts>,
    namespace: String,
}

impl Drop for WaitingTicket {
    fn drop(&mut self) {
        let mut counts = self.counts.counts();
        if let Some(n) = counts.get_mut(&self.namespace) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_take_turns_and_each_keeps_its_order() {
        let waiting = Arc::new(AtomicUsize::new(7));
        let mut queue = FairQueue::new(waiting.clone());
        assert_eq!(waiting.load(Ordering::Relaxed), 0);
        for i in 0..4 {
            queue.push("busy", format!("busy{i}"));
        }
        queue.push("quiet", "quiet0".to_string());
        queue.push("third", "third0".to_string());
        assert_eq!(waiting.load(Ordering::Relaxed), 6);
        let mut order = vec![queue.pop().unwrap(), queue.pop().unwrap()];
        // Arriving now, busy's fifth waits behind its others.
        queue.push("busy", "busy4".to_string());
        queue.push("quiet", "quiet1".to_string());
        while let Some(item) = queue.pop() {
            order.push(item);
        }
        assert_eq!(
            order,
            [
                "busy0", "quiet0", "third0", "busy1", "quiet1", "busy2", "busy3", "busy4"
            ]
        );
        assert!(queue.is_empty());
        assert_eq!(waiting.load(Ordering::Relaxed), 0);
        assert_eq!(queue.pop(), None);
    }

    #[test]
    fn tickets_count_each_namespace_until_dropped() {
        let counts = Arc::new(WaitingCounts::default());
        assert_eq!(counts.share_of("busy"), (0, 1));
        let busy: Vec<_> = (0..3).map(|_| counts.ticket("busy")).collect();
        assert_eq!(counts.share_of("busy"), (3, 1));
        // A namespace with nothing waiting would be the second to share the queue.
        assert_eq!(counts.share_of("quiet"), (0, 2));
        let quiet = counts.ticket("quiet");
        assert_eq!(counts.share_of("quiet"), (1, 2));
        drop(busy);
        assert_eq!(counts.share_of("busy"), (0, 2));
        drop(quiet);
        assert_eq!(counts.share_of("quiet"), (0, 1));
        assert!(
            counts.counts().is_empty(),
            "namespaces with nothing waiting are forgotten"
        );
    }

    #[test]
    fn one_namespace_is_first_come_first_served() {
        let mut queue = FairQueue::new(Arc::default());
        for i in 0..5 {
            queue.push("default", i);
        }
        let order: Vec<i32> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }
}

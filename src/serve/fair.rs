//! The requests waiting for a slot in the batch, taken in turn by namespace: a tenant
//! with many requests waiting does not hold back one with a single request, which
//! first-come-first-served would put behind all of them. Within a namespace the order
//! is arrival's; with one namespace this is first-come-first-served.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    fn one_namespace_is_first_come_first_served() {
        let mut queue = FairQueue::new(Arc::default());
        for i in 0..5 {
            queue.push("default", i);
        }
        let order: Vec<i32> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }
}

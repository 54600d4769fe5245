//! The prefix KV cache: the keys and values that earlier requests computed for their
//! prompts (and answers), kept so that a later request that starts with the same tokens
//! copies them instead of running prefill again.
//!
//! - **Blocks.** Contexts are cut into blocks of [`BLOCK_TOKENS`] tokens. A block is
//!   keyed by its parent block and its own tokens, so a key names the whole prefix up to
//!   its end (a radix tree at block granularity, as vLLM keys its blocks). A request
//!   reuses the longest chain of whole blocks that its prompt starts with; the tokens
//!   after it, at most a block's worth more than an exact match would leave, are
//!   prefilled as before.
//! - **Exact.** The CPU kernels are row-invariant: a position's keys and values are the
//!   same bits whether its prompt was prefilled alone, in chunks, beside other requests,
//!   or verified as part of a draft. So a restored prefix is exactly what prefill would
//!   have computed, and greedy output with the cache equals output without it (tested in
//!   tests/verify.rs). suffixd's GPU kernels keep the same rule, so there the blocks
//!   stay on the device beside the sequences' caches; on candle's GPU operations (not
//!   exact) the cache stays off.
//! - **Tenants.** Chains start at a namespace: a request sees only the prefixes of its
//!   own namespace. Otherwise the time to first token would tell one tenant whether
//!   another had sent a prompt (vLLM's `cache_salt` discussion).
//! - **Budget.** The blocks' keys and values stay within a byte budget. When a new block
//!   does not fit, the least recently used leaf block is evicted (a leaf: no cached block
//!   continues it, so every cached chain stays whole) and its memory is reused for the
//!   new block. A block is a [`KvBlock`]: on the host an anonymous mapping of its own,
//!   outside the heap; on a GPU device memory, copied in and out by one kernel launch.
//!   Restored prefixes are copies, so a request never holds a block: evicting one in the
//!   middle of a request's life changes nothing for it.
//! - **Shares.** Optionally each namespace is guaranteed a share of the budget
//!   ([`PrefixCache::set_namespace_share`]): another namespace's insert evicts only
//!   leaves of namespaces holding more than their share (or its own), so one tenant's
//!   traffic cannot push another's cached prompts below it. The share is a floor, not a
//!   cap: a namespace alone may fill the whole budget.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::model::forward::{KvBlock, KvCache};

/// Tokens per cached block.
pub const BLOCK_TOKENS: usize = 16;

/// Bookkeeping bytes per block beyond its keys and values (its node, its key in the
/// map, its place in the eviction order), counted against the budget.
const BLOCK_OVERHEAD_BYTES: u64 = 256;

/// What a block continues: the start of a namespace, or another block.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Parent {
    Namespace(Arc<str>),
    Block(u64),
}

/// A block's key: what it continues, and its tokens.
#[derive(Clone, PartialEq, Eq, Hash)]
struct BlockKey {
    parent: Parent,
    tokens: [u32; BLOCK_TOKENS],
}

/// One cached block.
struct Block {
    key: BlockKey,
    /// The namespace its chain starts at.
    namespace: Arc<str>,
    /// Cached blocks that continue this one.
    children: u32,
    /// When it was last restored or offered (the cache's clock).
    last_used: u64,
    /// Its keys and values, where the sequences' caches are (host or device).
    kv: KvBlock,
}

/// The cache's counters, for `/metrics` and `/admin/stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PrefixCacheStats {
    /// Requests that looked for a cached prefix.
    pub lookups: u64,
    /// Lookups that found at least one block.
    pub hits: u64,
    /// Prompt tokens the lookups could have reused (all but each prompt's last).
    pub tokens_looked_up: u64,
    /// Prompt tokens restored from the cache instead of prefilled.
    pub tokens_reused: u64,
    /// Blocks added.
    pub blocks_inserted: u64,
    /// Blocks evicted for room.
    pub blocks_evicted: u64,
    /// Blocks held now.
    pub blocks: u64,
    /// Bytes held now (keys, values and bookkeeping).
    pub bytes: u64,
    /// The byte budget (0: the cache is off).
    pub budget_bytes: u64,
    /// Bytes of the budget each namespace keeps whatever the others insert (0: none).
    pub namespace_share_bytes: u64,
    /// Namespaces holding blocks now.
    pub namespaces: u64,
}

/// Cached prompt prefixes' keys and values, by namespace (see the module docs).
pub struct PrefixCache {
    layers: usize,
    /// Floats per position in one layer's keys (and in its values).
    row: usize,
    budget_bytes: u64,
    index: HashMap<BlockKey, u64>,
    blocks: HashMap<u64, Block>,
    /// Blocks no cached block continues, oldest first: the eviction candidates.
    leaves: BTreeSet<(u64, u64)>,
    /// Blocks held per namespace.
    held: HashMap<Arc<str>, u64>,
    /// Blocks each namespace keeps against the others' inserts (0: no shares).
    share_blocks: u64,
    /// The share as a fraction of the budget, for budgets set later.
    share: f64,
    next_id: u64,
    clock: u64,
    stats: PrefixCacheStats,
}

impl PrefixCache {
    /// An empty cache for a model of `layers` layers with `row` floats per position in
    /// each layer's keys, holding at most `budget_bytes` (0 turns it off).
    pub fn new(layers: usize, row: usize, budget_bytes: u64) -> Self {
        PrefixCache {
            layers,
            row,
            budget_bytes,
            index: HashMap::new(),
            blocks: HashMap::new(),
            leaves: BTreeSet::new(),
            held: HashMap::new(),
            share_blocks: 0,
            share: 0.0,
            next_id: 0,
            clock: 0,
            stats: PrefixCacheStats {
                budget_bytes,
                ..PrefixCacheStats::default()
            },
        }
    }

    /// Bytes one block costs against the budget.
    pub fn block_bytes(&self) -> u64 {
        (self.layers * 2 * BLOCK_TOKENS * self.row * std::mem::size_of::<f32>()) as u64
            + BLOCK_OVERHEAD_BYTES
    }

    /// Bytes of keys and values one cached token holds.
    pub fn bytes_per_token(&self) -> u64 {
        (self.layers * 2 * self.row * std::mem::size_of::<f32>()) as u64
    }

    /// True when the budget holds at least one block.
    pub fn is_enabled(&self) -> bool {
        self.budget_bytes >= self.block_bytes()
    }

    /// Change the budget, evicting what no longer fits (shares do not protect blocks
    /// from a smaller budget).
    pub fn set_budget(&mut self, budget_bytes: u64) {
        self.budget_bytes = budget_bytes;
        self.stats.budget_bytes = budget_bytes;
        while self.held_bytes() > budget_bytes {
            if self.evict_oldest_leaf().is_none() {
                break;
            }
        }
        self.set_namespace_share(self.share);
    }

    /// Guarantee each namespace `share` (0 to 1) of the budget: another namespace's
    /// insert never evicts its blocks while it holds no more than that. 0 turns shares
    /// off (plain LRU over all namespaces).
    pub fn set_namespace_share(&mut self, share: f64) {
        self.share = share.clamp(0.0, 1.0);
        // Whole blocks; the epsilon keeps 10 × 0.3 at 3 under float rounding.
        let budget_blocks = self.budget_bytes / self.block_bytes();
        self.share_blocks = (budget_blocks as f64 * self.share + 1e-9).floor() as u64;
        self.stats.namespace_share_bytes = self.share_blocks * self.block_bytes();
    }

    /// The counters.
    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            blocks: self.blocks.len() as u64,
            bytes: self.held_bytes(),
            namespaces: self.held.len() as u64,
            ..self.stats
        }
    }

    fn held_bytes(&self) -> u64 {
        self.blocks.len() as u64 * self.block_bytes()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The longest cached prefix of `tokens` in `namespace`, in whole blocks, copied
    /// into `cache` (empty, on the host). Returns the tokens restored, a multiple of
    /// [`BLOCK_TOKENS`]. `tokens` is what prefill would run: the prompt but its last token.
    pub fn restore(&mut self, namespace: &str, tokens: &[u32], cache: &mut KvCache) -> usize {
        if !self.is_enabled() || !cache.is_empty() {
            return 0;
        }
        self.stats.lookups += 1;
        self.stats.tokens_looked_up += tokens.len() as u64;
        let mut path = Vec::new();
        let mut parent = Parent::Namespace(namespace.into());
        for chunk in tokens.chunks_exact(BLOCK_TOKENS) {
            let key = BlockKey {
                parent,
                tokens: chunk.try_into().expect("a whole block"),
            };
            let Some(&id) = self.index.get(&key) else {
                break;
            };
            path.push(id);
            parent = Parent::Block(id);
        }
        if path.is_empty() {
            return 0;
        }
        let now = self.tick();
        for &id in &path {
            self.touch(id, now);
        }
        let n = path.len() * BLOCK_TOKENS;
        let blocks: Vec<&KvBlock> = path.iter().map(|id| &self.blocks[id].kv).collect();
        if let Err(e) = cache.extend_from_blocks(&blocks) {
            tracing::warn!("{e}: the prompt is prefilled instead");
            return 0;
        }
        self.stats.hits += 1;
        self.stats.tokens_reused += n as u64;
        n
    }

    /// Offer the committed keys and values of `cache` for `tokens` (the tokens of its
    /// first `tokens.len()` positions) to `namespace`: the whole blocks not yet cached
    /// are copied in, evicting the least recently used leaves for room; those already
    /// cached count as used. Returns the blocks added.
    pub fn insert(&mut self, namespace: &str, tokens: &[u32], cache: &KvCache) -> usize {
        if !self.is_enabled() {
            return 0;
        }
        let tokens = &tokens[..tokens.len().min(cache.len())];
        let now = self.tick();
        let namespace: Arc<str> = namespace.into();
        let mut parent = Parent::Namespace(namespace.clone());
        let mut added = 0;
        for (b, chunk) in tokens.chunks_exact(BLOCK_TOKENS).enumerate() {
            let key = BlockKey {
                parent: parent.clone(),
                tokens: chunk.try_into().expect("a whole block"),
            };
            if let Some(&id) = self.index.get(&key) {
                self.touch(id, now);
                parent = Parent::Block(id);
                continue;
            }
            // Its parent gets a child first, so that making room never evicts the
            // chain being extended.
            if let Parent::Block(p) = &parent {
                self.adopt(*p);
            }
            let kv = self
                .make_room(&namespace)
                .and_then(|reuse| cache.save_block(b * BLOCK_TOKENS, BLOCK_TOKENS, reuse));
            let Some(kv) = kv else {
                if let Parent::Block(p) = &parent {
                    self.disown(*p);
                }
                break;
            };
            let id = self.next_id;
            self.next_id += 1;
            self.index.insert(key.clone(), id);
            *self.held.entry(namespace.clone()).or_default() += 1;
            self.blocks.insert(
                id,
                Block {
                    key,
                    namespace: namespace.clone(),
                    children: 0,
                    last_used: now,
                    kv,
                },
            );
            self.leaves.insert((now, id));
            self.stats.blocks_inserted += 1;
            added += 1;
            parent = Parent::Block(id);
        }
        added
    }

    /// Mark block `id` used at `now`.
    fn touch(&mut self, id: u64, now: u64) {
        let block = self.blocks.get_mut(&id).expect("an indexed block exists");
        if block.children == 0 {
            self.leaves.remove(&(block.last_used, id));
            self.leaves.insert((now, id));
        }
        block.last_used = now;
    }

    /// Block `id` gets a child: it is no longer a leaf.
    fn adopt(&mut self, id: u64) {
        let block = self.blocks.get_mut(&id).expect("a parent block exists");
        if block.children == 0 {
            self.leaves.remove(&(block.last_used, id));
        }
        block.children += 1;
    }

    /// Block `id` loses a child: with none left, it is a leaf again.
    fn disown(&mut self, id: u64) {
        let block = self.blocks.get_mut(&id).expect("a parent block exists");
        block.children -= 1;
        if block.children == 0 {
            self.leaves.insert((block.last_used, id));
        }
    }

    /// Room for one more block of `namespace` within the budget, evicting the least
    /// recently used leaves `namespace` may evict: `Some` with the last one evicted, for
    /// its memory to be reused (`Some(None)`: none had to go), `None` when nothing can be
    /// evicted.
    fn make_room(&mut self, namespace: &Arc<str>) -> Option<Option<KvBlock>> {
        let mut reused = None;
        while self.held_bytes() + self.block_bytes() > self.budget_bytes {
            let victim = if self.share_blocks == 0 {
                self.leaves.first().copied()
            } else {
                self.oldest_leaf_evictable_by(namespace)
            };
            reused = Some(self.evict(victim?));
        }
        Some(reused)
    }

    /// The least recently used leaf that an insert into `namespace` may evict: its own,
    /// or one of a namespace holding more than its share.
    fn oldest_leaf_evictable_by(&self, namespace: &Arc<str>) -> Option<(u64, u64)> {
        self.leaves.iter().copied().find(|(_, id)| {
            let owner = &self.blocks[id].namespace;
            owner == namespace || self.held.get(owner).copied().unwrap_or(0) > self.share_blocks
        })
    }

    /// Evict the least recently used leaf; returns its memory.
    fn evict_oldest_leaf(&mut self) -> Option<KvBlock> {
        let leaf = self.leaves.first().copied()?;
        Some(self.evict(leaf))
    }

    /// Evict leaf `(last_used, id)`; returns its memory.
    fn evict(&mut self, leaf: (u64, u64)) -> KvBlock {
        self.leaves.remove(&leaf);
        let block = self.blocks.remove(&leaf.1).expect("a leaf is a block");
        self.index.remove(&block.key);
        if let Parent::Block(p) = block.key.parent {
            self.disown(p);
        }
        if let Some(held) = self.held.get_mut(&block.namespace) {
            *held -= 1;
            if *held == 0 {
                self.held.remove(&block.namespace);
            }
        }
        self.stats.blocks_evicted += 1;
        block.kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYERS: usize = 2;
    const ROW: usize = 3;

    /// A host cache holding `tokens`, where position p of layer l has keys
    /// `token × 1000 + l` and values their negation: distinct and easy to check.
    fn cache_of(tokens: &[u32]) -> KvCache {
        let mut cache = KvCache::default();
        cache.extend_committed(LAYERS, ROW, tokens.len(), |l, keys, values| {
            for (p, &t) in tokens.iter().enumerate() {
                for x in 0..ROW {
                    keys[p * ROW + x] = (t * 1000 + l as u32) as f32;
                    values[p * ROW + x] = -keys[p * ROW + x];
                }
            }
        });
        cache
    }

    /// The tokens a cache's positions were made from (see `cache_of`), checked in every
    /// layer.
    fn tokens_in(cache: &KvCache) -> Vec<u32> {
        (0..cache.len())
            .map(|p| {
                let token = cache.committed_rows(0, p, 1).unwrap().0[0] as u32 / 1000;
                for l in 0..LAYERS {
                    let (k, v) = cache.committed_rows(l, p, 1).unwrap();
                    assert!(k.iter().all(|&x| x == (token * 1000 + l as u32) as f32));
                    assert!(v.iter().zip(k).all(|(v, k)| *v == -*k));
                }
                token
            })
            .collect()
    }

    fn blocks_budget(cache: &PrefixCache, blocks: u64) -> u64 {
        blocks * cache.block_bytes()
    }

    #[test]
    fn a_prompt_reuses_the_longest_cached_run_of_whole_blocks() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, u64::MAX);
        let first: Vec<u32> = (1..=40).collect();
        assert_eq!(prefix.insert("a", &first, &cache_of(&first)), 2);
        // Same first 20 tokens, then different.
        let mut second: Vec<u32> = (1..=20).collect();
        second.extend(500..530);
        let mut restored = KvCache::default();
        assert_eq!(prefix.restore("a", &second, &mut restored), 16);
        assert_eq!(tokens_in(&restored), (1..=16).collect::<Vec<_>>());
        // The whole first prompt: both blocks.
        let mut again = KvCache::default();
        assert_eq!(prefix.restore("a", &first, &mut again), 32);
        assert_eq!(tokens_in(&again), (1..=32).collect::<Vec<_>>());
        let s = prefix.stats();
        assert_eq!((s.lookups, s.hits, s.tokens_reused), (2, 2, 48));
        assert_eq!(s.blocks, 2);
    }

    #[test]
    fn namespaces_never_see_each_others_prefixes() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, u64::MAX);
        let tokens: Vec<u32> = (1..=32).collect();
        prefix.insert("tenant-a", &tokens, &cache_of(&tokens));
        let mut cache = KvCache::default();
        assert_eq!(prefix.restore("tenant-b", &tokens, &mut cache), 0);
        assert!(cache.is_empty());
        assert_eq!(prefix.restore("tenant-a", &tokens, &mut cache), 32);
        // The same tokens offered by b make b's own copy.
        assert_eq!(prefix.insert("tenant-b", &tokens, &cache_of(&tokens)), 2);
        assert_eq!(prefix.stats().blocks, 4);
    }

    #[test]
    fn the_least_recently_used_leaf_goes_first_and_chains_stay_whole() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, 0);
        prefix.set_budget(blocks_budget(&prefix, 4));
        let a: Vec<u32> = (1..=48).collect(); // three blocks
        let b: Vec<u32> = (100..116).collect(); // one block
        prefix.insert("n", &a, &cache_of(&a));
        prefix.insert("n", &b, &cache_of(&b));
        // Use a's first block again: its chain's leaf (block 3) stays the oldest.
        let mut c = KvCache::default();
        assert_eq!(prefix.restore("n", &a[..16], &mut c), 16);
        // A new block must evict a's last block, the oldest leaf; then a's second.
        let d: Vec<u32> = (200..232).collect();
        assert_eq!(prefix.insert("n", &d, &cache_of(&d)), 2);
        let s = prefix.stats();
        assert_eq!((s.blocks, s.blocks_evicted), (4, 2));
        assert!(s.bytes <= s.budget_bytes);
        let mut c = KvCache::default();
        assert_eq!(
            prefix.restore("n", &a, &mut c),
            16,
            "a keeps its first block"
        );
        assert_eq!(tokens_in(&c), (1..=16).collect::<Vec<_>>());
        let mut c = KvCache::default();
        assert_eq!(
            prefix.restore("n", &b, &mut c),
            16,
            "b was used after a's tail"
        );
        let mut c = KvCache::default();
        assert_eq!(prefix.restore("n", &d, &mut c), 32);
        assert_eq!(tokens_in(&c), (200..232).collect::<Vec<_>>());
    }

    #[test]
    fn a_chain_longer_than_the_budget_keeps_its_beginning() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, 0);
        prefix.set_budget(blocks_budget(&prefix, 2));
        let long: Vec<u32> = (1..=80).collect(); // five blocks
        assert_eq!(prefix.insert("n", &long, &cache_of(&long)), 2);
        let mut c = KvCache::default();
        assert_eq!(prefix.restore("n", &long, &mut c), 32);
        assert_eq!(tokens_in(&c), (1..=32).collect::<Vec<_>>());
        assert_eq!(prefix.stats().blocks_evicted, 0);
    }

    #[test]
    fn a_restored_prefix_survives_the_eviction_of_its_blocks() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, 0);
        prefix.set_budget(blocks_budget(&prefix, 2));
        let a: Vec<u32> = (1..=32).collect();
        prefix.insert("n", &a, &cache_of(&a));
        let mut in_flight = KvCache::default();
        assert_eq!(prefix.restore("n", &a, &mut in_flight), 32);
        // Another request's blocks take all the room while this one runs.
        let b: Vec<u32> = (300..332).collect();
        assert_eq!(prefix.insert("n", &b, &cache_of(&b)), 2);
        let mut c = KvCache::default();
        assert_eq!(prefix.restore("n", &a, &mut c), 0, "a's blocks are gone");
        assert_eq!(tokens_in(&in_flight), a, "the copy it restored is intact");
    }

    #[test]
    fn shrinking_the_budget_evicts_and_zero_turns_it_off() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, u64::MAX);
        let a: Vec<u32> = (1..=64).collect();
        prefix.insert("n", &a, &cache_of(&a));
        prefix.set_budget(blocks_budget(&prefix, 1));
        assert_eq!(prefix.stats().blocks, 1);
        let mut c = KvCache::default();
        assert_eq!(prefix.restore("n", &a, &mut c), 16);
        prefix.set_budget(0);
        assert!(!prefix.is_enabled());
        assert_eq!(prefix.stats().blocks, 0);
        assert_eq!(prefix.insert("n", &a, &cache_of(&a)), 0);
    }

    proptest::proptest! {
        /// Under any mix of offers and lookups in two namespaces with a small budget:
        /// the cache stays within its budget, and a lookup restores exactly a prefix
        /// that was offered in its own namespace, in whole blocks.
        #[test]
        fn restores_are_offered_prefixes_and_the_budget_holds(
            ops in proptest::collection::vec(
                (proptest::bool::ANY, 0usize..2, proptest::collection::vec(0u32..3, 1..6), 0usize..4),
                1..60,
            ),
            budget_blocks in 0u64..8,
            share_blocks in 0u64..4,
        ) {
            let mut prefix = PrefixCache::new(LAYERS, ROW, 0);
            prefix.set_budget(blocks_budget(&prefix, budget_blocks));
            if budget_blocks > 0 {
                prefix.set_namespace_share(share_blocks as f64 / budget_blocks as f64);
            }
            let namespaces = ["a", "b"];
            let mut offered: Vec<(usize, Vec<u32>)> = Vec::new();
            for (offer, ns, blocks, extra) in ops {
                // Blocks drawn from a small alphabet, so prompts share prefixes often.
                let mut tokens: Vec<u32> = blocks
                    .iter()
                    .flat_map(|&b| (0..BLOCK_TOKENS as u32).map(move |i| 1 + b * 100 + i))
                    .collect();
                tokens.extend((0..extra as u32).map(|i| 900 + i));
                if offer {
                    // The other namespace's blocks, if within its share, stay whole.
                    let other = namespaces[1 - ns];
                    let before = prefix.held.get(other).copied().unwrap_or(0);
                    prefix.insert(namespaces[ns], &tokens, &cache_of(&tokens));
                    if before <= prefix.share_blocks {
                        proptest::prop_assert_eq!(
                            prefix.held.get(other).copied().unwrap_or(0),
                            before
                        );
                    }
                    offered.push((ns, tokens));
                } else {
                    let mut cache = KvCache::default();
                    let n = prefix.restore(namespaces[ns], &tokens, &mut cache);
                    proptest::prop_assert_eq!(n % BLOCK_TOKENS, 0);
                    proptest::prop_assert_eq!(tokens_in(&cache), tokens[..n].to_vec());
                    if n > 0 {
                        proptest::prop_assert!(offered
                            .iter()
                            .any(|(o, t)| *o == ns && t.len() >= n && t[..n] == tokens[..n]));
                    }
                }
                let s = prefix.stats();
                proptest::prop_assert!(s.bytes <= s.budget_bytes);
                proptest::prop_assert_eq!(s.blocks, prefix.index.len() as u64);
                proptest::prop_assert_eq!(prefix.held.values().sum::<u64>(), s.blocks);
            }
        }
    }

    #[test]
    fn a_namespace_keeps_its_share_while_another_floods_the_cache() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, 0);
        prefix.set_budget(blocks_budget(&prefix, 10));
        let quiet: Vec<u32> = (1..=48).collect();
        let flood = |prefix: &mut PrefixCache| {
            for i in 0..20u32 {
                let t: Vec<u32> = (0..16).map(|j| 1000 + 100 * i + j).collect();
                prefix.insert("busy", &t, &cache_of(&t));
            }
        };
        // Without shares, least recently used goes first: the quiet tenant's three
        // blocks are gone after twenty from the busy one.
        prefix.insert("quiet", &quiet, &cache_of(&quiet));
        flood(&mut prefix);
        assert_eq!(prefix.restore("quiet", &quiet, &mut KvCache::default()), 0);
        // With a 30% share (three blocks), they stay, and the busy tenant still fills
        // the rest.
        prefix.set_namespace_share(0.3);
        assert_eq!(
            prefix.stats().namespace_share_bytes,
            blocks_budget(&prefix, 3)
        );
        prefix.insert("quiet", &quiet, &cache_of(&quiet));
        flood(&mut prefix);
        let mut restored = KvCache::default();
        assert_eq!(prefix.restore("quiet", &quiet, &mut restored), 48);
        assert_eq!(tokens_in(&restored), quiet);
        let s = prefix.stats();
        assert_eq!((s.blocks, s.namespaces), (10, 2));
        // A share is a floor, not a cap: past it, the quiet tenant's blocks are fair game.
        let more: Vec<u32> = (2000..2080).collect();
        prefix.insert("quiet", &more, &cache_of(&more));
        flood(&mut prefix);
        assert_eq!(prefix.held["quiet"], 3);
    }

    #[test]
    fn only_committed_positions_are_offered() {
        let mut prefix = PrefixCache::new(LAYERS, ROW, u64::MAX);
        let tokens: Vec<u32> = (1..=40).collect();
        // The cache holds only 20 of the 40 tokens offered: one whole block.
        assert_eq!(prefix.insert("n", &tokens, &cache_of(&tokens[..20])), 1);
    }
}

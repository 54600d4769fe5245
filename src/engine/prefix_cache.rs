//! The engine's prefix cache settings and counters (the cache itself:
//! [`crate::engine::prefix`]).

use super::Engine;
use super::prefix::PrefixCacheStats;

impl Engine {
    /// Give the prefix cache `bytes` (0 turns it off). It runs on the CPU only: on a GPU
    /// the KV cache lives on the device, and the cache stays off.
    pub fn set_prefix_cache_bytes(&mut self, bytes: u64) {
        if bytes > 0 && !self.model.device().is_cpu() {
            tracing::warn!("the prefix cache runs on the CPU only: it is off on this device");
            self.prefix.set_budget(0);
            return;
        }
        self.prefix.set_budget(bytes);
    }

    /// Guarantee each namespace `share` (0 to 1) of the prefix cache's budget against
    /// the other namespaces' inserts (see [`crate::engine::prefix::PrefixCache::set_namespace_share`]).
    pub fn set_prefix_cache_share(&mut self, share: f64) {
        self.prefix.set_namespace_share(share);
    }

    /// The prefix cache's counters.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.prefix.stats()
    }

    /// Bytes of keys and values one token of context holds in a KV cache.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.prefix.bytes_per_token()
    }
}

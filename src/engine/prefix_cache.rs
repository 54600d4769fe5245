//! The engine's prefix cache settings and counters (the cache itself:
//! [`crate::engine::prefix`]).

use super::Engine;
use super::prefix::PrefixCacheStats;

impl Engine {
    /// Give the prefix cache `bytes` (0 turns it off): host memory on the CPU, device
    /// memory on suffixd's GPU kernels. On candle's GPU operations, where a position's
    /// keys and values depend on how its prompt was batched, the cache stays off.
    pub fn set_prefix_cache_bytes(&mut self, bytes: u64) {
        if bytes > 0 && !self.model.kv_is_row_invariant() {
            tracing::warn!(
                "the prefix cache needs exact keys and values (the CPU, or --weights bf16 or f32 on a GPU): it is off"
            );
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

    /// The GPU's free memory when the model runs on suffixd's GPU kernels, where the
    /// prefix cache's blocks live then; `None` when they live on the host.
    pub fn prefix_cache_device_memory_bytes(&self) -> Option<u64> {
        self.model.device_memory_free()
    }

    /// Bytes of keys and values one token of context holds in a KV cache.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.prefix.bytes_per_token()
    }
}

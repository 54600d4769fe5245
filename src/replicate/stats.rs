//! What a replica reports about its replication: `/admin/stats` and `/metrics`.

use super::LAG_WINDOW;

/// What `/admin/stats` reports under `replication`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReplicationStats {
    /// This replica's name.
    pub replica: String,
    /// The tag in its ids.
    pub tag: u16,
    /// The NATS server.
    pub url: String,
    /// The stream.
    pub cluster: String,
    /// Whether the last exchange with NATS succeeded.
    pub connected: bool,
    /// The last own id JetStream acknowledged.
    pub published_id: u64,
    /// Own sequences published since start.
    pub published: u64,
    /// Own appends not yet acknowledged (the last own id minus the last published).
    pub unpublished: u64,
    /// The last stream sequence applied.
    pub applied_seq: u64,
    /// Other replicas' records applied since start (a record already cached counts).
    pub applied: u64,
    /// Records on the stream not yet applied, at the last look.
    pub lag_records: u64,
    /// Seconds from the newest applied record's append at its origin to its apply here.
    pub lag_seconds: f64,
    /// The median of that lag over the last [`LAG_WINDOW`] applied appends.
    pub lag_seconds_p50: f64,
    /// Its 99th percentile over the same window.
    pub lag_seconds_p99: f64,
    /// The lags of the last applied appends, for the percentiles.
    #[serde(skip)]
    pub(super) recent_lags: std::collections::VecDeque<f64>,
    /// Operator evictions not yet acknowledged (kept in `replication/evictions.jsonl`).
    pub evictions_unpublished: u64,
    /// Other replicas' operator evictions applied since start.
    pub evictions_applied: u64,
    /// Records refused since start (another tokenizer, an id outside the origin's tag,
    /// undecodable), each logged with the reason.
    pub refused: u64,
    /// Records the stream no longer held when this replica reached them (its retention)
    /// and no published snapshot covered, since start.
    pub missed: u64,
    /// Times this replica found records gone from the stream and caught up from a
    /// published snapshot, since start.
    pub catch_ups: u64,
    /// Times this replica found the stream gone or made anew (NATS restarted without its
    /// storage, or the stream was deleted) and started over on the new one: it
    /// republished its own cached sequences and read the new stream from its start.
    pub stream_resets: u64,
    /// When it last did, ms since the epoch.
    pub last_stream_reset_ms: Option<u64>,
    /// Snapshots this replica published since start.
    pub snapshots_published: u64,
    /// The last one it published (object name).
    pub last_snapshot_published: Option<String>,
    /// The published snapshot this replica last started or caught up from.
    pub snapshot_fetched: Option<String>,
    /// The last error, if the last exchange failed.
    pub last_error: Option<String>,
}

impl ReplicationStats {
    /// Note the lag of an append just applied.
    pub(super) fn record_lag(&mut self, seconds: f64) {
        self.lag_seconds = seconds;
        if self.recent_lags.len() == LAG_WINDOW {
            self.recent_lags.pop_front();
        }
        self.recent_lags.push_back(seconds);
    }

    /// Set the lag percentiles from the recent lags.
    pub(super) fn update_lag_percentiles(&mut self) {
        let mut lags: Vec<f64> = self.recent_lags.iter().copied().collect();
        lags.sort_unstable_by(f64::total_cmp);
        let at = |q: f64| lags.get(((lags.len() as f64 - 1.0) * q).round() as usize);
        self.lag_seconds_p50 = at(0.5).copied().unwrap_or(0.0);
        self.lag_seconds_p99 = at(0.99).copied().unwrap_or(0.0);
    }

    /// The Prometheus exposition lines (`suffixd_replication_*`).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut line = |name: &str, kind: &str, help: &str, v: f64| {
            out.push_str(&format!(
                "# HELP suffixd_replication_{name} {help}\n# TYPE suffixd_replication_{name} {kind}\nsuffixd_replication_{name} {v}\n"
            ));
        };
        line(
            "connected",
            "gauge",
            "1 when the last exchange with NATS succeeded.",
            self.connected as u8 as f64,
        );
        line(
            "published_total",
            "counter",
            "Own appends published since start.",
            self.published as f64,
        );
        line(
            "unpublished",
            "gauge",
            "Own appends not yet acknowledged by JetStream.",
            self.unpublished as f64,
        );
        line(
            "applied_total",
            "counter",
            "Other replicas' records applied since start.",
            self.applied as f64,
        );
        line(
            "applied_position",
            "gauge",
            "The last stream sequence applied.",
            self.applied_seq as f64,
        );
        line(
            "lag_records",
            "gauge",
            "Stream records not yet applied.",
            self.lag_records as f64,
        );
        line(
            "lag_seconds",
            "gauge",
            "Age of the newest applied record when it was applied.",
            self.lag_seconds,
        );
        line(
            "lag_seconds_p50",
            "gauge",
            "Median lag over the last 1024 applied appends.",
            self.lag_seconds_p50,
        );
        line(
            "lag_seconds_p99",
            "gauge",
            "99th percentile lag over the last 1024 applied appends.",
            self.lag_seconds_p99,
        );
        line(
            "refused_total",
            "counter",
            "Records refused (another tokenizer, a foreign tag, undecodable).",
            self.refused as f64,
        );
        line(
            "missed_total",
            "counter",
            "Records gone from the stream (retention) that no published snapshot covered.",
            self.missed as f64,
        );
        line(
            "stream_resets_total",
            "counter",
            "Times the stream was found gone or made anew (NATS lost its storage) and this replica republished its own sequences and reread it from its start.",
            self.stream_resets as f64,
        );
        line(
            "catch_ups_total",
            "counter",
            "Catch-ups from a published snapshot after records were gone from the stream.",
            self.catch_ups as f64,
        );
        out
    }
}

//! Counters and histograms for `/metrics` (Prometheus text format) and `/admin/stats`.

use std::fmt::Write;
use std::sync::Mutex;

use crate::engine::cost::CostCurve;
use crate::engine::prefix::PrefixCacheStats;
use crate::engine::{DraftSources, Generation, SourceCounts, StepReport};

/// Upper bounds of the accepted-tokens-per-step histogram.
const ACCEPT_BUCKETS: [f64; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0];
/// Upper bounds (seconds) of the request-latency histogram.
const LATENCY_BUCKETS: [f64; 9] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Upper bounds (seconds) of the speculation-latency histogram (one draft).
const SPECULATION_BUCKETS: [f64; 9] = [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2];
/// Upper bounds (seconds) of the verification-latency histogram (one forward pass).
const VERIFY_BUCKETS: [f64; 9] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Upper bounds (seconds) of the store histograms: the model thread's handover of a
/// completed request, and the append (WAL write, fsync, budget evictions) itself.
const STORE_BUCKETS: [f64; 10] = [1e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.25];
/// Namespaces given series of their own in the usage counters; later ones (clients name
/// namespaces, through `user`) count together under [`OTHER_NAMESPACES`], so that the
/// exposition stays bounded.
const MAX_NAMESPACE_SERIES: usize = 1000;

/// The label of the namespaces past [`MAX_NAMESPACE_SERIES`] (not a valid namespace name:
/// it has a space).
const OTHER_NAMESPACES: &str = "other namespaces";

/// Upper bounds of the batch-size histogram (sequences per forward pass).
const BATCH_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

#[derive(Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], v: f64, times: u64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, b) in bounds.iter().enumerate() {
            if v <= *b {
                self.counts[i] += times;
            }
        }
        self.sum += v * times as f64;
        self.n += times;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, bounds: &[f64]) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in bounds.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}",
            self.n, self.sum, self.n
        );
    }
}

#[derive(Default, Clone)]
struct Inner {
    requests: u64,
    errors: u64,
    /// Admin snapshot jobs that failed.
    failed_jobs: u64,
    /// Requests to the OpenAI routes refused by the API-key gate.
    refused_keys: u64,
    prompt_tokens: u64,
    generated_tokens: u64,
    steps: u64,
    drafted: u64,
    accepted: u64,
    accepted_per_step: Histogram,
    latency: Histogram,
    speculation: Histogram,
    verification: Histogram,
    batch: Histogram,
    store_handover: Histogram,
    store_append: Histogram,
    /// The last 64 generations: (generated, steps, drafted, accepted).
    recent: std::collections::VecDeque<(u64, u64, u64, u64)>,
    /// Forward passes, and the sequences and rows they ran.
    passes: u64,
    pass_sequences: u64,
    pass_rows: u64,
    /// The verifier's cost curve as the model thread last published it.
    cost_curve: Option<CostCurve>,
    /// The prefix cache's counters as the model thread last published them.
    prefix_cache: PrefixCacheStats,
    /// Where the verified steps' drafts came from (hybrid mode: suffix trees or the
    /// draft model), and the draft model's time.
    sources: DraftSources,
    /// Each tenant's use, by namespace.
    usage: std::collections::BTreeMap<String, NamespaceUsage>,
}

/// What one namespace's finished generations used: per-tenant accounting.
#[derive(Clone, Copy, Debug, Default)]
struct NamespaceUsage {
    requests: u64,
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
    generated_tokens: u64,
    accepted: u64,
    /// Requests refused with 429 because the queue was full and this namespace held its
    /// share of it.
    queue_refusals: u64,
}

impl Inner {
    /// The usage series of `namespace`: its own while fewer than
    /// [`MAX_NAMESPACE_SERIES`] namespaces have one, else the rest's.
    fn usage_of(&mut self, namespace: &str) -> &mut NamespaceUsage {
        let series =
            if self.usage.contains_key(namespace) || self.usage.len() < MAX_NAMESPACE_SERIES {
                namespace
            } else {
                OTHER_NAMESPACES
            };
        self.usage.entry(series.to_string()).or_default()
    }
}

/// Serving metrics, shared by the handlers and the model thread.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    /// Count a request of `namespace` refused because the queue was full (and an error).
    pub fn record_queue_refusal(&self, namespace: &str) {
        let mut m = self.inner.lock().expect("metrics");
        m.errors += 1;
        m.usage_of(namespace).queue_refusals += 1;
    }

    /// Count a finished generation of `namespace`.
    pub fn record_generation(&self, namespace: &str, g: &Generation) {
        let mut m = self.inner.lock().expect("metrics");
        let usage = m.usage_of(namespace);
        usage.requests += 1;
        usage.prompt_tokens += g.prompt_tokens as u64;
        usage.cached_prompt_tokens += g.cached_prompt_tokens as u64;
        usage.generated_tokens += g.tokens.len() as u64;
        usage.accepted += g.accepted_tokens as u64;
        m.requests += 1;
        m.prompt_tokens += g.prompt_tokens as u64;
        m.generated_tokens += g.tokens.len() as u64;
        m.steps += g.steps as u64;
        m.drafted += g.drafted_tokens as u64;
        m.accepted += g.accepted_tokens as u64;
        m.latency
            .observe(&LATENCY_BUCKETS, g.prefill_s + g.decode_s, 1);
        m.recent.push_back((
            g.tokens.len() as u64,
            g.steps as u64,
            g.drafted_tokens as u64,
            g.accepted_tokens as u64,
        ));
        if m.recent.len() > 64 {
            m.recent.pop_front();
        }
    }

    /// Count one batched step: each draft's latency and accepted tokens, the forward
    /// pass's latency and width.
    pub fn record_step(&self, step: &StepReport) {
        let mut m = self.inner.lock().expect("metrics");
        for &s in &step.draft_s {
            m.speculation.observe(&SPECULATION_BUCKETS, s, 1);
        }
        for &a in &step.accepted {
            m.accepted_per_step.observe(&ACCEPT_BUCKETS, a as f64, 1);
        }
        if step.sequences > 0 {
            m.verification.observe(&VERIFY_BUCKETS, step.verify_s, 1);
            m.batch.observe(&BATCH_BUCKETS, step.sequences as f64, 1);
            m.passes += 1;
            m.pass_sequences += step.sequences as u64;
            m.pass_rows += step.rows as u64;
        }
        m.sources.add(&step.sources);
    }

    /// Time the model thread spent handing one completed request to the store.
    pub fn record_store_handover(&self, seconds: f64) {
        let mut m = self.inner.lock().expect("metrics");
        m.store_handover.observe(&STORE_BUCKETS, seconds, 1);
    }

    /// Time one completed request's append took (WAL write, fsync, budget evictions).
    pub fn record_store_append(&self, seconds: f64) {
        let mut m = self.inner.lock().expect("metrics");
        m.store_append.observe(&STORE_BUCKETS, seconds, 1);
    }

    /// Publish the verifier's cost curve (it changes as steps correct it).
    pub fn publish_cost_curve(&self, curve: &CostCurve) {
        self.inner.lock().expect("metrics").cost_curve = Some(curve.clone());
    }

    /// Publish the prefix cache's counters.
    pub fn publish_prefix_cache(&self, stats: PrefixCacheStats) {
        self.inner.lock().expect("metrics").prefix_cache = stats;
    }

    /// The cost curve last published, as JSON (null before the first).
    pub fn cost_curve(&self) -> serde_json::Value {
        let m = self.inner.lock().expect("metrics");
        serde_json::to_value(&m.cost_curve).unwrap_or_default()
    }

    /// Count an admin job that failed.
    pub fn record_failed_job(&self) {
        self.inner.lock().expect("metrics").failed_jobs += 1;
    }

    /// Count a request the API-key gate refused (no key, a wrong one, too many wrong
    /// ones, or another tenant's namespace).
    pub fn record_refused_key(&self) {
        self.inner.lock().expect("metrics").refused_keys += 1;
    }

    /// Count a request that failed.
    pub fn record_error(&self) {
        self.inner.lock().expect("metrics").errors += 1;
    }

    /// Acceptance figures, total and over the last 64 requests.
    pub fn summary(&self) -> serde_json::Value {
        let m = self.inner.lock().expect("metrics");
        let (g, s, d, a) = m.recent.iter().fold((0, 0, 0, 0), |x, y| {
            (x.0 + y.0, x.1 + y.1, x.2 + y.2, x.3 + y.3)
        });
        let ratio = |x: u64, y: u64| if y == 0 { 0.0 } else { x as f64 / y as f64 };
        serde_json::json!({
            "requests": m.requests,
            "errors": m.errors,
            "generated_tokens": m.generated_tokens,
            "total": {
                "acceptance_rate": ratio(m.accepted, m.drafted),
                "tokens_per_step": ratio(m.generated_tokens, m.steps),
            },
            "recent": {
                "requests": m.recent.len(),
                "acceptance_rate": ratio(a, d),
                "tokens_per_step": ratio(g, s),
            },
            "forward_passes": {
                "count": m.passes,
                "mean_sequences": ratio(m.pass_sequences, m.passes),
                "mean_rows": ratio(m.pass_rows, m.passes),
            },
            "prefix_cache": m.prefix_cache,
            "draft_sources": m.sources,
        })
    }

    /// The Prometheus text exposition; `store` adds gauges of the cache.
    pub fn render(
        &self,
        cached_tokens: u64,
        cached_sequences: u64,
        evicted: u64,
        snapshots: u64,
    ) -> String {
        let m = self.inner.lock().expect("metrics").clone();
        let mut out = String::new();
        render_totals(
            &m,
            &mut out,
            cached_tokens,
            cached_sequences,
            evicted,
            snapshots,
        );
        render_usage(&m.usage, &mut out);
        m.accepted_per_step.render(
            &mut out,
            "suffixd_accepted_tokens_per_step",
            "Accepted draft tokens per verification step.",
            &ACCEPT_BUCKETS,
        );
        m.latency.render(
            &mut out,
            "suffixd_request_duration_seconds",
            "Time from prefill to the last token.",
            &LATENCY_BUCKETS,
        );
        m.speculation.render(
            &mut out,
            "suffixd_speculation_seconds",
            "Time to draft for one sequence at one step.",
            &SPECULATION_BUCKETS,
        );
        m.verification.render(
            &mut out,
            "suffixd_verification_seconds",
            "Time of one batched forward pass (verification and prefill).",
            &VERIFY_BUCKETS,
        );
        m.batch.render(
            &mut out,
            "suffixd_batch_sequences",
            "Sequences per batched forward pass.",
            &BATCH_BUCKETS,
        );
        m.store_handover.render(
            &mut out,
            "suffixd_store_handover_seconds",
            "Time the model thread spent handing a completed request to the store writer.",
            &STORE_BUCKETS,
        );
        m.store_append.render(
            &mut out,
            "suffixd_store_append_seconds",
            "Time to append a completed request to the store (WAL write, fsync, budget evictions).",
            &STORE_BUCKETS,
        );
        render_sources(&m.sources, &mut out);
        if let Some(curve) = &m.cost_curve {
            let name = "suffixd_verify_cost_ratio";
            let _ = writeln!(
                out,
                "# HELP {name} Cost of a forward pass of K rows over one row, t(K)/t(1), as the verifier uses it.\n# TYPE {name} gauge"
            );
            for (k, ratio) in &curve.points {
                let _ = writeln!(out, "{name}{{k=\"{k}\"}} {ratio}");
            }
        }
        out
    }
}

/// The counters of the draft sources: steps, drafted and accepted tokens, per source.
fn render_sources(s: &DraftSources, out: &mut String) {
    let none = SourceCounts {
        steps: s.none,
        ..SourceCounts::default()
    };
    let sources = [
        ("none", &none),
        ("suffix", &s.suffix),
        ("model", &s.model),
        ("prediction", &s.prediction),
    ];
    type Count = fn(&SourceCounts) -> usize;
    let series: [(&str, &str, Count); 3] = [
        (
            "suffixd_draft_steps_total",
            "Verified decoding steps by where their draft came from (none: no draft).",
            |c| c.steps,
        ),
        (
            "suffixd_draft_tokens_total",
            "Draft tokens verified, by source.",
            |c| c.drafted,
        ),
        (
            "suffixd_draft_accepted_tokens_total",
            "Draft tokens accepted, by source.",
            |c| c.accepted,
        ),
    ];
    for (name, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (source, counts) in sources {
            let _ = writeln!(out, "{name}{{source=\"{source}\"}} {}", value(counts));
        }
    }
    let name = "suffixd_draft_model_seconds_total";
    let _ = writeln!(
        out,
        "# HELP {name} Time spent running the draft model (hybrid mode).\n# TYPE {name} counter\n{name} {}",
        s.model_draft_s
    );
}

/// Each namespace's usage counters, one series per namespace (label values escaped as
/// the exposition format asks: a namespace may hold `"` and `\`).
fn render_usage(usage: &std::collections::BTreeMap<String, NamespaceUsage>, out: &mut String) {
    type Family = (&'static str, &'static str, fn(&NamespaceUsage) -> u64);
    let families: [Family; 6] = [
        (
            "suffixd_namespace_requests_total",
            "Completed generation requests",
            |u| u.requests,
        ),
        (
            "suffixd_namespace_prompt_tokens_total",
            "Prompt tokens",
            |u| u.prompt_tokens,
        ),
        (
            "suffixd_namespace_cached_prompt_tokens_total",
            "Prompt tokens reused from the prefix cache",
            |u| u.cached_prompt_tokens,
        ),
        (
            "suffixd_namespace_generated_tokens_total",
            "Tokens generated",
            |u| u.generated_tokens,
        ),
        (
            "suffixd_namespace_accepted_tokens_total",
            "Draft tokens accepted",
            |u| u.accepted,
        ),
        (
            "suffixd_namespace_queue_refusals_total",
            "Requests refused with 429 while the queue was full and the namespace held its share",
            |u| u.queue_refusals,
        ),
    ];
    // Each namespace's label, escaped once for all the families.
    let labels: Vec<(String, &NamespaceUsage)> = usage
        .iter()
        .map(|(namespace, u)| {
            let label = namespace
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            (label, u)
        })
        .collect();
    for (name, help, value) in families {
        let _ = writeln!(
            out,
            "# HELP {name} {help}, by namespace (past {MAX_NAMESPACE_SERIES} namespaces, the \
             rest together as \"{OTHER_NAMESPACES}\").\n# TYPE {name} counter"
        );
        for (label, u) in &labels {
            let _ = writeln!(out, "{name}{{namespace=\"{label}\"}} {}", value(u));
        }
    }
}

/// The counters and gauges of the Prometheus exposition.
fn render_totals(
    m: &Inner,
    out: &mut String,
    cached_tokens: u64,
    cached_sequences: u64,
    evicted: u64,
    snapshots: u64,
) {
    let mut counter = |name: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    };
    counter(
        "suffixd_requests_total",
        "Completed generation requests.",
        m.requests,
    );
    counter(
        "suffixd_request_errors_total",
        "Requests that failed.",
        m.errors,
    );
    counter(
        "suffixd_api_key_refusals_total",
        "Requests to the OpenAI routes refused by the API-key gate (no key, a wrong one, too many wrong ones from one source, or a namespace the key is not bound to).",
        m.refused_keys,
    );
    counter(
        "suffixd_admin_jobs_failed_total",
        "Admin snapshot jobs that failed (each logged at ERROR).",
        m.failed_jobs,
    );
    counter(
        "suffixd_prompt_tokens_total",
        "Prompt tokens processed.",
        m.prompt_tokens,
    );
    counter(
        "suffixd_generated_tokens_total",
        "Tokens generated.",
        m.generated_tokens,
    );
    counter("suffixd_steps_total", "Verification steps.", m.steps);
    counter(
        "suffixd_drafted_tokens_total",
        "Draft tokens verified.",
        m.drafted,
    );
    counter(
        "suffixd_accepted_tokens_total",
        "Draft tokens accepted.",
        m.accepted,
    );
    counter(
        "suffixd_evictions_total",
        "Cached sequences evicted.",
        evicted,
    );
    counter(
        "suffixd_snapshots_total",
        "Snapshots and compactions written.",
        snapshots,
    );
    let p = &m.prefix_cache;
    counter(
        "suffixd_prefix_cache_lookups_total",
        "Requests that looked for a cached prompt prefix.",
        p.lookups,
    );
    counter(
        "suffixd_prefix_cache_hits_total",
        "Requests that reused a cached prompt prefix.",
        p.hits,
    );
    counter(
        "suffixd_prefix_cache_reused_tokens_total",
        "Prompt tokens restored from the prefix cache instead of prefilled.",
        p.tokens_reused,
    );
    counter(
        "suffixd_prefix_cache_evicted_blocks_total",
        "Prefix cache blocks evicted for room.",
        p.blocks_evicted,
    );
    let rate = if m.drafted == 0 {
        0.0
    } else {
        m.accepted as f64 / m.drafted as f64
    };
    let _ = writeln!(
        out,
        "# HELP suffixd_acceptance_rate Accepted over drafted tokens.\n# TYPE suffixd_acceptance_rate gauge\nsuffixd_acceptance_rate {rate}"
    );
    let _ = writeln!(
        out,
        "# HELP suffixd_cached_tokens Tokens in the speculation cache.\n# TYPE suffixd_cached_tokens gauge\nsuffixd_cached_tokens {cached_tokens}"
    );
    let _ = writeln!(
        out,
        "# HELP suffixd_cached_sequences Sequences in the speculation cache.\n# TYPE suffixd_cached_sequences gauge\nsuffixd_cached_sequences {cached_sequences}"
    );
    let _ = writeln!(
        out,
        "# HELP suffixd_prefix_cache_bytes Bytes the prefix cache holds.\n# TYPE suffixd_prefix_cache_bytes gauge\nsuffixd_prefix_cache_bytes {}",
        p.bytes
    );
    let _ = writeln!(
        out,
        "# HELP suffixd_prefix_cache_budget_bytes The prefix cache's byte budget (0: off).\n# TYPE suffixd_prefix_cache_budget_bytes gauge\nsuffixd_prefix_cache_budget_bytes {}",
        p.budget_bytes
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::FinishReason;

    fn generation(
        prompt_tokens: usize,
        cached: usize,
        tokens: usize,
        accepted: usize,
    ) -> Generation {
        Generation {
            tokens: vec![7; tokens],
            text: String::new(),
            prompt_tokens,
            cached_prompt_tokens: cached,
            steps: tokens - accepted,
            drafted_tokens: accepted + 1,
            accepted_tokens: accepted,
            verify_cost: 1.0,
            finish_reason: FinishReason::Stop,
            prefill_s: 0.0,
            decode_s: 0.0,
            tokens_per_s: 0.0,
            logprobs: None,
            grammar_failure: None,
            sources: Default::default(),
        }
    }

    /// One series per namespace, each its own sums; a namespace's odd characters are
    /// escaped; past the bound, the rest count together.
    #[test]
    fn usage_is_counted_by_namespace_and_bounded() {
        let metrics = Metrics::default();
        metrics.record_generation("tenant-a", &generation(10, 4, 5, 2));
        metrics.record_generation("tenant-a", &generation(20, 0, 6, 3));
        metrics.record_generation("odd\"ns\\", &generation(1, 0, 1, 0));
        metrics.record_queue_refusal("tenant-a");
        let text = metrics.render(0, 0, 0, 0);
        for line in [
            "suffixd_namespace_requests_total{namespace=\"tenant-a\"} 2",
            "suffixd_namespace_prompt_tokens_total{namespace=\"tenant-a\"} 30",
            "suffixd_namespace_cached_prompt_tokens_total{namespace=\"tenant-a\"} 4",
            "suffixd_namespace_generated_tokens_total{namespace=\"tenant-a\"} 11",
            "suffixd_namespace_accepted_tokens_total{namespace=\"tenant-a\"} 5",
            "suffixd_namespace_queue_refusals_total{namespace=\"tenant-a\"} 1",
            "suffixd_namespace_queue_refusals_total{namespace=\"odd\\\"ns\\\\\"} 0",
            "suffixd_request_errors_total 1",
            "suffixd_namespace_requests_total{namespace=\"odd\\\"ns\\\\\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        for i in 0..MAX_NAMESPACE_SERIES + 5 {
            metrics.record_generation(&format!("n{i}"), &generation(1, 0, 1, 0));
        }
        let text = metrics.render(0, 0, 0, 0);
        let series = text
            .lines()
            .filter(|l| l.starts_with("suffixd_namespace_requests_total{"))
            .count();
        assert_eq!(
            series,
            MAX_NAMESPACE_SERIES + 1,
            "the bound and the rest's series"
        );
        // Two namespaces were counted before; the last 7 new ones share one series.
        let rest = "suffixd_namespace_requests_total{namespace=\"other namespaces\"} 7";
        assert!(text.lines().any(|l| l == rest), "{text}");
        // A namespace with a series of its own keeps it.
        metrics.record_generation("tenant-a", &generation(1, 0, 1, 0));
        let text = metrics.render(0, 0, 0, 0);
        assert!(text.contains("suffixd_namespace_requests_total{namespace=\"tenant-a\"} 3"));
    }
}

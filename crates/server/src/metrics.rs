//! Server metrics, rendered in the Prometheus text exposition format 0.0.4.
//!
//! One [`Metrics`] is shared as `Arc<Metrics>` by the HTTP handlers and the engine-loop
//! thread. Every update is a single relaxed atomic operation: the values are independent
//! counters and gauges, so no ordering between them is promised, and neither side ever
//! blocks the other (the engine loop must not wait on a scrape).

use std::fmt::Display;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The `Content-Type` a `/metrics` response carries for this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why a request was turned away before it reached the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    QueueFull,
    Draining,
    BadRequest,
    Unauthorized,
    TooLarge,
}

impl Reject {
    /// Every reason, in the order the series are rendered.
    pub const ALL: [Reject; 5] = [
        Reject::QueueFull,
        Reject::Draining,
        Reject::BadRequest,
        Reject::Unauthorized,
        Reject::TooLarge,
    ];

    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Reject::QueueFull => "queue_full",
            Reject::Draining => "draining",
            Reject::BadRequest => "bad_request",
            Reject::Unauthorized => "unauthorized",
            Reject::TooLarge => "too_large",
        }
    }
}

/// How a request that reached the engine ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    Error,
    Cancelled,
}

impl Finish {
    /// Every reason, in the order the series are rendered.
    pub const ALL: [Finish; 5] = [
        Finish::Stop,
        Finish::Length,
        Finish::ToolCalls,
        Finish::Error,
        Finish::Cancelled,
    ];

    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
            Finish::Error => "error",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// Upper bounds (seconds) for time to first token: from a cached short prompt on a GPU
/// up to a long prefill queued behind others on a CPU.
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// Upper bounds (seconds) for time per output token: about 1000 tok/s down to 0.5 tok/s.
const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0,
];

/// A fixed-bucket histogram. Each observation lands in exactly one slot (the first bound
/// it does not exceed, or the overflow slot), so an update is one increment; the
/// cumulative counts Prometheus wants are formed at render time, which also makes the
/// rendered `+Inf` bucket equal `_count` by construction.
struct Histogram {
    bounds: &'static [f64],
    /// `bounds.len() + 1` slots; the last one holds observations above every bound.
    slots: Box<[AtomicU64]>,
    /// The f64 sum of observations, as bits, updated by compare-and-swap.
    sum_bits: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds,
            slots: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn observe(&self, value: f64) {
        // A NaN or infinite duration is a caller bug; dropping it keeps `_sum` finite
        // and scrapable rather than poisoning the series forever.
        if !value.is_finite() {
            return;
        }
        // Clock steps can yield a tiny negative duration; it belongs in the first bucket.
        let value = value.max(0.0);
        let slot = self.slot_for(value);
        self.slots[slot].fetch_add(1, Relaxed);
        let _ = self.sum_bits.fetch_update(Relaxed, Relaxed, |bits| {
            Some((f64::from_bits(bits) + value).to_bits())
        });
    }

    fn slot_for(&self, value: f64) -> usize {
        // `le` is inclusive: a value equal to a bound counts in that bound's bucket.
        self.bounds
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(self.bounds.len())
    }

    fn sum(&self) -> f64 {
        f64::from_bits(self.sum_bits.load(Relaxed))
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        family(out, name, "histogram", help);
        let mut cumulative = 0u64;
        for (slot, bound) in self.slots.iter().zip(self.bounds) {
            cumulative += slot.load(Relaxed);
            let le = bound.to_string();
            sample(
                out,
                &format!("{name}_bucket"),
                Some(("le", &le)),
                cumulative,
            );
        }
        cumulative += self.slots[self.bounds.len()].load(Relaxed);
        sample(
            out,
            &format!("{name}_bucket"),
            Some(("le", "+Inf")),
            cumulative,
        );
        sample(out, &format!("{name}_sum"), None, self.sum());
        sample(out, &format!("{name}_count"), None, cumulative);
    }
}

/// Writes the `# HELP` and `# TYPE` lines that open a metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one sample line; label values here are fixed identifiers, so need no escaping.
fn sample(out: &mut String, name: &str, label: Option<(&str, &str)>, value: impl Display) {
    let _ = match label {
        Some((key, val)) => writeln!(out, "{name}{{{key}=\"{val}\"}} {value}"),
        None => writeln!(out, "{name} {value}"),
    };
}

fn load(cell: &AtomicU64) -> u64 {
    cell.load(Relaxed)
}

fn add(cell: &AtomicU64, n: usize) {
    cell.fetch_add(n as u64, Relaxed);
}

fn set(cell: &AtomicU64, n: usize) {
    cell.store(n as u64, Relaxed);
}

/// All server counters, gauges and histograms.
pub struct Metrics {
    requests: AtomicU64,
    rejected: [AtomicU64; 5],
    finished: [AtomicU64; 5],
    running: AtomicU64,
    queued: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    ttft: Histogram,
    tpot: Histogram,
    kv_used: AtomicU64,
    kv_shared: AtomicU64,
    kv_free: AtomicU64,
    prefix_lookups: AtomicU64,
    prefix_hits: AtomicU64,
    prefix_hit_tokens: AtomicU64,
    prefix_prompt_tokens: AtomicU64,
    prefix_entries: AtomicU64,
    engine_sequences: AtomicU64,
    defrags: AtomicU64,
    forward_failures: AtomicU64,
    draining: AtomicBool,
    /// The engine loop's profile (forwards, rows, host time, graph builds, CUDA captures).
    pub profile: LoopProfile,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            requests: AtomicU64::new(0),
            rejected: Default::default(),
            finished: Default::default(),
            running: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            tpot: Histogram::new(TPOT_BUCKETS),
            kv_used: AtomicU64::new(0),
            kv_shared: AtomicU64::new(0),
            kv_free: AtomicU64::new(0),
            prefix_lookups: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_hit_tokens: AtomicU64::new(0),
            prefix_prompt_tokens: AtomicU64::new(0),
            prefix_entries: AtomicU64::new(0),
            engine_sequences: AtomicU64::new(0),
            defrags: AtomicU64::new(0),
            forward_failures: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            profile: LoopProfile::default(),
        }
    }

    pub fn request_received(&self) {
        add(&self.requests, 1);
    }

    pub fn request_rejected(&self, reason: Reject) {
        add(&self.rejected[reason as usize], 1);
    }

    pub fn request_finished(&self, finish: Finish) {
        add(&self.finished[finish as usize], 1);
    }

    /// Sequences being generated right now.
    pub fn set_running(&self, n: usize) {
        set(&self.running, n);
    }

    /// Requests accepted but waiting for a slot in the batch.
    pub fn set_queued(&self, n: usize) {
        set(&self.queued, n);
    }

    pub fn add_prompt_tokens(&self, n: usize) {
        add(&self.prompt_tokens, n);
    }

    pub fn add_completion_tokens(&self, n: usize) {
        add(&self.completion_tokens, n);
    }

    pub fn observe_ttft(&self, secs: f64) {
        self.ttft.observe(secs);
    }

    pub fn observe_tpot(&self, secs: f64) {
        self.tpot.observe(secs);
    }

    /// KV cache cells: in use (shared ones included, so `used + free` is the cache
    /// size), in use by more than one sequence, and free.
    pub fn set_kv(&self, used: usize, shared: usize, free: usize) {
        set(&self.kv_used, used);
        set(&self.kv_shared, shared);
        set(&self.kv_free, free);
    }

    /// One prefix-cache lookup for a prompt of `prompt_tokens`, of which `cached_tokens`
    /// were found cached. `cached_tokens` is clamped to `prompt_tokens` so the hit rate
    /// stays within [0, 1] even if a caller counts a reused trailing token twice.
    pub fn add_prefix_lookup(&self, prompt_tokens: usize, cached_tokens: usize) {
        let cached = cached_tokens.min(prompt_tokens);
        add(&self.prefix_lookups, 1);
        if cached > 0 {
            add(&self.prefix_hits, 1);
        }
        add(&self.prefix_hit_tokens, cached);
        add(&self.prefix_prompt_tokens, prompt_tokens);
    }

    pub fn set_prefix_cache_entries(&self, n: usize) {
        set(&self.prefix_entries, n);
    }

    /// Sequences the engine holds: running ones, cached prefixes and its default one. Once
    /// idle this is the cache's entries plus one; more is a sequence nothing answers for
    /// (a leak), which a soak reads from outside the process.
    pub fn set_engine_sequences(&self, n: usize) {
        set(&self.engine_sequences, n);
    }

    /// The engine keeps its own running count of defragmentations; this mirrors it.
    /// `fetch_max` keeps the counter monotone even if two stale values race in.
    pub fn set_defrags(&self, total: usize) {
        self.defrags.fetch_max(total as u64, Relaxed);
    }

    pub fn forward_failed(&self) {
        add(&self.forward_failures, 1);
    }

    pub fn set_draining(&self, on: bool) {
        self.draining.store(on, Relaxed);
    }

    pub fn running(&self) -> usize {
        load(&self.running) as usize
    }

    pub fn queued(&self) -> usize {
        load(&self.queued) as usize
    }

    pub fn kv_used(&self) -> usize {
        load(&self.kv_used) as usize
    }

    pub fn kv_shared(&self) -> usize {
        load(&self.kv_shared) as usize
    }

    pub fn kv_free(&self) -> usize {
        load(&self.kv_free) as usize
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Relaxed)
    }

    pub fn requests_total(&self) -> u64 {
        load(&self.requests)
    }

    pub fn rejected(&self, reason: Reject) -> u64 {
        load(&self.rejected[reason as usize])
    }

    pub fn finished(&self, finish: Finish) -> u64 {
        load(&self.finished[finish as usize])
    }

    /// Cached prompt tokens over all looked-up prompt tokens; 0 before any lookup.
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        let prompt = load(&self.prefix_prompt_tokens);
        if prompt == 0 {
            0.0
        } else {
            load(&self.prefix_hit_tokens) as f64 / prompt as f64
        }
    }

    /// The whole exposition, one family after another.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        let scalar = |out: &mut String, name: &str, kind: &str, help: &str, value: u64| {
            family(out, name, kind, help);
            sample(out, name, None, value);
        };

        scalar(
            &mut out,
            "minfer_requests_total",
            "counter",
            "Requests received.",
            load(&self.requests),
        );
        let name = "minfer_requests_rejected_total";
        family(
            &mut out,
            name,
            "counter",
            "Requests rejected before generation, by reason.",
        );
        for reason in Reject::ALL {
            let value = self.rejected(reason);
            sample(&mut out, name, Some(("reason", reason.label())), value);
        }
        let name = "minfer_requests_finished_total";
        family(
            &mut out,
            name,
            "counter",
            "Requests finished, by finish reason.",
        );
        for finish in Finish::ALL {
            let value = self.finished(finish);
            sample(&mut out, name, Some(("reason", finish.label())), value);
        }
        scalar(
            &mut out,
            "minfer_requests_running",
            "gauge",
            "Requests being generated.",
            load(&self.running),
        );
        scalar(
            &mut out,
            "minfer_requests_queued",
            "gauge",
            "Requests waiting for a batch slot.",
            load(&self.queued),
        );
        scalar(
            &mut out,
            "minfer_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            load(&self.prompt_tokens),
        );
        scalar(
            &mut out,
            "minfer_completion_tokens_total",
            "counter",
            "Completion tokens generated.",
            load(&self.completion_tokens),
        );
        self.ttft.render(
            &mut out,
            "minfer_time_to_first_token_seconds",
            "Time from request arrival to its first generated token.",
        );
        self.tpot.render(
            &mut out,
            "minfer_time_per_output_token_seconds",
            "Time between consecutive generated tokens of a request.",
        );
        scalar(
            &mut out,
            "minfer_kv_cells_used",
            "gauge",
            "KV cache cells in use (shared ones included).",
            load(&self.kv_used),
        );
        scalar(
            &mut out,
            "minfer_kv_cells_shared",
            "gauge",
            "KV cache cells in use by more than one sequence.",
            load(&self.kv_shared),
        );
        scalar(
            &mut out,
            "minfer_kv_cells_free",
            "gauge",
            "KV cache cells free.",
            load(&self.kv_free),
        );
        scalar(
            &mut out,
            "minfer_prefix_cache_lookups_total",
            "counter",
            "Prefix cache lookups.",
            load(&self.prefix_lookups),
        );
        scalar(
            &mut out,
            "minfer_prefix_cache_hits_total",
            "counter",
            "Prefix cache lookups that found at least one cached token.",
            load(&self.prefix_hits),
        );
        scalar(
            &mut out,
            "minfer_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            load(&self.prefix_hit_tokens),
        );
        scalar(
            &mut out,
            "minfer_prefix_cache_prompt_tokens_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            load(&self.prefix_prompt_tokens),
        );
        let name = "minfer_prefix_cache_hit_rate";
        family(
            &mut out,
            name,
            "gauge",
            "Cached prompt tokens over looked-up prompt tokens.",
        );
        sample(&mut out, name, None, self.prefix_cache_hit_rate());
        scalar(
            &mut out,
            "minfer_prefix_cache_entries",
            "gauge",
            "Entries held by the prefix cache.",
            load(&self.prefix_entries),
        );
        scalar(
            &mut out,
            "minfer_engine_sequences",
            "gauge",
            "Sequences the engine holds: running, cached prefixes and its default one.",
            load(&self.engine_sequences),
        );
        scalar(
            &mut out,
            "minfer_kv_defrags_total",
            "counter",
            "KV cache defragmentations.",
            load(&self.defrags),
        );
        scalar(
            &mut out,
            "minfer_forward_failures_total",
            "counter",
            "Engine forward passes that failed.",
            load(&self.forward_failures),
        );
        scalar(
            &mut out,
            "minfer_draining",
            "gauge",
            "1 while the server is draining for shutdown, else 0.",
            u64::from(self.draining()),
        );
        self.profile.render(&mut out);
        out
    }
}

#[path = "metrics_profile.rs"]
mod profile;
pub use profile::{LoopProfile, Turn};

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;

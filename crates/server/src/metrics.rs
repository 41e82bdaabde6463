//! Server metrics (placeholder until the Prometheus registry lands).
#![allow(dead_code, unused_variables)]

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    QueueFull,
    Draining,
    BadRequest,
    Unauthorized,
    TooLarge,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    Error,
    Cancelled,
}
#[derive(Default)]
pub struct Metrics {
    running: std::sync::atomic::AtomicUsize,
    kv_used: std::sync::atomic::AtomicUsize,
    kv_free: std::sync::atomic::AtomicUsize,
}
impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }
    pub fn request_received(&self) {}
    pub fn request_rejected(&self, reason: Reject) {}
    pub fn request_finished(&self, finish: Finish) {}
    pub fn set_running(&self, n: usize) {
        self.running.store(n, std::sync::atomic::Ordering::Relaxed)
    }
    pub fn set_queued(&self, n: usize) {}
    pub fn add_prompt_tokens(&self, n: usize) {}
    pub fn add_completion_tokens(&self, n: usize) {}
    pub fn observe_ttft(&self, secs: f64) {}
    pub fn observe_tpot(&self, secs: f64) {}
    pub fn set_kv(&self, used: usize, shared: usize, free: usize) {
        self.kv_used
            .store(used, std::sync::atomic::Ordering::Relaxed);
        self.kv_free
            .store(free, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn add_prefix_lookup(&self, prompt_tokens: usize, cached_tokens: usize) {}
    pub fn set_prefix_cache_entries(&self, n: usize) {}
    pub fn set_defrags(&self, total: usize) {}
    pub fn forward_failed(&self) {}
    pub fn set_draining(&self, on: bool) {}
    pub fn render(&self) -> String {
        format!(
            "minfer_requests_running {}\nminfer_kv_cells_used {}\nminfer_kv_cells_free {}\n",
            self.running(),
            self.kv_used(),
            self.kv_free()
        )
    }
    pub fn running(&self) -> usize {
        self.running.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn queued(&self) -> usize {
        0
    }
    pub fn kv_used(&self) -> usize {
        self.kv_used.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn kv_free(&self) -> usize {
        self.kv_free.load(std::sync::atomic::Ordering::Relaxed)
    }
}

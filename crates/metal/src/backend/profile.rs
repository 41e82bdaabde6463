//! `MINFER_OP_PROFILE=1`: host encode time per op label and GPU wait per submit, printed as a
//! top-20 table at the first submit and when the backend drops. `MINFER_TRACE=1`: a ring of
//! the last 16 node labels, attached to a failed submit. Both cost one branch when unset;
//! [`crate::MetalSettings`] reads them.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

const RING: usize = 16;

#[derive(Default)]
pub(crate) struct OpProfile {
    /// label -> (calls, total encode time)
    encode: HashMap<String, (u64, Duration)>,
    submits: u64,
    wait: Duration,
    printed_first: bool,
}

impl OpProfile {
    pub fn encoded(&mut self, label: &str, t: Duration) {
        let e = self.encode.entry(label.to_string()).or_default();
        e.0 += 1;
        e.1 += t;
    }

    pub fn submitted(&mut self, wait: Duration) {
        self.submits += 1;
        self.wait += wait;
        if !self.printed_first {
            self.printed_first = true;
            self.print("first submit");
        } else {
            tracing::info!(
                "metal profile: submit {} waited {:.3} ms",
                self.submits,
                wait.as_secs_f64() * 1e3
            );
        }
    }

    pub fn print(&self, when: &str) {
        let mut rows: Vec<_> = self.encode.iter().collect();
        rows.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(b.0)));
        tracing::info!(
            "metal profile ({when}): {} submits, GPU wait {:.3} ms; host encode by op (top 20):",
            self.submits,
            self.wait.as_secs_f64() * 1e3
        );
        tracing::info!("  {:<28} {:>8} {:>12}", "op", "calls", "encode ms");
        for (label, (calls, t)) in rows.into_iter().take(20) {
            tracing::info!("  {label:<28} {calls:>8} {:>12.3}", t.as_secs_f64() * 1e3);
        }
    }
}

#[derive(Default)]
pub(crate) struct TraceRing {
    labels: VecDeque<String>,
}

impl TraceRing {
    pub fn push(&mut self, label: &str) {
        if self.labels.len() == RING {
            self.labels.pop_front();
        }
        self.labels.push_back(label.to_string());
    }

    pub fn describe(&self) -> String {
        let v: Vec<&str> = self.labels.iter().map(String::as_str).collect();
        format!("last nodes encoded (oldest first): [{}]", v.join(", "))
    }
}

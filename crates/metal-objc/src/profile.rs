//! `MINFER_OP_PROFILE=1`: host encode time per kernel and GPU wait per submit.

use std::collections::HashMap;
use std::time::Duration;

#[derive(Default)]
pub struct Profile {
    encode: HashMap<String, (u64, Duration)>,
    submits: Vec<Duration>,
}

impl Profile {
    pub fn encode(&mut self, label: &str, took: Duration) {
        let e = self.encode.entry(label.to_string()).or_default();
        e.0 += 1;
        e.1 += took;
    }

    pub fn submit(&mut self, waited: Duration) {
        if self.submits.is_empty() {
            self.print();
        } else {
            eprintln!(
                "metal profile: submit {} waited {:?}",
                self.submits.len(),
                waited
            );
        }
        self.submits.push(waited);
    }

    /// The top-20 kernels by host encode time.
    pub fn print(&self) {
        let mut rows: Vec<_> = self.encode.iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1 .1));
        eprintln!("metal profile: {:>8} {:>12}  kernel", "count", "encode");
        for (name, (n, t)) in rows.into_iter().take(20) {
            eprintln!("metal profile: {n:>8} {t:>12?}  {name}");
        }
    }
}

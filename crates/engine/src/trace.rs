//! `MINFER_TRACE=<path>` (facts §1.15): per-node output statistics of every forward of a
//! single-shot generation, written as one JSON document.
//!
//! [`Engine::trace_begin`] arms capture on every backend ([`minfer_graph::Executor::capture`]:
//! the CPU copies each node's output after it runs, a device stages it inside its command
//! stream); each forward then records one [`Phase`]: per captured node its name, op,
//! backend, shape and min / max / mean / absmean with at most [`SAMPLE`] downsampled values,
//! and the top five logits of the forward's last logit row. KV stores write persistent
//! regions and have no output, so they never appear; graph inputs are host data, not
//! traced. Statistics cover the forward's real rows only: rows a bucketed backend pads a
//! forward with are left out, so a trace does not depend on the bucket ladder (and the
//! CPU's trace and a device's compare row for row). [`Engine::trace_end`] disarms and hands
//! the [`Trace`] over; [`Trace::to_json`] renders it (token text through a [`TokenBytes`]).

use crate::error::Result;
use crate::model::BatchLogits;
use crate::model::TokenBytes;
use minfer_graph::{capture, Backend, Graph, NodeId};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Most values a node's `sample` holds.
pub const SAMPLE: usize = 64;

/// The `MINFER_TRACE` path, read once per process (empty or unset: no trace).
pub fn env_path() -> Option<&'static Path> {
    static PATH: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    PATH.get_or_init(crate::settings::trace_from_env).as_deref()
}

/// One node's output in one forward.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeStats {
    pub name: String,
    pub op: &'static str,
    pub backend: String,
    /// `[ne0, rows]`: rows counts the forward's real rows only.
    pub shape: [usize; 2],
    pub min: f32,
    pub max: f32,
    pub mean: f64,
    pub absmean: f64,
    /// Values that are NaN, and values that are +-infinity. min / max / mean / absmean are
    /// over the finite values only, so one bad value does not hide the rest of the node
    /// (the counts say it is there).
    pub nan: usize,
    pub inf: usize,
    /// Every `ceil(n / SAMPLE)`-th value, at most [`SAMPLE`].
    pub sample: Vec<f32>,
    /// Nanoseconds the node took, from a backend that times its nodes
    /// ([`minfer_graph::Executor::take_node_times`]; None from one that does not).
    pub ns: Option<u64>,
}

impl NodeStats {
    fn of(name: &str, op: &'static str, backend: String, ne0: usize, v: &[f32]) -> Self {
        let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
        let (mut sum, mut abs) = (0f64, 0f64);
        let (mut nan, mut inf) = (0usize, 0usize);
        for &x in v {
            if x.is_nan() {
                nan += 1;
                continue;
            }
            if x.is_infinite() {
                inf += 1;
                continue;
            }
            min = min.min(x);
            max = max.max(x);
            sum += x as f64;
            abs += (x as f64).abs();
        }
        let n = (v.len() - nan - inf).max(1) as f64;
        if nan + inf == v.len() {
            // No finite value: 0 rather than +-inf (JSON has no infinity).
            (min, max) = (0.0, 0.0);
        }
        let stride = v.len().div_ceil(SAMPLE).max(1);
        NodeStats {
            name: name.to_string(),
            op,
            backend,
            shape: [ne0, v.len() / ne0.max(1)],
            min,
            max,
            mean: sum / n,
            absmean: abs / n,
            nan,
            inf,
            sample: v.iter().step_by(stride).copied().collect(),
            ns: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseKind {
    /// A forward of prompt tokens (a chunk of a long prompt is one phase).
    Prefill,
    /// A forward of one sampled token after the prompt.
    Decode,
}

/// One forward.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub kind: PhaseKind,
    /// Index among the phases of its kind.
    pub step: usize,
    /// The forward's input tokens (real rows).
    pub tokens: Vec<u32>,
    /// Captured nodes in build order.
    pub nodes: Vec<NodeStats>,
    /// Top five `(token, logit)` of the forward's last logit row (empty without logits).
    pub top5: Vec<(u32, f32)>,
    /// The token the sampler chose from this forward's logits ([`Trace::set_chosen`]; None
    /// for a forward whose logits were not sampled, or before the caller said).
    pub chosen: Option<u32>,
}

impl Phase {
    /// One element of the document's `phases` (docs/TRACE.md); `text` renders the input
    /// and chosen tokens.
    pub fn to_json(&self, text: &dyn TokenBytes) -> Value {
        let bytes: Vec<u8> = self
            .tokens
            .iter()
            .flat_map(|&t| text.token_bytes(t))
            .collect();
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                let mut v = json!({
                    "name": n.name, "op": n.op, "backend": n.backend, "shape": n.shape,
                    "min": n.min, "max": n.max, "mean": n.mean, "absmean": n.absmean,
                    "nan": n.nan, "inf": n.inf,
                    "sample": n.sample.iter().map(|&x| f32_json(x)).collect::<Vec<_>>(),
                });
                if let Some(ns) = n.ns {
                    v["ns"] = json!(ns);
                }
                v
            })
            .collect();
        json!({
            "kind": match self.kind {
                PhaseKind::Prefill => "prefill",
                PhaseKind::Decode => "decode",
            },
            "step": self.step,
            "n_tokens": self.tokens.len(),
            "nodes": nodes,
            "top5": self.top5.iter().map(|&(t, l)| json!([t, f32_json(l)])).collect::<Vec<_>>(),
            "text": String::from_utf8_lossy(&bytes),
            "chosen": self.chosen.map(|t| json!({
                "id": t,
                "text": String::from_utf8_lossy(&text.token_bytes(t)),
            })),
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub model: String,
    pub backends: Vec<String>,
    /// Per backend that times its nodes, what its `ns` measure
    /// ([`minfer_graph::Executor::node_time_source`]), in `backends` order.
    pub timing: Vec<(String, String)>,
    pub phases: Vec<Phase>,
}

/// `timing` as a JSON object: backend name to what its node times measure.
pub fn timing_json(timing: &[(String, String)]) -> Value {
    Value::Object(
        timing
            .iter()
            .map(|(b, what)| (b.clone(), json!(what)))
            .collect(),
    )
}

/// A non-finite f32 as JSON: NaN and +-inf have no JSON number, so they are written as the
/// strings "nan", "inf", "-inf" (a sample may hold them; `trace-diff` reads them back).
pub fn f32_json(x: f32) -> Value {
    if x.is_nan() {
        json!("nan")
    } else if x.is_infinite() {
        json!(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        json!(x)
    }
}

impl Trace {
    /// Records the tokens a generation chose, in order: the i-th goes to the i-th phase that
    /// returned logits and has no chosen token yet (the engine runs forwards, the sampler
    /// lives above it, so the caller hands the choices over after the reply). Extra tokens
    /// are ignored; phases left over keep None.
    pub fn set_chosen(&mut self, tokens: &[u32]) {
        let open = self
            .phases
            .iter_mut()
            .filter(|p| !p.top5.is_empty() && p.chosen.is_none());
        for (p, &t) in open.zip(tokens) {
            p.chosen = Some(t);
        }
    }

    /// The `minfer-trace` document, version 1; `text` is the phase's input tokens' text.
    pub fn to_json(&self, text: &dyn TokenBytes) -> Value {
        let phases: Vec<Value> = self.phases.iter().map(|p| p.to_json(text)).collect();
        json!({
            "format": "minfer-trace",
            "version": 1,
            "model": self.model,
            "backends": self.backends,
            "timing": timing_json(&self.timing),
            "phases": phases,
        })
    }

    /// Fills chosen tokens the trace itself shows: a phase with logits followed by a decode
    /// phase chose that phase's input token (what a chat session knows without the
    /// sampler's list). The last choice before a prefill or the end stays None.
    pub fn infer_chosen(&mut self) {
        for i in 1..self.phases.len() {
            let (a, b) = self.phases.split_at_mut(i);
            let (prev, next) = (&mut a[i - 1], &b[0]);
            if prev.chosen.is_none() && !prev.top5.is_empty() && next.kind == PhaseKind::Decode {
                prev.chosen = next.tokens.first().copied();
            }
        }
    }

    /// Writes [`Trace::to_json`] to `path`.
    pub fn write(&self, path: &Path, text: &dyn TokenBytes) -> std::io::Result<()> {
        let s = serde_json::to_string(&self.to_json(text)).map_err(std::io::Error::other)?;
        std::fs::write(path, s)
    }
}

/// The shape of one forward as the trace needs it (its logits are the engine's output).
pub(crate) struct ForwardShape {
    /// Real input tokens, in batch order.
    pub tokens: Vec<u32>,
    /// The graph's token rows (bucketed) and its output rows.
    pub graph_tokens: usize,
    pub graph_out: usize,
}

/// The real rows of a node of `rows` rows: token rows are cut to the real tokens, gathered
/// output rows to the real outputs (at least one: a forward without logits still computes
/// one row).
fn real_rows(rows: usize, f: &ForwardShape, n_out_real: usize) -> usize {
    if rows == f.graph_tokens {
        f.tokens.len()
    } else if rows == f.graph_out {
        n_out_real.max(1).min(rows)
    } else {
        rows
    }
}

fn top5(row: &[f32]) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(6);
    for (i, &l) in row.iter().enumerate() {
        if best.len() < 5 || l > best[best.len() - 1].1 {
            let at = best.iter().position(|&(_, b)| l > b).unwrap_or(best.len());
            best.insert(at, (i as u32, l));
            best.truncate(5);
        }
    }
    best
}

/// Records the forward of `graph` that just ran: the backends' captures and the logits in
/// `out`.
pub(crate) fn record(
    trace: &mut Trace,
    backends: &mut [Box<dyn Backend>],
    graph: &Graph,
    out: &BatchLogits,
    f: ForwardShape,
) -> Result<()> {
    let mut got: Vec<(NodeId, Vec<f32>)> = Vec::new();
    let mut times: std::collections::HashMap<NodeId, u64> = std::collections::HashMap::new();
    for be in backends.iter_mut() {
        got.extend(be.take_captures()?);
        times.extend(be.take_node_times());
    }
    got.sort_by_key(|(id, _)| *id);
    let vocab = out.vocab().max(1);
    let rows = (0..out.n_entries()).map(|i| out.logits(i));
    let n_out_real = rows.clone().map(|l| l.len() / vocab).sum::<usize>();
    let last = rows
        .rev()
        .find(|l| !l.is_empty())
        .map(|l| &l[l.len() - vocab..]);
    let mut nodes = Vec::with_capacity(got.len());
    for (id, v) in &got {
        let Some(node) = graph.nodes.get(id.index()).filter(|n| capture::captured(n)) else {
            continue;
        };
        let [ne0, rows] = node.shape;
        let keep = real_rows(rows, &f, n_out_real) * ne0;
        let backend = node
            .backend
            .map_or_else(|| "?".into(), crate::backends::name_of);
        let v = &v[..keep.min(v.len())];
        let mut stats = NodeStats::of(&node.name, node.op.name(), backend, ne0, v);
        stats.ns = times.get(id).copied();
        nodes.push(stats);
    }
    let had_logits = trace.phases.iter().any(|p| !p.top5.is_empty());
    let kind = if had_logits && f.tokens.len() == 1 {
        PhaseKind::Decode
    } else {
        PhaseKind::Prefill
    };
    let step = trace.phases.iter().filter(|p| p.kind == kind).count();
    trace.phases.push(Phase {
        kind,
        step,
        tokens: f.tokens,
        nodes,
        top5: last.map(top5).unwrap_or_default(),
        chosen: None,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top5_is_sorted_and_keeps_the_first_of_ties() {
        let row = [0.5, 3.0, -1.0, 3.0, 2.0, 9.0, 0.0, 2.5];
        assert_eq!(
            top5(&row),
            vec![(5, 9.0), (1, 3.0), (3, 3.0), (7, 2.5), (4, 2.0)]
        );
        assert_eq!(top5(&[1.0, 2.0]), vec![(1, 2.0), (0, 1.0)]);
    }

    #[test]
    fn stats_and_sample() {
        let v: Vec<f32> = (0..200).map(|i| i as f32 - 100.0).collect();
        let s = NodeStats::of("n", "Add", "cpu".into(), 50, &v);
        assert_eq!(s.shape, [50, 4]);
        assert_eq!((s.min, s.max), (-100.0, 99.0));
        assert_eq!(s.mean, -0.5);
        assert_eq!(s.absmean, 50.0);
        // ceil(200 / 64) = 4: values 0, 4, 8, ...
        assert_eq!(s.sample.len(), 50);
        assert_eq!(s.sample[1], -96.0);
        assert!(NodeStats::of("n", "Add", "cpu".into(), 8, &v[..64])
            .sample
            .len()
            .eq(&SAMPLE));
    }

    /// NaN and Inf are counted, kept out of min / max / mean, and written as strings in the
    /// sample. Control: the finite values' stats are computed by hand ((1 + -3 + 2) / 3).
    #[test]
    fn non_finite_values_are_counted_not_averaged() {
        let v = [1.0, f32::NAN, -3.0, f32::INFINITY, 2.0, f32::NEG_INFINITY];
        let s = NodeStats::of("n", "Add", "cpu".into(), 6, &v);
        assert_eq!((s.nan, s.inf), (1, 2));
        assert_eq!((s.min, s.max), (-3.0, 2.0));
        assert_eq!(s.mean, 0.0);
        assert_eq!(s.absmean, 2.0);
        let all = NodeStats::of("n", "Add", "cpu".into(), 1, &[f32::NAN]);
        assert_eq!((all.min, all.max, all.nan), (0.0, 0.0, 1));
        let j: Vec<Value> = s.sample.iter().map(|&x| f32_json(x)).collect();
        assert_eq!(j[1], json!("nan"));
        assert_eq!((&j[3], &j[5]), (&json!("inf"), &json!("-inf")));
    }

    /// set_chosen fills the phases with logits in order; infer_chosen takes the next decode's
    /// input. Control: a phase without logits (top5 empty) never gets a token.
    #[test]
    fn chosen_tokens_go_to_the_phases_with_logits() {
        let phase = |kind, tokens: Vec<u32>, logits: bool| Phase {
            kind,
            step: 0,
            tokens,
            nodes: vec![],
            top5: if logits { vec![(1, 1.0)] } else { vec![] },
            chosen: None,
        };
        let mut t = Trace {
            model: "m".into(),
            backends: vec![],
            timing: vec![],
            phases: vec![
                phase(PhaseKind::Prefill, vec![1, 2], false),
                phase(PhaseKind::Prefill, vec![3], true),
                phase(PhaseKind::Decode, vec![7], true),
            ],
        };
        let mut u = t.clone();
        t.set_chosen(&[7, 9, 11]);
        let got: Vec<Option<u32>> = t.phases.iter().map(|p| p.chosen).collect();
        assert_eq!(got, [None, Some(7), Some(9)]);
        u.infer_chosen();
        let got: Vec<Option<u32>> = u.phases.iter().map(|p| p.chosen).collect();
        assert_eq!(got, [None, Some(7), None]);
    }
}

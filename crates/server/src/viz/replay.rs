//! Replay mode (`minfer viz --trace FILE`): no model, a saved `minfer-trace` document. The
//! graph is the nodes the trace names (in first-seen order; a trace holds no edges, so none
//! are drawn), and a run plays the trace's phases back as `step` and `token` events. With a
//! second trace (`--diff B`), `hello` carries `minfer trace-diff`'s outcome and the page
//! marks the first node where they part.

use super::{emit, RunRequest, Source, VizState};
use minfer_engine::trace_diff::{check_header, layer_of};
use minfer_graph::viz::{fused_by_name, role_by};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// Pause between replayed phases, so the page shows them one by one.
const STEP_PAUSE: Duration = Duration::from_millis(40);

/// A saved trace the replay refuses, in the words `minfer viz` prints (a usage error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The replayed document (`--trace`) is no trace this viewer reads.
    #[error("{0}")]
    Trace(String),
    /// The second trace (`--diff B`) cannot be compared with it.
    #[error("--diff {file}: {why}")]
    Diff { file: String, why: String },
}

fn text<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// The graph of a trace: every node name once, with the op, shape and backend of its first
/// appearance. Refuses a document that is not a `minfer-trace` version 1 or has no phases.
pub fn graph_of(doc: &Value) -> Result<Value, ReplayError> {
    let bad = ReplayError::Trace;
    check_header(doc, "--trace").map_err(|e| bad(e.0))?;
    let phases = doc
        .get("phases")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("--trace: no \"phases\" array".into()))?;
    if phases.is_empty() {
        return Err(bad("--trace: the trace has no phases".into()));
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut nodes = Vec::new();
    for (i, p) in phases.iter().enumerate() {
        let list = p
            .get("nodes")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(format!("--trace: phase {i} has no \"nodes\" array")))?;
        for n in list {
            let name = text(n, "name");
            if name.is_empty() {
                return Err(bad(format!("--trace: phase {i} has a node without a name")));
            }
            if seen.contains_key(name) {
                continue;
            }
            seen.insert(name.to_string(), nodes.len());
            let op = text(n, "op");
            nodes.push(json!({
                "id": nodes.len(),
                "name": name,
                "op": op,
                "shape": n.get("shape").cloned().unwrap_or(Value::Null),
                "dtype": "F32",
                "backend": n.get("backend").cloned().unwrap_or(Value::Null),
                "layer": layer_of(name),
                "role": role_by(op, name, name == "logits"),
                "weight": Value::Null,
                "weight_type": Value::Null,
                "fused": fused_by_name(op),
            }));
        }
    }
    let n_layers = nodes
        .iter()
        .filter_map(|n| n["layer"].as_u64())
        .max()
        .map_or(0, |l| l + 1);
    Ok(
        json!({"output": nodes.len().saturating_sub(1), "n_layers": n_layers,
              "nodes": nodes, "edges": [], "replay": true}),
    )
}

/// `minfer trace-diff` of `a` (the replayed trace) against `b`, as the page shows it: the
/// outcome's JSON (`status`, `at`, `field`, `a`, `b`, …) with `file`, B's name.
pub fn diff_of(a: &Value, b: &Value, tol: f64, file: &str) -> Result<Value, ReplayError> {
    let mut out = minfer_engine::trace_diff::diff(a, b, tol)
        .map_err(|e| ReplayError::Diff {
            file: file.into(),
            why: e.0,
        })?
        .to_json(tol);
    out["file"] = json!(file);
    Ok(out)
}

impl VizState {
    /// Replay mode over a parsed trace document; `diff` ([`diff_of`]) marks where a second
    /// trace parts from it.
    pub fn replay(
        doc: Value,
        file: &str,
        diff: Option<Value>,
    ) -> Result<Arc<VizState>, ReplayError> {
        let graph = graph_of(&doc)?;
        let hello = json!({
            "diff": diff,
            "mode": "replay",
            "model": doc.get("model").cloned().unwrap_or(Value::Null),
            "file": file,
            "n_nodes": graph["nodes"].as_array().map_or(0, Vec::len),
            "n_phases": doc["phases"].as_array().map_or(0, Vec::len),
            "timing": doc.get("timing").cloned().unwrap_or(Value::Null),
        });
        let (st, _) = VizState::new(graph, hello, Source::Replay(Arc::new(doc)));
        Ok(Arc::new(st))
    }
}

/// One replayed run: every phase as a `step`, its chosen token as a `token`; `max_tokens`
/// and the prompt do not apply (the trace is what it is).
pub async fn play(
    doc: Arc<Value>,
    r: RunRequest,
    events: broadcast::Sender<String>,
    busy: Arc<AtomicBool>,
) {
    let phases = doc["phases"].as_array().cloned().unwrap_or_default();
    emit(
        &events,
        json!({"type": "run_start", "run": r.id, "prompt": text(&phases[0], "text"),
               "armed": true, "replay": true}),
    );
    let mut tokens = 0;
    for (i, p) in phases.iter().enumerate() {
        emit(
            &events,
            json!({"type": "step", "run": r.id, "index": i, "phase": p}),
        );
        if let Some(c) = p.get("chosen").filter(|c| c.is_object()) {
            tokens += 1;
            emit(
                &events,
                json!({"type": "token", "run": r.id, "id": c["id"], "text": c["text"],
                       "piece": c["text"]}),
            );
        }
        tokio::time::sleep(STEP_PAUSE).await;
    }
    emit(
        &events,
        json!({"type": "run_end", "run": r.id, "finish": "replay", "tokens": tokens,
               "steps": phases.len()}),
    );
    busy.store(false, Ordering::SeqCst);
}

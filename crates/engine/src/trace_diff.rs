//! `minfer trace-diff`: the first place two `minfer-trace` documents (docs/TRACE.md) part,
//! in execution order: phase by phase, node by node, then the phase's top five logits and
//! the token chosen. It reads the JSON documents, not [`crate::trace::Trace`], so traces of
//! two builds, two backends or two machines compare as written.
//!
//! Two nodes correspond when their name, op and shape are the same; the first pair that does
//! not (or a phase or node count that differs) is a [`Outcome::Mismatch`]: the graphs
//! differ, and numbers past that point would compare unlike things. Values compare in the
//! node's scale: `|a - b| / scale <= tol`, scale being the largest |min| or |max| either
//! trace saw for that node (an f32 kernel's error grows with the magnitudes it handles, so
//! an absolute tolerance would be too loose on small nodes and too tight on large ones);
//! a node that is all zeros in both compares absolutely. NaN / Inf counts and the chosen
//! token compare exactly.

use serde_json::{json, Value};

/// One node (or the phase's logits) as both traces report it.
#[derive(Clone, Debug, PartialEq)]
pub struct Place {
    /// Index of the phase in the document, its kind ("prefill" / "decode") and step.
    pub phase: usize,
    pub kind: String,
    pub step: u64,
    /// Index of the node in the phase (None: the phase's logits or chosen token).
    pub node: Option<usize>,
    pub name: String,
    pub op: String,
    pub shape: Vec<u64>,
    /// The layer, from a `blk.N.` name prefix (None for nodes outside the layers).
    pub layer: Option<u64>,
    pub backend_a: String,
    pub backend_b: String,
}

/// The first value beyond the tolerance.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    pub at: Place,
    /// Which value: "min", "max", "mean", "absmean", "nan", "inf", "sample[i]", "top5[i]",
    /// "chosen".
    pub field: String,
    pub a: Value,
    pub b: Value,
    /// `|a - b| / scale` (infinite for an exact field that differs).
    pub err: f64,
    pub scale: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every value within the tolerance: phases and nodes compared.
    Agree {
        phases: usize,
        nodes: usize,
    },
    Differ(Box<Difference>),
    /// The graphs do not correspond: `what` says how; `at` names the first node (when a node
    /// is the cause) in trace A's terms, `other` the same position in B.
    Mismatch {
        what: String,
        at: Option<Box<Place>>,
        other: Option<String>,
    },
}

/// A document that is not a `minfer-trace` version 1 (its own message names the field).
#[derive(Clone, Debug, PartialEq)]
pub struct FormatError(pub String);

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FormatError {}

type R<T> = Result<T, FormatError>;

fn field<'a>(v: &'a Value, k: &str, ctx: &str) -> R<&'a Value> {
    v.get(k)
        .ok_or_else(|| FormatError(format!("{ctx}: no \"{k}\"")))
}

fn array<'a>(v: &'a Value, k: &str, ctx: &str) -> R<&'a Vec<Value>> {
    field(v, k, ctx)?
        .as_array()
        .ok_or_else(|| FormatError(format!("{ctx}: \"{k}\" is not an array")))
}

fn text(v: &Value, k: &str, ctx: &str) -> R<String> {
    field(v, k, ctx)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| FormatError(format!("{ctx}: \"{k}\" is not a string")))
}

/// A number as the trace writes it: a JSON number, or "nan" / "inf" / "-inf".
fn num(v: &Value, ctx: &str) -> R<f64> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| FormatError(format!("{ctx}: not a number"))),
        Value::String(s) if s == "nan" => Ok(f64::NAN),
        Value::String(s) if s == "inf" => Ok(f64::INFINITY),
        Value::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
        _ => Err(FormatError(format!("{ctx}: {v} is not a number"))),
    }
}

/// Checks the header; `which` ("A" / "B") names the document in errors.
pub fn check_header(doc: &Value, which: &str) -> R<()> {
    if doc.get("format").and_then(Value::as_str) != Some("minfer-trace") {
        return Err(FormatError(format!(
            "{which}: not a minfer trace (\"format\" is not \"minfer-trace\")"
        )));
    }
    match doc.get("version").and_then(Value::as_u64) {
        Some(1) => Ok(()),
        v => Err(FormatError(format!(
            "{which}: trace version {} (this build reads version 1)",
            v.map_or_else(|| "missing".into(), |v| v.to_string())
        ))),
    }
}

/// The layer of a node named `L<N>.…` (the graph builders' names) or `blk.<N>.…` (GGUF's).
pub fn layer_of(name: &str) -> Option<u64> {
    let rest = name
        .strip_prefix("blk.")
        .or_else(|| name.strip_prefix('L'))?;
    rest.split('.').next()?.parse().ok()
}

/// How far apart two values are in `scale` (both NaN, or the same infinity: 0).
fn rel(a: f64, b: f64, scale: f64) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0.0;
    }
    let d = (a - b).abs();
    if d.is_nan() {
        return f64::INFINITY;
    }
    if scale > 0.0 {
        d / scale
    } else {
        d
    }
}

/// Compares documents `a` and `b` (both checked with [`check_header`] first).
pub fn diff(a: &Value, b: &Value, tol: f64) -> R<Outcome> {
    check_header(a, "A")?;
    check_header(b, "B")?;
    let pa = array(a, "phases", "A")?;
    let pb = array(b, "phases", "B")?;
    let mut n_nodes = 0;
    for (i, (xa, xb)) in pa.iter().zip(pb).enumerate() {
        let (ca, cb) = (format!("A phase {i}"), format!("B phase {i}"));
        let kind = text(xa, "kind", &ca)?;
        let step = field(xa, "step", &ca)?.as_u64().unwrap_or(0);
        let head = |x: &Value, c: &str| -> R<(String, Option<u64>, Option<u64>)> {
            Ok((
                text(x, "kind", c)?,
                field(x, "step", c)?.as_u64(),
                field(x, "n_tokens", c)?.as_u64(),
            ))
        };
        let (ha, hb) = (head(xa, &ca)?, head(xb, &cb)?);
        if ha != hb {
            return Ok(Outcome::Mismatch {
                what: format!(
                    "phase {i}: A is {} step {:?} of {:?} tokens, B is {} step {:?} of {:?} tokens",
                    ha.0, ha.1, ha.2, hb.0, hb.1, hb.2
                ),
                at: None,
                other: None,
            });
        }
        let na = array(xa, "nodes", &ca)?;
        let nb = array(xb, "nodes", &cb)?;
        for (j, (ya, yb)) in na.iter().zip(nb).enumerate() {
            let (ca, cb) = (
                format!("A phase {i} node {j}"),
                format!("B phase {i} node {j}"),
            );
            let name = text(ya, "name", &ca)?;
            let op = text(ya, "op", &ca)?;
            let shape: Vec<u64> = array(ya, "shape", &ca)?
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            let place = Place {
                phase: i,
                kind: kind.clone(),
                step,
                node: Some(j),
                layer: layer_of(&name),
                name: name.clone(),
                op: op.clone(),
                shape: shape.clone(),
                backend_a: text(ya, "backend", &ca)?,
                backend_b: text(yb, "backend", &cb)?,
            };
            let (name_b, op_b) = (text(yb, "name", &cb)?, text(yb, "op", &cb)?);
            let shape_b: Vec<u64> = array(yb, "shape", &cb)?
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            if (&name, &op, &shape) != (&name_b, &op_b, &shape_b) {
                return Ok(Outcome::Mismatch {
                    what: format!("phase {i} node {j}: the nodes do not correspond"),
                    at: Some(Box::new(place)),
                    other: Some(format!("{name_b} ({op_b}, shape {shape_b:?})")),
                });
            }
            if let Some(d) = node_diff(ya, yb, &ca, &cb, tol, &place)? {
                return Ok(Outcome::Differ(Box::new(d)));
            }
            n_nodes += 1;
        }
        if na.len() != nb.len() {
            let first = na.get(nb.len()).or_else(|| nb.get(na.len()));
            let name = first
                .and_then(|n| n.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            return Ok(Outcome::Mismatch {
                what: format!(
                    "phase {i}: A has {} nodes, B {}; the first without a counterpart is {name}",
                    na.len(),
                    nb.len()
                ),
                at: None,
                other: None,
            });
        }
        if let Some(d) = logits_diff(xa, xb, &ca, &cb, tol, i, &kind, step)? {
            return Ok(Outcome::Differ(Box::new(d)));
        }
    }
    if pa.len() != pb.len() {
        return Ok(Outcome::Mismatch {
            what: format!("A has {} phases, B {}", pa.len(), pb.len()),
            at: None,
            other: None,
        });
    }
    Ok(Outcome::Agree {
        phases: pa.len(),
        nodes: n_nodes,
    })
}

fn node_diff(
    a: &Value,
    b: &Value,
    ca: &str,
    cb: &str,
    tol: f64,
    at: &Place,
) -> R<Option<Difference>> {
    let mut scale = 0f64;
    for (x, c) in [(a, ca), (b, cb)] {
        for k in ["min", "max"] {
            scale = scale.max(num(field(x, k, c)?, c)?.abs());
        }
    }
    let out = |f: String, va: &Value, vb: &Value, err: f64| Difference {
        at: at.clone(),
        field: f,
        a: va.clone(),
        b: vb.clone(),
        err,
        scale,
    };
    // Exact counts first: a NaN is the loudest difference there is.
    for k in ["nan", "inf"] {
        let (va, vb) = (field(a, k, ca)?, field(b, k, cb)?);
        if va != vb {
            return Ok(Some(out(k.into(), va, vb, f64::INFINITY)));
        }
    }
    for k in ["min", "max", "mean", "absmean"] {
        let (va, vb) = (field(a, k, ca)?, field(b, k, cb)?);
        let err = rel(num(va, ca)?, num(vb, cb)?, scale);
        if err > tol {
            return Ok(Some(out(k.into(), va, vb, err)));
        }
    }
    let (sa, sb) = (array(a, "sample", ca)?, array(b, "sample", cb)?);
    if sa.len() != sb.len() {
        let (la, lb) = (json!(sa.len()), json!(sb.len()));
        return Ok(Some(out("sample length".into(), &la, &lb, f64::INFINITY)));
    }
    for (k, (va, vb)) in sa.iter().zip(sb).enumerate() {
        let err = rel(num(va, ca)?, num(vb, cb)?, scale);
        if err > tol {
            return Ok(Some(out(format!("sample[{k}]"), va, vb, err)));
        }
    }
    Ok(None)
}

#[allow(clippy::too_many_arguments)]
fn logits_diff(
    a: &Value,
    b: &Value,
    ca: &str,
    cb: &str,
    tol: f64,
    phase: usize,
    kind: &str,
    step: u64,
) -> R<Option<Difference>> {
    let (ta, tb) = (array(a, "top5", ca)?, array(b, "top5", cb)?);
    let logit = |e: &Value, c: &str| -> R<f64> {
        num(
            e.get(1)
                .ok_or_else(|| FormatError(format!("{c}: top5 entry {e}")))?,
            c,
        )
    };
    let mut scale = 0f64;
    for (t, c) in [(ta, ca), (tb, cb)] {
        for e in t {
            scale = scale.max(logit(e, c)?.abs());
        }
    }
    let place = Place {
        phase,
        kind: kind.into(),
        step,
        node: None,
        name: "logits".into(),
        op: "top5".into(),
        shape: vec![ta.len() as u64],
        layer: None,
        backend_a: String::new(),
        backend_b: String::new(),
    };
    let out = |f: String, va: &Value, vb: &Value, err: f64| Difference {
        at: place.clone(),
        field: f,
        a: va.clone(),
        b: vb.clone(),
        err,
        scale,
    };
    if ta.len() != tb.len() {
        let (la, lb) = (json!(ta.len()), json!(tb.len()));
        return Ok(Some(out("top5 length".into(), &la, &lb, f64::INFINITY)));
    }
    // Values by rank: two near-equal logits may swap ids within the tolerance.
    for (k, (ea, eb)) in ta.iter().zip(tb).enumerate() {
        let err = rel(logit(ea, ca)?, logit(eb, cb)?, scale);
        if err > tol {
            return Ok(Some(out(format!("top5[{k}]"), ea, eb, err)));
        }
    }
    let id = |x: &Value| x.get("chosen").and_then(|c| c.get("id")).cloned();
    if let (Some(ia), Some(ib)) = (id(a), id(b)) {
        if ia != ib {
            let (va, vb) = (&a["chosen"], &b["chosen"]);
            return Ok(Some(out("chosen".into(), va, vb, f64::INFINITY)));
        }
    }
    Ok(None)
}

impl Place {
    /// `prefill step 0, node 17 "L0.up" (MulMat, shape [128, 5], layer 0, backend
    /// cpu | metal-emu)`.
    pub fn describe(&self) -> String {
        let node = self
            .node
            .map_or_else(String::new, |n| format!(", node {n}"));
        let layer = self
            .layer
            .map_or_else(String::new, |l| format!(", layer {l}"));
        let backend = if self.backend_a.is_empty() {
            String::new()
        } else if self.backend_a == self.backend_b {
            format!(", backend {}", self.backend_a)
        } else {
            format!(", backend {} | {}", self.backend_a, self.backend_b)
        };
        format!(
            "{} step {}{node} \"{}\" ({}, shape {:?}{layer}{backend})",
            self.kind, self.step, self.name, self.op, self.shape
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "phase": self.phase, "kind": self.kind, "step": self.step, "node": self.node,
            "name": self.name, "op": self.op, "shape": self.shape, "layer": self.layer,
            "backend_a": self.backend_a, "backend_b": self.backend_b,
        })
    }
}

impl Outcome {
    /// The result for scripts: `{"status": "agree" | "differ" | "mismatch", ...}`.
    pub fn to_json(&self, tol: f64) -> Value {
        match self {
            Outcome::Agree { phases, nodes } => {
                json!({"status": "agree", "tol": tol, "phases": phases, "nodes": nodes})
            }
            Outcome::Differ(d) => json!({
                "status": "differ", "tol": tol, "at": d.at.to_json(), "field": d.field,
                "a": d.a, "b": d.b,
                "err": if d.err.is_finite() { json!(d.err) } else { json!("inf") },
                "scale": d.scale,
            }),
            Outcome::Mismatch { what, at, other } => json!({
                "status": "mismatch", "tol": tol, "what": what,
                "at": at.as_ref().map(|p| p.to_json()), "other": other,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, mean: f32, sample: Vec<Value>) -> Value {
        json!({"name": name, "op": "Add", "backend": "cpu", "shape": [4, 1],
               "min": -2.0, "max": 2.0, "mean": mean, "absmean": 1.0, "nan": 0, "inf": 0,
               "sample": sample})
    }

    fn doc(nodes: Vec<Value>) -> Value {
        json!({"format": "minfer-trace", "version": 1, "model": "m", "backends": ["cpu"],
               "phases": [{"kind": "prefill", "step": 0, "n_tokens": 1, "nodes": nodes,
                           "top5": [[3, 1.5]], "text": "x", "chosen": {"id": 3, "text": "c"}}]})
    }

    /// Control: the same document agrees at any tolerance; a mean moved by 1e-2 of the
    /// node's scale (2.0) is reported at 1e-3 and not at 1e-1.
    #[test]
    fn a_moved_mean_is_found_in_the_nodes_scale() {
        let s = || vec![json!(1.0), json!("nan")];
        let a = doc(vec![node("x", 0.5, s()), node("blk.3.y", 0.25, s())]);
        let b = doc(vec![node("x", 0.5, s()), node("blk.3.y", 0.27, s())]);
        assert_eq!(
            diff(&a, &a, 0.0).unwrap(),
            Outcome::Agree {
                phases: 1,
                nodes: 2
            }
        );
        let Outcome::Differ(d) = diff(&a, &b, 1e-3).unwrap() else {
            panic!("no difference found")
        };
        assert_eq!(
            (d.at.name.as_str(), d.at.layer, d.field.as_str()),
            ("blk.3.y", Some(3), "mean")
        );
        assert!((d.err - 0.01).abs() < 1e-6, "{}", d.err);
        assert!(matches!(diff(&a, &b, 1e-1).unwrap(), Outcome::Agree { .. }));
    }

    /// A renamed node is a mismatch (not a difference); a document of another format is a
    /// format error naming the field.
    #[test]
    fn mismatches_and_format_errors() {
        let a = doc(vec![node("x", 0.5, vec![])]);
        let b = doc(vec![node("z", 0.5, vec![])]);
        let Outcome::Mismatch { at, other, .. } = diff(&a, &b, 1e-3).unwrap() else {
            panic!("not a mismatch")
        };
        assert_eq!(at.unwrap().name, "x");
        assert!(other.unwrap().starts_with("z "));
        let c = doc(vec![node("x", 0.5, vec![]), node("y", 0.5, vec![])]);
        assert!(matches!(
            diff(&a, &c, 1e-3).unwrap(),
            Outcome::Mismatch { .. }
        ));
        let mut bad = a.clone();
        bad["format"] = json!("minfer-graph");
        assert!(diff(&a, &bad, 1e-3)
            .unwrap_err()
            .0
            .contains("B: not a minfer trace"));
        let mut v2 = a.clone();
        v2["version"] = json!(2);
        assert!(diff(&v2, &a, 1e-3).unwrap_err().0.contains("version 2"));
    }
}

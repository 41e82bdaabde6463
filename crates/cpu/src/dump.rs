//! `MINFER_DUMP_DIR`: a diagnostic for layer-by-layer comparisons with llama.cpp
//! (`scripts/peer-logprobs`).

use crate::as_bytes;
use minfer_graph::Node;

/// Writes `out` to `DIR/<node name>.bin` (header 4 x i64 shape, then f32 values),
/// overwriting the previous step's.
pub(crate) fn dump_node(dir: &std::path::Path, node: &Node, out: &[f32]) {
    let name: String = node
        .name
        .chars()
        .map(|c| if c == '/' || c == ' ' { '_' } else { c })
        .collect();
    let mut bytes = Vec::with_capacity(32 + 4 * out.len());
    for d in [node.shape[0], node.shape[1], 1, 1] {
        bytes.extend_from_slice(&(d as i64).to_le_bytes());
    }
    bytes.extend_from_slice(as_bytes(out));
    if let Err(e) = std::fs::write(dir.join(format!("{name}.bin")), bytes) {
        tracing::warn!("MINFER_DUMP_DIR: cannot write {name}: {e}");
    }
}

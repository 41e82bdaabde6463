//! A sequence's KV cell operations ([`Op::KvCopy`], [`Op::KvRopeShift`]): nodes of the
//! engine's cell-op graph, encoded into the split's command buffer like any node.

use minfer_gguf::GgmlType;
use minfer_graph::{ExecArgs, KvKind, Node, Op};

use super::MetalBackend;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch;

fn shape(reason: String) -> Error {
    Error::Shape {
        op: "kv_cells",
        reason,
    }
}

/// Why Metal cannot run a cell op (None: it can): a shift rotates f32 and f16 rows in
/// place; a q8_0 row would be re-quantized.
pub(super) fn refusal(op: &Op) -> Option<String> {
    match op {
        Op::KvCopy { layout, .. } => super::exec::kv_refusal(layout.cache_type),
        Op::KvRopeShift { layout, .. } => match layout.cache_type {
            GgmlType::F32 | GgmlType::F16 => None,
            other => Some(format!(
                "a {other} KV cache cannot shift positions on Metal"
            )),
        },
        _ => None,
    }
}

impl<D: Device> MetalBackend<D>
where
    D::Buffer: Clone,
{
    pub(super) fn encode_cell_op(&mut self, node: &Node, args: &ExecArgs) -> Result<()> {
        let pair = args
            .kv
            .ok_or_else(|| shape("the layer has no KV regions".into()))?;
        let region = |id: minfer_graph::BufId| {
            self.pool
                .get(id.0)
                .cloned()
                .ok_or_else(|| shape(format!("the KV region {} does not exist", id.0)))
        };
        match node.op {
            Op::KvCopy {
                kind,
                layout,
                src,
                dst,
                n,
                ..
            } => {
                if n == 0 || src == dst {
                    return Ok(());
                }
                let b = region(match kind {
                    KvKind::K => pair.k,
                    KvKind::V => pair.v,
                })?;
                // copy_rows moves row by row in the overlap-safe order (ascending when
                // moving down).
                self.dev.copy_rows(
                    &b,
                    &b,
                    layout.cell_bytes as u64,
                    src as u64,
                    dst as u64,
                    n as u64,
                )
            }
            Op::KvRopeShift {
                layout,
                rope,
                cell,
                n,
                delta,
                ..
            } => {
                if n == 0 || delta == 0 {
                    return Ok(());
                }
                // The launch refuses q8_0 (and bad ranges) itself.
                let kv = Self::kv_type("kv_rope_shift", layout.cache_type)?;
                let b = region(pair.k)?;
                let n_cells = self.dev.buffer_len(&b) / layout.cell_bytes.max(1);
                launch::launch_kv_rope_shift(
                    &self.dev,
                    kv,
                    &b,
                    layout.n_head_kv,
                    layout.head_dim,
                    n_cells,
                    cell,
                    n,
                    delta,
                    rope.freq_base,
                    rope.freq_scale,
                    rope.style,
                )
            }
            _ => Err(shape(format!("{} is not a cell op", node.op.name()))),
        }
    }
}

//! A sequence's KV cell operations on the device ([`Op::KvCopy`], [`Op::KvRopeShift`]):
//! nodes of the engine's cell-op graph, run eagerly on the stream (never recorded for
//! replay: each is one sequence's one-off edit of the regions).

use minfer_gguf::GgmlType;
use minfer_graph::{move_plan, ExecArgs, KvKind, KvLayout, Node, Op, RopeSpec, RopeStyle};

use crate::backend::{theta_scale, CudaBackend};
use crate::device::{Arg, DResult};

/// Why CUDA cannot run a cell op (`None`: it can).
pub(crate) fn cell_op_refusal(op: &Op) -> Option<String> {
    match op {
        Op::KvRopeShift { layout, .. } => shift_type(layout.cache_type).err().or_else(|| {
            (!layout.head_dim.is_multiple_of(2))
                .then(|| format!("RoPE needs an even head dim, not {}", layout.head_dim))
        }),
        _ => None,
    }
}

fn shift_type(ty: GgmlType) -> DResult<i32> {
    match ty {
        GgmlType::F32 => Ok(0),
        GgmlType::F16 => Ok(1),
        other => Err(format!("a {other} KV cache cannot shift positions")),
    }
}

impl CudaBackend {
    /// Runs a cell-op node on the regions in `args.kv`.
    pub(crate) fn encode_cell_op(&mut self, node: &Node, args: &ExecArgs) -> DResult<()> {
        let kv = args.kv.ok_or("a cell op without its KV regions")?;
        match node.op {
            Op::KvCopy {
                kind,
                layout,
                src,
                dst,
                n,
                ..
            } => {
                let region = match kind {
                    KvKind::K => kv.k,
                    KvKind::V => kv.v,
                };
                self.copy_cells(region, layout.cell_bytes, src, dst, n)
            }
            Op::KvRopeShift {
                layout,
                rope,
                cell,
                n,
                delta,
                ..
            } => self.rope_shift_cells(kv.k, &layout, &rope, cell, n, delta),
            _ => Err(format!("{} is not a cell op", node.op.name())),
        }
    }

    fn copy_cells(
        &mut self,
        region: minfer_graph::BufId,
        cell_bytes: usize,
        src: usize,
        dst: usize,
        n: usize,
    ) -> DResult<()> {
        if n == 0 || src == dst {
            return Ok(());
        }
        let (ptr, len) = self.buf(region)?;
        if (src.max(dst) + n) * cell_bytes > len {
            return Err(format!(
                "copy of {n} cells {src} -> {dst} outside a region of {} cells",
                len / cell_bytes.max(1)
            ));
        }
        self.mirror.remove(&region.0);
        // Chunks no longer than the distance never overlap themselves; move_plan orders them.
        let chunk = src.abs_diff(dst).min(n);
        for (s, d, l) in move_plan(src, dst, n, chunk) {
            self.gpu.copy_d2d(
                ptr + (d * cell_bytes) as u64,
                ptr + (s * cell_bytes) as u64,
                l * cell_bytes,
            )?;
        }
        Ok(())
    }

    fn rope_shift_cells(
        &mut self,
        k_region: minfer_graph::BufId,
        layout: &KvLayout,
        rope: &RopeSpec,
        cell: usize,
        n: usize,
        delta: i64,
    ) -> DResult<()> {
        if n == 0 || delta == 0 {
            return Ok(());
        }
        let ty = shift_type(layout.cache_type)?;
        if !layout.head_dim.is_multiple_of(2) {
            return Err(format!(
                "RoPE needs an even head dim, not {}",
                layout.head_dim
            ));
        }
        let delta = i32::try_from(delta).map_err(|_| format!("shift {delta} too far"))?;
        let (ptr, len) = self.buf(k_region)?;
        if (cell + n) * layout.cell_bytes > len {
            return Err(format!("cells {cell}..{} outside the region", cell + n));
        }
        self.mirror.remove(&k_region.0);
        let half = layout.head_dim / 2;
        let total = n * layout.n_head_kv * half;
        self.gpu.launch(
            "mf_kv_rope_shift",
            (total.div_ceil(256) as u32, 1, 1),
            256,
            &[
                Arg::I32(ty),
                Arg::U64(ptr),
                Arg::U64(layout.cell_bytes as u64),
                Arg::I32(cell as i32),
                Arg::I32(n as i32),
                Arg::I32(layout.n_head_kv as i32),
                Arg::I32(layout.head_dim as i32),
                Arg::I32(delta),
                Arg::F32(theta_scale(rope.freq_base, layout.head_dim)),
                Arg::F32(rope.freq_scale),
                Arg::I32((rope.style == RopeStyle::Neox) as i32),
            ],
        )
    }
}

//! One node to dispatches (seed §4.4): buffers resolved from the pool and the resident
//! weights, shapes checked, the launch fn of the op's kernel family called. What the kernels
//! cannot run is refused here by name, before any dispatch.

use minfer_gguf::GgmlType;
use minfer_graph::{ExecArgs, KvKind, Node, Op, RowClass, RowClasses, WeightSource, WindowLayout};

use super::{grown, MetalBackend};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{self, KvType, WindowAttn, WindowKind};

/// Largest head dim the classic (any-shape) attention kernel takes.
const MAX_HEAD_DIM: usize = 512;

/// Why a weight matrix of `ty` with rows of `ne0` cannot run on the device (None: it can):
/// every tier's kernel must exist and the row must split into whole blocks of 16-element
/// chunks (K-quants: whole 256-element super-blocks).
pub(crate) fn matrix_refusal<D: Device>(dev: &D, ty: GgmlType, ne0: usize) -> Option<String> {
    let suffix = match launch::matmul_kernel_suffix("matmul", ty) {
        Ok(s) => s,
        Err(e) => return Some(e.to_string()),
    };
    for k in [
        format!("kernel_mv_{suffix}_f32"),
        format!("kernel_mv_multi_{suffix}_f32"),
        format!("kernel_get_rows_{suffix}"),
    ] {
        if dev.pipeline(&k).is_err() {
            return Some(format!("{ty} weights: the library has no kernel {k}"));
        }
    }
    let block = ty.block_size() as usize;
    if !ne0.is_multiple_of(block) || !ne0.is_multiple_of(16) {
        return Some(format!(
            "{ty} rows of {ne0} elements are not whole {block}-element blocks of 16-element chunks"
        ));
    }
    None
}

/// Why `op` cannot run on the device, per op, weight type and shape (None: it can).
pub(crate) fn op_refusal<D: Device>(
    dev: &D,
    op: &Op,
    weights: &dyn WeightSource,
) -> Option<String> {
    let matrix = |id| match weights.weight(id) {
        None => Some(format!("weight {} is not in the model", weights.name(id))),
        Some(w) if w.ne1 == 1 => Some(format!("{} is a vector, not a matrix", weights.name(id))),
        Some(w) => {
            matrix_refusal(dev, w.ty, w.ne0).map(|why| format!("{}: {why}", weights.name(id)))
        }
    };
    let vector = |id| match weights.weight(id) {
        Some(w) if w.ne1 == 1 => None,
        _ => Some(format!("{} is not a one-row weight", weights.name(id))),
    };
    match op {
        Op::GetRows { weight } => matrix(*weight),
        Op::MatMul { weight, bias } => matrix(*weight).or_else(|| bias.and_then(vector)),
        Op::RmsNorm { weight, .. } => vector(*weight),
        Op::KvStore { cache_type, .. } => kv_refusal(*cache_type),
        Op::KvCopy { .. } | Op::KvRopeShift { .. } => super::cells::refusal(op),
        Op::Attention {
            cache_type,
            head_dim,
            n_head,
            n_head_kv,
            ..
        } => kv_refusal(*cache_type).or_else(|| {
            if *head_dim == 0 || *head_dim > MAX_HEAD_DIM {
                Some(format!("head dim {head_dim} outside 1..={MAX_HEAD_DIM}"))
            } else if *n_head_kv == 0 || !n_head.is_multiple_of(*n_head_kv) {
                Some(format!("{n_head} query heads over {n_head_kv} KV heads"))
            } else {
                None
            }
        }),
        Op::Rope { head_dim, .. } if !head_dim.is_multiple_of(2) => {
            Some(format!("RoPE over an odd head dim {head_dim}"))
        }
        Op::QkvRopeStore(_) | Op::FfnGateUp { .. } | Op::MatMulAdd { .. } => {
            super::fused::refusal(dev, op, weights)
        }
        Op::Input(_)
        | Op::SelectRows
        | Op::Rope { .. }
        | Op::Add
        | Op::Mul
        | Op::Silu
        | Op::SwiGLU => None,
    }
}

pub(super) fn kv_refusal(ty: GgmlType) -> Option<String> {
    super::METAL_KV_TYPES
        .contains(&ty)
        .then_some(())
        .map_or_else(
            || Some(format!("no Metal kernels for a {ty} KV cache")),
            |_| None,
        )
}

pub(super) fn shape(op: &'static str, reason: String) -> Error {
    Error::Shape { op, reason }
}

/// Bytes of one KV cell as the kernels lay it out; a packed q8_0 row must be whole f32
/// words, as the graph's region sizes (the GGUF row size) are.
pub(super) fn cell_bytes(
    op: &'static str,
    kv: KvType,
    ty: GgmlType,
    n_embd_kv: usize,
) -> Result<usize> {
    let graph = ty.row_bytes(n_embd_kv as u64).ok_or_else(|| {
        shape(
            op,
            format!("a KV row of {n_embd_kv} is not whole {ty} blocks"),
        )
    })? as usize;
    if kv == KvType::Q8_0 && graph != launch::q8_0_row_bytes(n_embd_kv) {
        return Err(shape(
            op,
            format!(
                "a q8_0 KV row of {n_embd_kv} elements is {graph} bytes, not whole 4-byte \
                 words (the Metal kernels need an even number of 32-element blocks)"
            ),
        ));
    }
    Ok(graph)
}

impl<D: Device> MetalBackend<D>
where
    D::Buffer: Clone,
{
    pub(super) fn src(&self, args: &ExecArgs, i: usize) -> Result<D::Buffer> {
        let id = args
            .srcs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| shape("node", format!("src {i} has no buffer")))?;
        self.pool
            .get(id.0)
            .cloned()
            .ok_or_else(|| shape("node", format!("src {i}: buffer {} does not exist", id.0)))
    }

    pub(super) fn out(&self, node: &Node, args: &ExecArgs) -> Result<D::Buffer> {
        let id = args
            .out
            .ok_or_else(|| shape("node", "no output buffer".into()))?;
        let b = self
            .pool
            .get(id.0)
            .cloned()
            .ok_or_else(|| shape("node", format!("output buffer {} does not exist", id.0)))?;
        if self.dev.buffer_len(&b) < node.n_bytes() {
            return Err(shape(
                "node",
                format!(
                    "output buffer holds {} bytes, node needs {}",
                    self.dev.buffer_len(&b),
                    node.n_bytes()
                ),
            ));
        }
        Ok(b)
    }

    fn matrix(
        &self,
        weights: &dyn WeightSource,
        id: minfer_graph::WeightId,
    ) -> Result<(D::Buffer, super::resident::Matrix)> {
        self.weights
            .matrix(id)
            .map(|(b, m)| (b.clone(), m))
            .ok_or_else(|| {
                shape(
                    "weight",
                    format!("{} is not registered on the device", weights.name(id)),
                )
            })
    }

    pub(super) fn vector(
        &self,
        weights: &dyn WeightSource,
        id: minfer_graph::WeightId,
        len: usize,
    ) -> Result<D::Buffer> {
        match self.weights.vector(id) {
            Some((b, l)) if l == len => Ok(b.clone()),
            Some((_, l)) => Err(shape(
                "weight",
                format!(
                    "{} has {l} elements, the node needs {len}",
                    weights.name(id)
                ),
            )),
            None => Err(shape(
                "weight",
                format!(
                    "{} is not registered on the device as a vector",
                    weights.name(id)
                ),
            )),
        }
    }

    /// The runs of one row class among a node's `rows` rows: (first row, rows, class). A
    /// forward that named no classes (a backend driven node by node) is one run of
    /// generation rows; under the gates' control (`MINFER_METAL_TIER_CONTROL=by-rows`) the
    /// node is one run whose tier follows its row count (class `None`).
    fn row_runs(&self, rows: usize) -> Result<Vec<(usize, usize, Option<RowClass>)>> {
        if self.tier_by_rows {
            return Ok(vec![(0, rows, None)]);
        }
        if self.rows.tokens.is_empty() {
            return Ok(vec![(0, rows, Some(RowClass::Generation))]);
        }
        let classes = self.rows.of(rows).ok_or_else(|| {
            shape(
                "row classes",
                format!(
                    "classes for {} token rows and {} output rows, the node has {rows}",
                    self.rows.tokens.len(),
                    self.rows.outputs.len()
                ),
            )
        })?;
        Ok(RowClasses::runs(classes)
            .into_iter()
            .map(|(r0, n, c)| (r0, n, Some(c)))
            .collect())
    }

    /// Encodes `node`'s dispatches (no submit).
    pub(super) fn encode(&mut self, node: &Node, args: &ExecArgs) -> Result<()> {
        let dev = &self.dev;
        let w = args.weights;
        let [ne0, ne1] = node.shape;
        let n = node.n_elems();
        match &node.op {
            Op::Input(_) => Ok(()),
            Op::KvCopy { .. } | Op::KvRopeShift { .. } => self.encode_cell_op(node, args),
            Op::GetRows { weight } => {
                let (wb, m) = self.matrix(w, *weight)?;
                if m.ne0 != ne0 {
                    return Err(shape(
                        "get_rows",
                        format!("table rows of {} for a node of {ne0}", m.ne0),
                    ));
                }
                let ids = self.src(args, 0)?;
                let out = self.out(node, args)?;
                launch::launch_get_rows(dev, m.ty, &wb, m.offset, &ids, &out, m.ne0, m.ne1, ne1)
            }
            Op::SelectRows => {
                let x = self.src(args, 0)?;
                let ids = self.src(args, 1)?;
                let out = self.out(node, args)?;
                // The source's rows: its buffer holds at least the producing node's rows, and
                // every id is checked against this bound on the host.
                let rows = dev.buffer_len(&x) / (ne0 * 4).max(1);
                launch::launch_get_rows(dev, GgmlType::F32, &x, 0, &ids, &out, ne0, rows, ne1)
            }
            Op::MatMul { weight, bias } => {
                let (wb, m) = self.matrix(w, *weight)?;
                if m.ne1 != ne0 {
                    return Err(shape(
                        "matmul",
                        format!("weight of {} outputs for a node of {ne0}", m.ne1),
                    ));
                }
                let x = self.src(args, 0)?;
                let out = self.out(node, args)?;
                // Each run of one row class on its class's tier (docs/PRECISION.md).
                for (r0, nt, class) in self.row_runs(ne1)? {
                    let tier = match class {
                        Some(c) => launch::class_tier(dev, c, m.ne0, nt),
                        None => launch::rows_tier(dev, m.ne0, m.ne1, nt),
                    };
                    let r = launch::launch_matmul_rows(
                        dev, tier, m.ty, &wb, m.offset, &x, &out, m.ne0, m.ne1, r0, nt,
                    );
                    if let Err(Error::UnsupportedType { .. } | Error::UnknownKernel { .. }) = r {
                        // The #317/#329 case: never another type's kernel, and say which
                        // would run.
                        let ty = m.ty.name().to_ascii_lowercase();
                        return Err(Error::UnsupportedType {
                            op: "matmul",
                            ty: format!(
                                "{} (weight {}): the library has no kernel_mv_{ty}_f32 / \
                                 kernel_mv_multi_{ty}_f32 / kernel_mm_{ty}_f32",
                                m.ty,
                                w.name(*weight)
                            ),
                        });
                    }
                    r?;
                }
                if let Some(b) = bias {
                    let bv = self.vector(w, *b, ne0)?;
                    launch::launch_add_rows(dev, &out, &bv, &out, ne0, ne1)?;
                }
                Ok(())
            }
            Op::RmsNorm { eps, weight, group } => {
                let x = self.src(args, 0)?;
                let out = self.out(node, args)?;
                let gain = self.vector(w, *weight, *group)?;
                if *group == ne0 {
                    launch::launch_rms_norm(dev, &x, &gain, &out, ne0, ne1, *eps)
                } else if *group > 0 && ne0.is_multiple_of(*group) {
                    launch::launch_qk_norm(dev, &x, &gain, &out, *group, n / group, *eps)
                } else {
                    Err(shape(
                        "rms_norm",
                        format!("groups of {group} over rows of {ne0}"),
                    ))
                }
            }
            Op::Rope {
                style,
                n_head,
                head_dim,
                freq_base,
                freq_scale,
            } => {
                if n_head * head_dim != ne0 {
                    return Err(shape(
                        "rope",
                        format!("{n_head} heads of {head_dim} over rows of {ne0}"),
                    ));
                }
                let x = self.src(args, 0)?;
                let pos = self.src(args, 1)?;
                let out = self.out(node, args)?;
                launch::launch_rope(
                    dev,
                    &x,
                    &pos,
                    &out,
                    *head_dim,
                    *n_head,
                    ne1,
                    *head_dim,
                    *freq_base,
                    *freq_scale,
                    *style,
                )
            }
            Op::Add | Op::Mul | Op::SwiGLU => {
                let a = self.src(args, 0)?;
                let b = self.src(args, 1)?;
                let out = self.out(node, args)?;
                match node.op {
                    Op::Add => launch::launch_add(dev, &a, &b, &out, n),
                    Op::Mul => launch::launch_mul(dev, &a, &b, &out, n),
                    _ => launch::launch_swiglu(dev, &a, &b, &out, n),
                }
            }
            Op::Silu => {
                let x = self.src(args, 0)?;
                let out = self.out(node, args)?;
                launch::launch_silu(dev, &x, &out, n)
            }
            Op::KvStore {
                kind, cache_type, ..
            } => {
                const OP: &str = "kv_store";
                let kv = Self::kv_type(OP, *cache_type)?;
                let pair = args
                    .kv
                    .ok_or_else(|| shape(OP, "the layer has no KV regions".into()))?;
                let region = self
                    .pool
                    .get(match kind {
                        KvKind::K => pair.k.0,
                        KvKind::V => pair.v.0,
                    })
                    .cloned()
                    .ok_or_else(|| shape(OP, "the KV region does not exist".into()))?;
                let x = self.src(args, 0)?;
                let cells = self.src(args, 1)?;
                let n_cells = dev.buffer_len(&region) / cell_bytes(OP, kv, *cache_type, ne0)?;
                // Every cell is checked against the region on the host first (an Err naming
                // it, never a silent skip).
                launch::launch_store_kv(dev, kv, &x, &cells, &region, ne0, ne1, n_cells)
            }
            Op::QkvRopeStore(f) => self.encode_qkv(node, f, args),
            Op::FfnGateUp {
                gate,
                up,
                in_norm: None,
            } => self.encode_ffn(node, *gate, *up, args),
            // supports_op refuses them (fused::refusal), so fusion never gives Metal one.
            Op::FfnGateUp {
                in_norm: Some(_), ..
            }
            | Op::MatMulAdd { .. } => Err(shape(
                "fused",
                format!(
                    "{} with a folded norm or residual is not written for Metal",
                    node.op.name()
                ),
            )),
            Op::Attention {
                n_head,
                n_head_kv,
                head_dim,
                scale,
                cache_type,
                window,
                ..
            } => {
                const OP: &str = "attention";
                if n_head * head_dim != ne0 {
                    return Err(shape(
                        OP,
                        format!("{n_head} heads of {head_dim} over rows of {ne0}"),
                    ));
                }
                let kv = Self::kv_type(OP, *cache_type)?;
                let pair = args
                    .kv
                    .ok_or_else(|| shape(OP, "the layer has no KV regions".into()))?;
                let (k, v) = match (self.pool.get(pair.k.0), self.pool.get(pair.v.0)) {
                    (Some(k), Some(v)) => (k.clone(), v.clone()),
                    _ => return Err(shape(OP, "the KV regions do not exist".into())),
                };
                let n_cells =
                    dev.buffer_len(&k) / cell_bytes(OP, kv, *cache_type, n_head_kv * head_dim)?;
                let q = self.src(args, 0)?;
                let win = self.src(args, 1)?;
                let out = self.out(node, args)?;
                let runs = self.row_runs(ne1)?;
                let room = self.room();
                let scratch = &mut self.scratch;
                // Each run of one row class on its class's family: every family is batch
                // invariant alone, so a row's bits follow its class, never the forward.
                for (r0, nq, class) in runs {
                    let s = WindowAttn {
                        n_head: *n_head,
                        n_head_kv: *n_head_kv,
                        head_dim: *head_dim,
                        n_tokens: nq,
                        n_cells,
                        kv,
                        scale: *scale,
                        window: match window {
                            WindowLayout::Span => WindowKind::Span,
                            WindowLayout::KvMap => WindowKind::Map,
                        },
                    };
                    let kernel = match class {
                        Some(c) => launch::window_class_kernel(&s, c, launch::AttnEnv::get()),
                        None => launch::window_kernel(&s),
                    };
                    launch::launch_attention_window_sized(
                        dev,
                        kernel,
                        &s,
                        &q,
                        &k,
                        &v,
                        &win,
                        &out,
                        r0,
                        |bytes| grown(dev, &mut *scratch, bytes, room),
                    )?;
                }
                Ok(())
            }
        }
    }
}

//! The fused decode nodes (seed §4.6, §4.9 #39): one mat-vec over the weights concatenated at
//! load ([`super::resident::Residency::concat`]) into the scratch row, then the finishing
//! kernels of `kernels/fused.metal`. Each arm refuses `nt != 1` first, before any weight
//! lookup, naming the node and the observed `nt`.

use minfer_gguf::GgmlType;
use minfer_graph::{ExecArgs, Node, Op, QkvFused, WeightId, WeightSource};

use super::exec::{cell_bytes, kv_refusal, matrix_refusal, shape};
use super::MetalBackend;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{self, KvType, QkvStore};

/// Why the device cannot run a fused op (None: it can): every matrix as for a matmul, and
/// the group concatenable (one type, one row length).
pub(crate) fn refusal<D: Device>(dev: &D, op: &Op, weights: &dyn WeightSource) -> Option<String> {
    let vector = |id: WeightId| match weights.weight(id) {
        Some(w) if w.ne1 == 1 => None,
        _ => Some(format!("{} is not a one-row weight", weights.name(id))),
    };
    match op {
        Op::QkvRopeStore(f) if f.in_norm.is_some() => {
            Some("the input RMSNorm folded into Q/K/V is not written for Metal".into())
        }
        Op::FfnGateUp {
            in_norm: Some(_), ..
        } => Some("the input RMSNorm folded into gate/up is not written for Metal".into()),
        Op::MatMulAdd { .. } => Some("MatMulAdd is not written for Metal".into()),
        Op::QkvRopeStore(f) => concat_refusal(dev, weights, &[f.wq, f.wk, f.wv])
            .or_else(|| f.bias.and_then(|b| b.into_iter().find_map(vector)))
            .or_else(|| f.norm.and_then(|n| vector(n.q).or_else(|| vector(n.k))))
            .or_else(|| kv_refusal(f.cache_type))
            .or_else(|| {
                let hd = f.rope.head_dim;
                (hd == 0 || !hd.is_multiple_of(2)).then(|| format!("RoPE over a head dim of {hd}"))
            })
            .or_else(|| {
                (f.cache_type == GgmlType::Q8_0 && !f.kv_dim().is_multiple_of(32))
                    .then(|| format!("q8_0 KV rows of {} elements", f.kv_dim()))
            }),
        Op::FfnGateUp {
            gate,
            up,
            in_norm: None,
        } => {
            // The gate|up concatenation costs memory: past MAX_FUSED_FFN rows it costs more
            // than the dispatch it saves.
            let rows = weights.weight(*gate).map_or(0, |w| w.ne1);
            if rows > minfer_graph::MAX_FUSED_FFN {
                return Some(format!(
                    "a gate|up concatenation of {rows} rows (more than {})",
                    minfer_graph::MAX_FUSED_FFN
                ));
            }
            concat_refusal(dev, weights, &[*gate, *up])
        }
        _ => Some(format!("{} is not a fused op", op.name())),
    }
}

fn concat_refusal<D: Device>(
    dev: &D,
    weights: &dyn WeightSource,
    group: &[WeightId],
) -> Option<String> {
    let mut first = None;
    for &id in group {
        let name = weights.name(id);
        let w = match weights.weight(id) {
            None => return Some(format!("weight {name} is not in the model")),
            Some(w) if w.ne1 == 1 => return Some(format!("{name} is a vector, not a matrix")),
            Some(w) => w,
        };
        if let Some(why) = matrix_refusal(dev, w.ty, w.ne0) {
            return Some(format!("{name}: {why}"));
        }
        match first {
            None => first = Some((w.ty, w.ne0)),
            Some(f) if f != (w.ty, w.ne0) => {
                return Some(format!(
                    "{name} ({} x {}) does not concatenate with {} ({} x {})",
                    w.ty,
                    w.ne0,
                    weights.name(group[0]),
                    f.0,
                    f.1
                ))
            }
            Some(_) => {}
        }
    }
    None
}

/// The #39 refusal: a decode-only fused node asked to run `nt` tokens.
fn decode_only(node: &Node) -> Result<()> {
    match node.shape[1] {
        1 => Ok(()),
        nt => Err(shape(
            node.op.name(),
            format!(
                "{} is a decode-only fused node (nt = 1), got nt = {nt}",
                node.name
            ),
        )),
    }
}

impl<D: Device> MetalBackend<D>
where
    D::Buffer: Clone,
{
    fn concat(
        &self,
        weights: &dyn WeightSource,
        group: &[WeightId],
    ) -> Result<(D::Buffer, super::resident::Matrix)> {
        self.weights
            .concat_of(group)
            .map(|(b, m)| (b.clone(), m))
            .ok_or_else(|| {
                let names: Vec<&str> = group.iter().map(|&id| weights.name(id)).collect();
                shape(
                    "weight",
                    format!(
                        "the concatenation {} was not prepared (Backend::prepare_concat)",
                        names.join("|")
                    ),
                )
            })
    }

    /// [`Op::QkvRopeStore`]: mat-vec over wq|wk|wv, the per-head norm (Qwen3) in place, then
    /// bias + RoPE + KV store.
    pub(super) fn encode_qkv(&mut self, node: &Node, f: &QkvFused, args: &ExecArgs) -> Result<()> {
        decode_only(node)?;
        let op = node.op.name();
        let w = args.weights;
        let (q_dim, kv_dim, hd) = (f.q_dim(), f.kv_dim(), f.rope.head_dim);
        if node.shape[0] != q_dim {
            return Err(shape(
                op,
                format!("{q_dim} q values for a node of {}", node.shape[0]),
            ));
        }
        let (wb, m) = self.concat(w, &[f.wq, f.wk, f.wv])?;
        if m.ne1 != q_dim + 2 * kv_dim {
            return Err(shape(
                op,
                format!(
                    "wq|wk|wv has {} rows, q|k|v is {}",
                    m.ne1,
                    q_dim + 2 * kv_dim
                ),
            ));
        }
        let kv: KvType = Self::kv_type(op, f.cache_type)?;
        let pair = args
            .kv
            .ok_or_else(|| shape(op, "the layer has no KV regions".into()))?;
        let (kr, vr) = match (self.pool.get(pair.k.0), self.pool.get(pair.v.0)) {
            (Some(k), Some(v)) => (k.clone(), v.clone()),
            _ => return Err(shape(op, "the KV regions do not exist".into())),
        };
        let n_cells = self.dev.buffer_len(&kr) / cell_bytes(op, kv, f.cache_type, kv_dim)?;
        let x = self.src(args, 0)?;
        let pos = self.src(args, 1)?;
        let cells = self.src(args, 2)?;
        let out = self.out(node, args)?;
        let bias = match f.bias {
            Some([bq, bk, bv]) => Some([
                self.vector(w, bq, q_dim)?,
                self.vector(w, bk, kv_dim)?,
                self.vector(w, bv, kv_dim)?,
            ]),
            None => None,
        };
        let norm = match f.norm {
            Some(n) => Some((self.vector(w, n.q, hd)?, self.vector(w, n.k, hd)?, n.eps)),
            None => None,
        };
        let row = self.scratch((q_dim + 2 * kv_dim) * 4)?;
        let dev = &self.dev;
        launch::launch_mv(dev, m.ty, &wb, m.offset, &x, &row, m.ne0, m.ne1)?;
        if let Some((gq, gk, eps)) = &norm {
            launch::launch_qkv_norm(dev, &row, gq, gk, hd, f.n_head, f.n_head_kv, *eps)?;
        }
        let s = QkvStore {
            n_head: f.n_head,
            n_head_kv: f.n_head_kv,
            head_dim: hd,
            freq_base: f.rope.freq_base,
            freq_scale: f.rope.freq_scale,
            style: f.rope.style,
            kv,
            n_cells,
        };
        let bias = bias.as_ref().map(|[a, b, c]| [a, b, c]);
        launch::launch_qkv_rope_store(dev, &s, &row, bias, &pos, &cells, &out, &kr, &vr)
    }

    /// [`Op::FfnGateUp`]: mat-vec over gate|up, then silu(gate) * up.
    pub(super) fn encode_ffn(
        &mut self,
        node: &Node,
        gate: WeightId,
        up: WeightId,
        args: &ExecArgs,
    ) -> Result<()> {
        decode_only(node)?;
        let ff = node.shape[0];
        let (wb, m) = self.concat(args.weights, &[gate, up])?;
        if m.ne1 != 2 * ff {
            return Err(Error::Shape {
                op: "ffn_gate_up",
                reason: format!("gate|up has {} rows for an FFN of {ff}", m.ne1),
            });
        }
        let x = self.src(args, 0)?;
        let out = self.out(node, args)?;
        let row = self.scratch(2 * ff * 4)?;
        let dev = &self.dev;
        launch::launch_mv(dev, m.ty, &wb, m.offset, &x, &row, m.ne0, m.ne1)?;
        launch::launch_swiglu_split(dev, &row, &out, ff)
    }
}

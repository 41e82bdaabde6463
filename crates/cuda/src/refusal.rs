//! What the CUDA backend refuses to run, by name (`Capabilities::supports_op`): a weight type
//! or shape its kernels do not read, a KV type, a head layout, a fused node off the int8
//! path.

use minfer_gguf::GgmlType;
use minfer_graph::{Op, WeightSource};

use crate::backend::{matrix_refusal, CUDA_KV_TYPES};

/// Why `op` cannot run here (None: it can).
pub(crate) fn op_refusal(op: &Op, weights: &dyn WeightSource) -> Option<String> {
    let matrix = |id| match weights.weight(id) {
        None => Some(format!("weight {} is not in the model", weights.name(id))),
        Some(w) if w.ne1 == 1 => Some(format!("{} is a vector, not a matrix", weights.name(id))),
        Some(w) => matrix_refusal(w.ty, w.ne0).map(|why| format!("{}: {why}", weights.name(id))),
    };
    let vector = |id| match weights.weight(id) {
        Some(w) if w.ne1 == 1 => None,
        _ => Some(format!("{} is not a one-row weight", weights.name(id))),
    };
    // A matrix the one-token int8 kernels read (the fused nodes run only on that path).
    let int8_matrix = |id| {
        matrix(id).or_else(|| {
            let w = weights.weight(id)?;
            let int8 = matches!(
                w.ty,
                GgmlType::Q8_0
                    | GgmlType::Q4_0
                    | GgmlType::Q4_1
                    | GgmlType::Q5_0
                    | GgmlType::Q4K
                    | GgmlType::Q6K
            );
            (!int8 || (w.ne0 + w.ne0 / 4) > 48 * 1024).then(|| {
                format!(
                    "{}: the fused decode nodes read int8-path weights, not {}",
                    weights.name(id),
                    w.ty
                )
            })
        })
    };
    let kv = |ty: GgmlType| {
        (!CUDA_KV_TYPES.contains(&ty)).then(|| format!("no CUDA kernels for a {ty} KV cache"))
    };
    match op {
        Op::KvCopy { layout, .. } => kv(layout.cache_type),
        Op::KvRopeShift { layout, .. } => {
            kv(layout.cache_type).or_else(|| crate::cells::cell_op_refusal(op))
        }
        Op::GetRows { weight } => matrix(*weight),
        Op::MatMul { weight, bias } => matrix(*weight).or_else(|| bias.and_then(vector)),
        Op::RmsNorm { weight, .. } => vector(*weight),
        Op::KvStore { cache_type, .. } => kv(*cache_type),
        Op::Attention {
            cache_type,
            head_dim,
            n_head,
            n_head_kv,
            ..
        } => kv(*cache_type).or_else(|| {
            if *head_dim == 0 || *head_dim > 512 {
                Some(format!("head dim {head_dim} outside 1..=512"))
            } else if *n_head_kv == 0 || !n_head.is_multiple_of(*n_head_kv) {
                Some(format!("{n_head} query heads over {n_head_kv} KV heads"))
            } else {
                None
            }
        }),
        Op::Rope { head_dim, .. } if !head_dim.is_multiple_of(2) => {
            Some(format!("RoPE over an odd head dim {head_dim}"))
        }
        Op::FfnGateUp { gate, up, in_norm } => [*gate, *up]
            .into_iter()
            .find_map(int8_matrix)
            .or_else(|| in_norm.and_then(|n| vector(n.weight))),
        Op::MatMulAdd { weight, bias } => int8_matrix(*weight).or_else(|| bias.and_then(vector)),
        Op::QkvRopeStore(f) => [f.wq, f.wk, f.wv]
            .into_iter()
            .find_map(int8_matrix)
            .or_else(|| f.bias.and_then(|b| b.into_iter().find_map(vector)))
            .or_else(|| f.in_norm.and_then(|n| vector(n.weight)))
            .or_else(|| kv(f.cache_type))
            .or_else(|| {
                f.norm
                    .is_some()
                    .then(|| "the per-head Q/K norm (Qwen3) runs unfused on CUDA".to_string())
            })
            .or_else(|| {
                let (q, kv) = (f.q_dim(), f.kv_dim());
                (!q.is_multiple_of(4)
                    || !kv.is_multiple_of(4)
                    || !f.rope.head_dim.is_multiple_of(2))
                .then(|| format!("fused Q/K/V rows q {q}, kv {kv}: not whole 4-row blocks"))
            })
            .or_else(|| {
                (f.cache_type == GgmlType::Q8_0 && !f.kv_dim().is_multiple_of(32))
                    .then(|| format!("q8_0 KV rows of {} elements", f.kv_dim()))
            }),
        Op::Input(_)
        | Op::SelectRows
        | Op::Rope { .. }
        | Op::Add
        | Op::Mul
        | Op::Silu
        | Op::SwiGLU => None,
    }
}

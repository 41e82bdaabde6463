//! One graph builder for the three architectures (they differ only in Q/K/V biases, per-head
//! Q/K norm and RoPE pairing). A pure function of the hyperparameters and the graph params:
//! positions, KV cells and attention spans are inputs, never topology.

use crate::arch::{names, names::Layer, HParams};
use crate::error::{Error, Result};
use minfer_graph::{
    Graph, GraphBuilder, GraphParams, InputKind, KvKind, NodeId, Op, WeightId, WeightSource,
    WindowLayout, KV_MAP_RUNS,
};

/// Builds the forward graph for `p.n_tokens` new tokens, producing logits `[vocab, n_out]`
/// for the `n_out` rows the `TailIds` input names (all rows when `n_out == n_tokens`).
/// `output_weight` is `output.weight` or, when the embedding is tied, `token_embd.weight`;
/// weight names are resolved to the ids of `weights` here, once per build.
pub fn build_graph(
    hp: &HParams,
    weights: &dyn WeightSource,
    output_weight: &str,
    p: &GraphParams,
) -> Result<Graph> {
    let id = |name: String| -> Result<WeightId> {
        weights
            .id(&name)
            .ok_or_else(|| Error::MissingTensor { name: name.clone() })
    };
    let nt = p.n_tokens;
    if nt == 0 || p.n_out == 0 || p.n_out > nt {
        return Err(Error::BadHParam(
            "graph params".into(),
            format!(
                "n_tokens {nt}, n_out {}: need 1 <= n_out <= n_tokens",
                p.n_out
            ),
        ));
    }
    let d = hp.embedding_length;
    let hd = hp.head_dim;
    let (nh, nkv) = (hp.head_count, hp.head_count_kv);
    let (q_dim, kv_dim) = (nh * hd, nkv * hd);
    let ff = hp.feed_forward_length;
    let arch = hp.arch;
    let mut g = GraphBuilder::new();
    let tokens = g.input(InputKind::TokenIds, [1, nt]);
    let pos = g.input(InputKind::Positions, [1, nt]);
    let cells = g.input(InputKind::KvCells, [1, nt]);
    let span = match p.window {
        WindowLayout::Span => g.input(InputKind::AttnSpan, [2, nt]),
        WindowLayout::KvMap => g.input(InputKind::KvMap, [2 * KV_MAP_RUNS, nt]),
    };
    // Declared up front so that the tail gather does not split the graph.
    let tail = (p.n_out < nt).then(|| g.input(InputKind::TailIds, [1, p.n_out]));

    let mut x = g.op(
        "embd",
        Op::GetRows {
            weight: id(names::TOKEN_EMBD.into())?,
        },
        &[tokens],
        [d, nt],
    );
    let rms = |g: &mut GraphBuilder, name: String, x: NodeId, weight: WeightId, group: usize| {
        let shape = g.shape(x);
        g.op(
            name,
            Op::RmsNorm {
                eps: hp.rms_epsilon,
                weight,
                group,
            },
            &[x],
            shape,
        )
    };
    let matmul = |g: &mut GraphBuilder,
                  name: String,
                  x: NodeId,
                  weight: WeightId,
                  bias: Option<WeightId>,
                  out: usize| {
        let n = g.shape(x)[1];
        g.op(name, Op::MatMul { weight, bias }, &[x], [out, n])
    };
    for l in 0..hp.block_count {
        g.set_layer(Some(l));
        let w = |t: Layer| id(t.name(l));
        let bias = |t: Layer| arch.has_qkv_bias().then(|| id(t.name(l))).transpose();
        let last = l + 1 == hp.block_count;
        let h = rms(&mut g, format!("L{l}.attn_norm"), x, w(Layer::AttnNorm)?, d);
        let mut q = matmul(
            &mut g,
            format!("L{l}.q"),
            h,
            w(Layer::AttnQ)?,
            bias(Layer::AttnQBias)?,
            q_dim,
        );
        let mut k = matmul(
            &mut g,
            format!("L{l}.k"),
            h,
            w(Layer::AttnK)?,
            bias(Layer::AttnKBias)?,
            kv_dim,
        );
        let v = matmul(
            &mut g,
            format!("L{l}.v"),
            h,
            w(Layer::AttnV)?,
            bias(Layer::AttnVBias)?,
            kv_dim,
        );
        if arch.has_qk_norm() {
            q = rms(&mut g, format!("L{l}.q_norm"), q, w(Layer::AttnQNorm)?, hd);
            k = rms(&mut g, format!("L{l}.k_norm"), k, w(Layer::AttnKNorm)?, hd);
        }
        let rope = |n_head| Op::Rope {
            style: arch.rope_style(),
            n_head,
            head_dim: hd,
            freq_base: hp.rope_freq_base,
            freq_scale: 1.0 / hp.rope_scale,
        };
        q = g.op(format!("L{l}.q_rope"), rope(nh), &[q, pos], [q_dim, nt]);
        k = g.op(format!("L{l}.k_rope"), rope(nkv), &[k, pos], [kv_dim, nt]);
        let store = |kind| Op::KvStore {
            layer: l,
            kind,
            cache_type: p.cache_type,
        };
        let ks = g.op(
            format!("L{l}.k_store"),
            store(KvKind::K),
            &[k, cells],
            [kv_dim, nt],
        );
        let vs = g.op(
            format!("L{l}.v_store"),
            store(KvKind::V),
            &[v, cells],
            [kv_dim, nt],
        );
        let attn = Op::Attention {
            layer: l,
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            cache_type: p.cache_type,
            window: p.window,
        };
        let mut a = g.op(format!("L{l}.attn"), attn, &[q, span, ks, vs], [q_dim, nt]);
        let mut n = nt;
        if let (true, Some(tail)) = (last, tail) {
            // Only the rows that get logits go on past attention in the last layer.
            n = p.n_out;
            a = g.op(
                format!("L{l}.attn_tail"),
                Op::SelectRows,
                &[a, tail],
                [q_dim, n],
            );
            x = g.op(format!("L{l}.x_tail"), Op::SelectRows, &[x, tail], [d, n]);
        }
        let o = matmul(
            &mut g,
            format!("L{l}.attn_out"),
            a,
            w(Layer::AttnOutput)?,
            None,
            d,
        );
        x = g.op(format!("L{l}.attn_res"), Op::Add, &[o, x], [d, n]);
        let h = rms(&mut g, format!("L{l}.ffn_norm"), x, w(Layer::FfnNorm)?, d);
        let gate = matmul(
            &mut g,
            format!("L{l}.gate"),
            h,
            w(Layer::FfnGate)?,
            None,
            ff,
        );
        let up = matmul(&mut g, format!("L{l}.up"), h, w(Layer::FfnUp)?, None, ff);
        let s = g.op(format!("L{l}.silu"), Op::Silu, &[gate], [ff, n]);
        let m = g.op(format!("L{l}.gate_up"), Op::Mul, &[s, up], [ff, n]);
        let down = matmul(&mut g, format!("L{l}.down"), m, w(Layer::FfnDown)?, None, d);
        x = g.op(format!("L{l}.ffn_res"), Op::Add, &[down, x], [d, n]);
    }
    // The final norm and the output head are the output position, tagged one past the last
    // block as llama.cpp numbers its output layer (n_layer): a layer-offload plan can place
    // them apart from the embedding (`--offload-head`, ADR 0014).
    g.set_layer(Some(hp.block_count));
    let h = rms(
        &mut g,
        "output_norm".into(),
        x,
        id(names::OUTPUT_NORM.into())?,
        d,
    );
    let logits = matmul(
        &mut g,
        "logits".into(),
        h,
        id(output_weight.into())?,
        None,
        hp.vocab_size,
    );
    Ok(g.finish(logits))
}

//! The Metal graph executor's guards on the emulator (seed §4.9): a weight type without
//! kernels, a KV-store cell past the region, a norm gain not on the device, attention rows
//! and windows, K-quant rows that are not whole super-blocks, row classes that fit no node's
//! rows. Each is an `Err` naming the
//! node (or a placement refusal naming the weight), and each has a control that runs.

mod executor_support;

use executor_support::*;
use minfer_gguf::GgmlType;
use minfer_graph::contract::*;
use minfer_graph::{ExecArgs, KvKind, KvPair, Op, SplitKey, WeightId, WeightRef, WeightSource};

#[test]
fn a_weight_type_without_kernels_is_an_error_naming_node_type_and_kernel() {
    let n_out = 32;
    // TQ1_0-like types have no Metal kernels; use one the suffix table refuses.
    let bad = GgmlType::Iq2Xxs;
    let raw = vec![0u8; bad.row_bytes(256).unwrap() as usize * n_out];
    let w = Weights::new(
        &[
            (
                "embd",
                GgmlType::F32,
                256,
                4,
                f32_bytes(&values(256 * 4, 2)),
            ),
            ("w", bad, 256, n_out, raw),
        ],
        true,
    );
    let mut be = metal();
    be.prepare_weights(&w, &w.ids()).unwrap();
    // Assignment would keep it off the device, with the reason:
    let mm = Op::MatMul {
        weight: w.id("w").unwrap(),
        bias: None,
    };
    let why = be
        .supports_op(&mm, minfer_graph::DType::F32, &w)
        .expect_err("refused")
        .0;
    assert!(why.contains("iq2_xxs") || why.contains("IQ2_XXS"), "{why}");
    // ... and a node forced onto it fails loudly instead of running another type's kernel.
    let x = be.alloc(256 * 4).unwrap();
    let out = be.alloc(n_out * 4).unwrap();
    let node = minfer_graph::Node {
        id: minfer_graph::NodeId(1),
        name: "blk.0.ffn_down".into(),
        op: mm,
        src: vec![minfer_graph::NodeId(0)],
        shape: [n_out, 1],
        dtype: minfer_graph::DType::F32,
        backend: Some(METAL),
        layer: Some(0),
        dead: false,
    };
    let args = ExecArgs {
        srcs: &[Some(x)],
        out: Some(out),
        kv: None,
        weights: &w,
    };
    let err = be
        .execute_split(SplitKey::UNPLANNED, &[&node], &[args])
        .unwrap_err()
        .to_string();
    assert!(err.contains("blk.0.ffn_down"), "{err}");
    assert!(err.to_lowercase().contains("iq2_xxs"), "{err}");
    assert!(err.contains("kernel_mv_"), "{err}");
    // Control: the same node over an f32 weight computes.
    let good = Weights::new(
        &[(
            "w",
            GgmlType::F32,
            256,
            n_out,
            f32_bytes(&values(256 * n_out, 4)),
        )],
        true,
    );
    let mut be = metal();
    be.prepare_weights(&good, &good.ids()).unwrap();
    let x = be.alloc(256 * 4).unwrap();
    let out = be.alloc(n_out * 4).unwrap();
    let node = minfer_graph::Node {
        op: Op::MatMul {
            weight: WeightId(0),
            bias: None,
        },
        ..node
    };
    let args = ExecArgs {
        srcs: &[Some(x)],
        out: Some(out),
        kv: None,
        weights: &good,
    };
    be.execute_split(SplitKey::UNPLANNED, &[&node], &[args])
        .unwrap();
}

#[test]
fn a_kv_store_past_the_region_is_an_error_naming_the_cell() {
    let w = Weights::new(&[], true);
    let mut be = metal();
    be.prepare_weights(&w, &[]).unwrap();
    let region = be.alloc(64 * 4 * 4).unwrap();
    let x = be.alloc(64 * 4).unwrap();
    let idx = be.alloc(4).unwrap();
    be.write(idx, 0, &9i32.to_le_bytes()).unwrap();
    let node = minfer_graph::Node {
        id: minfer_graph::NodeId(2),
        name: "blk.3.v_store".into(),
        op: Op::KvStore {
            layer: 3,
            kind: KvKind::V,
            cache_type: GgmlType::F32,
        },
        src: vec![minfer_graph::NodeId(0), minfer_graph::NodeId(1)],
        shape: [64, 1],
        dtype: minfer_graph::DType::None,
        backend: Some(METAL),
        layer: Some(3),
        dead: false,
    };
    let kv = KvPair {
        k: region,
        v: region,
    };
    let args = ExecArgs {
        srcs: &[Some(x), Some(idx)],
        out: None,
        kv: Some(kv),
        weights: &w,
    };
    let err = be
        .execute_split(SplitKey::UNPLANNED, &[&node], &[args])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("blk.3.v_store") && err.contains("cell 9"),
        "{err}"
    );
    // Control: cell 3 is inside the 4-cell region.
    be.write(idx, 0, &3i32.to_le_bytes()).unwrap();
    let args = ExecArgs {
        srcs: &[Some(x), Some(idx)],
        out: None,
        kv: Some(kv),
        weights: &w,
    };
    be.execute_split(SplitKey::UNPLANNED, &[&node], &[args])
        .unwrap();
}

#[test]
fn a_norm_whose_gain_is_not_on_the_device_is_an_error_naming_node_and_tensor() {
    let w = proj_weights(GgmlType::F32, 96);
    let gain = w.id("gain").unwrap();
    let norm = node(
        "blk.0.attn_norm",
        Op::RmsNorm {
            eps: 1e-6,
            weight: gain,
            group: D,
        },
        1,
        [D, 2],
    );
    for registered in [false, true] {
        let mut be = metal();
        // Every weight but the gain, or all of them (the control).
        let ids: Vec<WeightId> = w
            .ids()
            .into_iter()
            .filter(|&i| registered || i != gain)
            .collect();
        be.prepare_weights(&w, &ids).unwrap();
        let x = be.alloc(D * 2 * 4).unwrap();
        let out = be.alloc(D * 2 * 4).unwrap();
        let args = ExecArgs {
            srcs: &[Some(x)],
            out: Some(out),
            kv: None,
            weights: &w,
        };
        let r = be.execute_split(SplitKey::UNPLANNED, &[&norm], &[args]);
        if registered {
            r.unwrap();
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("blk.0.attn_norm") && e.contains("gain"), "{e}");
        }
    }
}

/// One attention node of 4 heads (2 KV heads) of 64 over 16 cells, 3 queries of rows
/// `ne0`, run alone on a fresh backend; the third query's window ends at `hi`, and `budget`
/// is the device budget set before the node runs.
fn run_attention(ne0: usize, hi: i32, budget: Option<usize>) -> minfer_graph::Result<()> {
    let w = Weights::new(&[], true);
    let (n_head, n_head_kv, hd, cells, nt) = (4usize, 2usize, 64usize, 16usize, 3usize);
    let attn = node(
        "blk.1.attn",
        Op::Attention {
            layer: 1,
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 0.125,
            cache_type: GgmlType::F32,
            window: minfer_graph::WindowLayout::Span,
        },
        2,
        [ne0, nt],
    );
    let mut be = metal();
    be.prepare_weights(&w, &[]).unwrap();
    let k = be.alloc(cells * n_head_kv * hd * 4).unwrap();
    let v = be.alloc(cells * n_head_kv * hd * 4).unwrap();
    let q = be.alloc(nt * n_head * hd * 4).unwrap();
    let win = be.alloc(nt * 2 * 4).unwrap();
    let out = be.alloc(nt * n_head * hd * 4).unwrap();
    let spans: Vec<u8> = [0, 4, 0, 8, 2, hi]
        .iter()
        .flat_map(|x: &i32| x.to_le_bytes())
        .collect();
    be.write(win, 0, &spans).unwrap();
    if let Some(b) = budget {
        be.set_device_budget(b);
    }
    let args = ExecArgs {
        srcs: &[Some(q), Some(win)],
        out: Some(out),
        kv: Some(KvPair { k, v }),
        weights: &w,
    };
    be.execute_split(SplitKey::UNPLANNED, &[&attn], &[args])
}

/// The bytes of `run_attention`'s buffers.
const ATTN_HELD: usize = (2 * 16 * 2 + 2 * 3 * 4) * 64 * 4 + 3 * 2 * 4;

#[test]
fn attention_shape_and_window_guards_are_errors_naming_the_node() {
    let width = 4 * 64;
    // Control: a well-formed node runs.
    run_attention(width, 12, None).unwrap();
    // Rows that are not n_head x head_dim.
    let e = run_attention(width - 32, 12, None).unwrap_err().to_string();
    assert!(e.contains("blk.1.attn") && e.contains("heads of 64"), "{e}");
    // A window past the region's 16 cells, naming the query.
    let e = run_attention(width, 17, None).unwrap_err().to_string();
    assert!(e.contains("blk.1.attn") && e.contains("query 2"), "{e}");
}

/// The attention scratch, which the backend allocates beside the allocator's buffers, is
/// checked against the device budget before it grows (issue 32): a budget the pool's
/// buffers already fill refuses it with the MiB figures; the control, a budget with room,
/// runs the same node.
#[test]
fn the_attention_scratch_is_checked_against_the_device_budget() {
    let e = run_attention(4 * 64, 12, Some(ATTN_HELD))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("attention scratch") && e.contains("MiB") && e.contains("budget"),
        "{e}"
    );
    // Control: room for the scratch.
    run_attention(4 * 64, 12, Some(ATTN_HELD + (64 << 20))).unwrap();
}

#[test]
fn a_k_quant_weight_whose_rows_are_not_whole_super_blocks_is_refused() {
    let be = metal();
    let bytes = vec![0u8; GgmlType::Q4K.row_bytes(512).unwrap() as usize];
    let ok = WeightRef {
        ty: GgmlType::Q4K,
        ne0: 256,
        ne1: 2,
        bytes: &bytes,
    };
    be.can_hold(&ok).unwrap();
    let bad = WeightRef {
        ne0: 128,
        ne1: 4,
        ..ok
    };
    let why = be.can_hold(&bad).unwrap_err().0;
    assert!(why.contains("256"), "{why}");
}

/// Row classes whose counts fit neither the node's rows nor the output rows are an error
/// naming the node and both counts (never a guessed class); control: the classes of the
/// forward's three rows run.
#[test]
fn row_classes_that_fit_no_node_rows_are_an_error_naming_the_node() {
    use minfer_graph::{RowClass, RowClasses};
    let w = proj_weights(GgmlType::F32, 96);
    let ids = [1i32, 4, 9];
    let wrong = RowClasses {
        tokens: vec![RowClass::Prompt; 5],
        outputs: vec![RowClass::Prompt; 2],
    };
    let mut mtl = backends(true, &w, false);
    let err = try_run_rows(
        norm_matmul_graph(&w, 3, 96),
        &mut mtl,
        &w,
        None,
        &ids,
        &wrong,
    )
    .expect_err("mismatched row classes ran");
    let msg = err.to_string();
    assert!(
        msg.contains("proj") && msg.contains("5 token rows and 2 output rows, the node has 3"),
        "{msg}"
    );
    let right = RowClasses {
        tokens: vec![RowClass::Prompt; 3],
        outputs: vec![RowClass::Prompt; 3],
    };
    let mut mtl = backends(true, &w, false);
    assert!(try_run_rows(
        norm_matmul_graph(&w, 3, 96),
        &mut mtl,
        &w,
        None,
        &ids,
        &right
    )
    .is_ok());
}

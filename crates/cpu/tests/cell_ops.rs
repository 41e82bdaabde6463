//! The CPU's answers for a sequence's KV cell operations (the `KvCopy` / `KvRopeShift` nodes
//! of the engine's cell-op graph): it copies cells of every KV type it stores and rotates
//! f32 and f16 rows; a q8_0 shift is refused by name (re-quantizing rotated rows compounds
//! rounding), and running one anyway fails, never leaving a half-rotated region.

use minfer_cpu::CpuBackend;
use minfer_gguf::GgmlType;
use minfer_graph::contract::*;
use minfer_graph::{
    cell_ops_graph, BackendId, CellWork, DType, ExecArgs, KvLayout, KvPair, RopeSpec, RopeStyle,
    WeightId, WeightRef, WeightSource,
};

struct NoWeights;
impl WeightSource for NoWeights {
    fn weight(&self, _: WeightId) -> Option<WeightRef<'_>> {
        None
    }
    fn name(&self, _: WeightId) -> &str {
        "none"
    }
    fn id(&self, _: &str) -> Option<WeightId> {
        None
    }
    fn len(&self) -> usize {
        0
    }
}

fn layout(ty: GgmlType) -> KvLayout {
    KvLayout {
        cache_type: ty,
        n_head_kv: 2,
        head_dim: 64,
        cell_bytes: ty.row_bytes(128).unwrap() as usize,
    }
}

const ROPE: RopeSpec = RopeSpec {
    style: RopeStyle::Neox,
    head_dim: 64,
    freq_base: 10000.0,
    freq_scale: 1.0,
};

#[test]
fn the_cpu_copies_every_kv_type_and_shifts_only_f32_and_f16() {
    let cpu = CpuBackend::new(1);
    let work = [
        CellWork::Copy {
            src: 0,
            dst: 2,
            n: 3,
        },
        CellWork::Shift {
            cell: 0,
            n: 4,
            delta: 5,
        },
    ];
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let g = cell_ops_graph(&[(0, cpu.id())], &work, layout(ty), ROPE).unwrap();
        let answers: Vec<bool> = g
            .nodes
            .iter()
            .map(|n| cpu.supports_op(&n.op, n.dtype, &NoWeights).is_ok())
            .collect();
        let shifts = ty != GgmlType::Q8_0;
        assert_eq!(answers, [true, true, shifts], "{ty}");
        if !shifts {
            let why = cpu
                .supports_op(&g.nodes[2].op, DType::None, &NoWeights)
                .unwrap_err();
            assert!(why.0.contains("Q8_0") && why.0.contains("shift"), "{why}");
        }
    }
}

#[test]
fn a_q8_0_shift_run_anyway_fails_and_leaves_the_region_as_it_was() {
    let mut cpu = CpuBackend::new(1);
    let l = layout(GgmlType::Q8_0);
    let bytes: Vec<u8> = (0..8 * l.cell_bytes).map(|i| (i * 7 % 251) as u8).collect();
    let k = cpu.alloc(bytes.len()).unwrap();
    let v = cpu.alloc(bytes.len()).unwrap();
    cpu.write(k, 0, &bytes).unwrap();
    let work = [CellWork::Shift {
        cell: 1,
        n: 3,
        delta: 2,
    }];
    let g = cell_ops_graph(&[(0, BackendId(cpu.id().0))], &work, l, ROPE).unwrap();
    let err = cpu
        .execute_node(
            &g.nodes[0],
            &ExecArgs {
                srcs: &[],
                out: None,
                kv: Some(KvPair { k, v }),
                weights: &NoWeights,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("shift"), "{err}");
    let mut after = vec![0u8; bytes.len()];
    cpu.read(k, 0, &mut after).unwrap();
    assert_eq!(after, bytes);
}

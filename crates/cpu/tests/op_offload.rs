//! Op offload's routing on the CPU (layer offload, ADR 0014): in a helped split, a block's
//! matmul hands each run of prompt rows to the helper (one `stream_matmul` call per run, the
//! bias added by the CPU) and keeps its generation rows on its own kernels, bit for bit
//! what it computes alone. The helper here is a mock whose "products" are marker values, so
//! every output row says which side produced it. Controls: the output position (a layer
//! not below the block count) and a helper that refuses the weight leave every row on the
//! CPU; rows without classes are generation rows.

use minfer_cpu::CpuBackend;
use minfer_gguf::quants::random_blocks;
use minfer_gguf::GgmlType;
use minfer_graph::contract::*;
use minfer_graph::{
    BackendId, BufId, DType, Error, ExecArgs, FusedOp, Node, NodeId, Op, Result, RowClass,
    RowClasses, SplitKey, Support, WeightId, WeightRef, WeightSource,
};

const K: usize = 64;
const M: usize = 8;
const N: usize = 5;

/// A Q8_0 matrix of M rows of K (id 0) and its bias (id 1).
struct Weights {
    matrix: Vec<u8>,
    bias: Vec<u8>,
}

impl WeightSource for Weights {
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
        match id.0 {
            0 => Some(WeightRef {
                ty: GgmlType::Q8_0,
                ne0: K,
                ne1: M,
                bytes: &self.matrix,
            }),
            1 => Some(WeightRef {
                ty: GgmlType::F32,
                ne0: M,
                ne1: 1,
                bytes: &self.bias,
            }),
            _ => None,
        }
    }
    fn name(&self, id: WeightId) -> &str {
        ["w", "b"][id.index()]
    }
    fn id(&self, name: &str) -> Option<WeightId> {
        ["w", "b"]
            .iter()
            .position(|n| *n == name)
            .map(|i| WeightId(i as u32))
    }
    fn len(&self) -> usize {
        2
    }
}

/// The helper: each call's row count recorded, row r's output j = 1000 * (call + 1) + r * M + j.
#[derive(Default)]
struct Marker {
    calls: Vec<usize>,
    refuse: bool,
}

impl Identity for Marker {
    fn id(&self) -> BackendId {
        BackendId(9)
    }
    fn name(&self) -> &str {
        "marker"
    }
}

impl Memory for Marker {
    fn alloc(&mut self, _bytes: usize) -> Result<BufId> {
        unreachable!("the helper is only asked to multiply")
    }
    fn free(&mut self, _buf: BufId) {}
    fn write(&mut self, _buf: BufId, _offset: usize, _data: &[u8]) -> Result<()> {
        unreachable!()
    }
    fn read(&mut self, _buf: BufId, _offset: usize, _out: &mut [u8]) -> Result<()> {
        unreachable!()
    }
}

impl Capabilities for Marker {
    fn supports_op(&self, _op: &Op, _dtype: DType, _w: &dyn WeightSource) -> Support {
        Ok(())
    }
    fn supports_fused(&self, _op: FusedOp) -> Support {
        Ok(())
    }
    fn can_stream_matmul(&self, _w: &WeightRef<'_>) -> Support {
        if self.refuse {
            Err("refused".into())
        } else {
            Ok(())
        }
    }
}

impl Executor for Marker {
    fn execute_node(&mut self, _node: &Node, _args: &ExecArgs) -> Result<()> {
        Err(Error::Graph("the helper runs no node".into()))
    }
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
    fn stream_matmul(
        &mut self,
        w: &WeightRef<'_>,
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) -> Result<()> {
        assert_eq!((w.ne0, w.ne1, x.len(), y.len()), (K, M, n * K, n * M));
        self.calls.push(n);
        let base = 1000.0 * self.calls.len() as f32;
        for (i, v) in y.iter_mut().enumerate() {
            *v = base + i as f32;
        }
        Ok(())
    }
}

fn setup(weights: &Weights) -> (CpuBackend, [Option<BufId>; 1], BufId, Vec<f32>) {
    let mut cpu = CpuBackend::new(1);
    cpu.prepare_weights(weights, &[WeightId(0), WeightId(1)])
        .unwrap();
    let x: Vec<f32> = (0..N * K)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect();
    let xb = cpu.alloc(N * K * 4).unwrap();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    cpu.write(xb, 0, &bytes).unwrap();
    let out = cpu.alloc(N * M * 4).unwrap();
    (cpu, [Some(xb)], out, x)
}

fn node(layer: usize) -> Node {
    Node {
        id: NodeId(1),
        name: format!("L{layer}.q"),
        op: Op::MatMul {
            weight: WeightId(0),
            bias: Some(WeightId(1)),
        },
        src: vec![NodeId(0)],
        shape: [M, N],
        dtype: DType::F32,
        backend: Some(BackendId(0)),
        layer: Some(layer),
        dead: false,
    }
}

fn read(cpu: &mut CpuBackend, out: BufId) -> Vec<f32> {
    let mut b = vec![0u8; N * M * 4];
    cpu.read(out, 0, &mut b).unwrap();
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs the node in a helped split (blocks = 2) with `classes` and returns the output.
fn helped(
    weights: &Weights,
    layer: usize,
    classes: Option<&[RowClass]>,
    helper: &mut Marker,
) -> Vec<f32> {
    let (mut cpu, srcs, out, _) = setup(weights);
    if let Some(c) = classes {
        cpu.set_row_classes(&RowClasses {
            tokens: c.to_vec(),
            outputs: c.to_vec(),
        });
    }
    let n = node(layer);
    let args = ExecArgs {
        srcs: &srcs,
        out: Some(out),
        kv: None,
        weights,
    };
    cpu.execute_split_helped(SplitKey::UNPLANNED, &[&n], &[args], helper, 2)
        .unwrap();
    read(&mut cpu, out)
}

/// The CPU alone (no helper, no classes).
fn alone(weights: &Weights) -> Vec<f32> {
    let (mut cpu, srcs, out, _) = setup(weights);
    let n = node(0);
    let args = ExecArgs {
        srcs: &srcs,
        out: Some(out),
        kv: None,
        weights,
    };
    cpu.execute_node(&n, &args).unwrap();
    read(&mut cpu, out)
}

fn weights() -> Weights {
    let bias: Vec<f32> = (0..M).map(|j| 0.25 * j as f32 - 1.0).collect();
    Weights {
        matrix: random_blocks(GgmlType::Q8_0, M * K / 32, 7),
        bias: bias.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

#[test]
fn prompt_runs_go_to_the_helper_and_generation_rows_stay_bit_for_bit() {
    use RowClass::{Generation as G, Prompt as P};
    let w = weights();
    let want = alone(&w);
    let bias: Vec<f32> = (0..M).map(|j| 0.25 * j as f32 - 1.0).collect();
    let mut h = Marker::default();
    let got = helped(&w, 0, Some(&[P, P, G, P, G]), &mut h);
    assert_eq!(h.calls, [2, 1], "one call per run of prompt rows");
    let marker = |call: usize, r: usize, j: usize| 1000.0 * call as f32 + (r * M + j) as f32;
    for (row, (call, r)) in [(0, (1, 0)), (1, (1, 1)), (3, (2, 0))] {
        for j in 0..M {
            assert_eq!(
                got[row * M + j],
                marker(call, r, j) + bias[j],
                "prompt row {row}"
            );
        }
    }
    for row in [2, 4] {
        let (a, b) = (&got[row * M..(row + 1) * M], &want[row * M..(row + 1) * M]);
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "generation row {row}"
        );
    }
}

#[test]
fn the_output_position_a_refusing_helper_and_unclassed_rows_stay_on_the_cpu() {
    use RowClass::Prompt as P;
    let w = weights();
    let want = alone(&w);
    let same = |got: &[f32]| {
        got.iter()
            .zip(&want)
            .all(|(x, y)| x.to_bits() == y.to_bits())
    };
    // Layer 2 of blocks = 2: the output position (final norm and head).
    let mut h = Marker::default();
    assert!(same(&helped(&w, 2, Some(&[P; N]), &mut h)) && h.calls.is_empty());
    let mut h = Marker {
        refuse: true,
        ..Marker::default()
    };
    assert!(same(&helped(&w, 0, Some(&[P; N]), &mut h)) && h.calls.is_empty());
    let mut h = Marker::default();
    assert!(same(&helped(&w, 0, None, &mut h)) && h.calls.is_empty());
    // Control: the same prompt rows of a block do go to the helper.
    let mut h = Marker::default();
    assert!(!same(&helped(&w, 0, Some(&[P; N]), &mut h)) && h.calls == [N]);
}

//! Shared by the executor gates: weights in a page-aligned mapping, the backends, small
//! graphs, and a runner (assign, plan, fill, execute, read).
#![allow(dead_code)]

use minfer_cpu::CpuBackend;
use minfer_gguf::{quants, GgmlType};
use minfer_graph::{
    assign_backends, execute, fill_input, read_output, Allocator, Backend, BackendId, Graph,
    GraphBuilder, InputKind, Op, Placement, WeightId, WeightRef, WeightSource,
};
pub use minfer_metal::MetalBackend;
pub use minfer_msl_emu::{EmuDevice, Schedule};

pub const METAL: BackendId = BackendId(1);

/// Weights held in one page-aligned anonymous mapping (so the device can wrap it zero-copy)
/// or, with `mapped = false`, reported as unmapped (the device copies them).
pub struct Weights {
    pub map: memmap2::MmapMut,
    pub table: Vec<(String, GgmlType, usize, usize, usize, usize)>, // name, ty, ne0, ne1, off, len
    pub mapped: bool,
}

impl Weights {
    pub fn new(list: &[(&str, GgmlType, usize, usize, Vec<u8>)], mapped: bool) -> Weights {
        let total: usize = list.iter().map(|w| w.4.len().next_multiple_of(64)).sum();
        let mut map = memmap2::MmapMut::map_anon(total.max(4096)).unwrap();
        let mut table = Vec::new();
        let mut off = 0;
        for (name, ty, ne0, ne1, bytes) in list {
            map[off..off + bytes.len()].copy_from_slice(bytes);
            table.push((name.to_string(), *ty, *ne0, *ne1, off, bytes.len()));
            off += bytes.len().next_multiple_of(64);
        }
        Weights { map, table, mapped }
    }
    pub fn ids(&self) -> Vec<WeightId> {
        (0..self.table.len() as u32).map(WeightId).collect()
    }
}

impl WeightSource for Weights {
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
        let (_, ty, ne0, ne1, off, len) = self.table.get(id.index())?;
        Some(WeightRef {
            ty: *ty,
            ne0: *ne0,
            ne1: *ne1,
            bytes: &self.map[*off..off + len],
        })
    }
    fn name(&self, id: WeightId) -> &str {
        self.table.get(id.index()).map_or("?", |w| w.0.as_str())
    }
    fn id(&self, name: &str) -> Option<WeightId> {
        self.table
            .iter()
            .position(|w| w.0 == name)
            .map(|i| WeightId(i as u32))
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn part(&self, _id: WeightId) -> Option<(usize, &[u8])> {
        self.mapped.then_some((0, &self.map[..]))
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

pub fn quantized(ty: GgmlType, v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(v.len() as u64).unwrap() as usize];
    quants::quantize_row(ty, v, &mut out).unwrap();
    out
}

pub fn metal() -> MetalBackend<EmuDevice> {
    MetalBackend::new(EmuDevice::new(Schedule::Forward), METAL, "metal-emu")
}

/// Backends for a run: the CPU alone, or Metal (with the CPU, as the engine always has it),
/// in priority order (assignment gives a node to the first that takes it).
pub fn backends(with_metal: bool, w: &Weights, copy: bool) -> Vec<Box<dyn Backend>> {
    let mut v: Vec<Box<dyn Backend>> = Vec::new();
    if with_metal {
        v.push(Box::new(metal().with_weight_copy(copy)));
    }
    v.push(Box::new(CpuBackend::new(1)));
    for b in &mut v {
        b.prepare_weights(w, &w.ids()).unwrap();
    }
    v
}

/// Assigns (the first backend that takes a node, or `force` per node index), plans, fills
/// token ids, runs, reads.
pub fn run(
    g: Graph,
    bes: &mut [Box<dyn Backend>],
    w: &Weights,
    force: Option<&dyn Fn(usize) -> BackendId>,
    ids: &[i32],
) -> (Vec<f32>, Graph) {
    run_rows(g, bes, w, force, ids, &minfer_graph::RowClasses::default())
}

/// [`run`] with the forward's row classes (none named: every row a generation row).
pub fn run_rows(
    g: Graph,
    bes: &mut [Box<dyn Backend>],
    w: &Weights,
    force: Option<&dyn Fn(usize) -> BackendId>,
    ids: &[i32],
    rows: &minfer_graph::RowClasses,
) -> (Vec<f32>, Graph) {
    try_run_rows(g, bes, w, force, ids, rows).unwrap()
}

/// [`run_rows`], the execution's error returned (assignment and planning still unwrap).
pub fn try_run_rows(
    mut g: Graph,
    bes: &mut [Box<dyn Backend>],
    w: &Weights,
    force: Option<&dyn Fn(usize) -> BackendId>,
    ids: &[i32],
    rows: &minfer_graph::RowClasses,
) -> Result<(Vec<f32>, Graph), minfer_graph::Error> {
    assign_backends(&mut g, bes, w, &Placement::everywhere(bes)).unwrap();
    if let Some(f) = force {
        for (i, n) in g.nodes.iter_mut().enumerate() {
            n.backend = Some(f(i));
        }
    }
    let mut alloc = Allocator::new();
    let plan = alloc.plan(&g, bes, &|_| Ok(0)).unwrap();
    fill_input(&g, &plan, bes, InputKind::TokenIds, ids).unwrap();
    execute(&g, &plan, bes, w, rows)?;
    let mut out = Vec::new();
    read_output(&g, &plan, bes, &mut out).unwrap();
    Ok((out, g))
}

pub fn on(g: &Graph, be: BackendId) -> usize {
    g.nodes
        .iter()
        .filter(|n| !n.dead && n.backend == Some(be))
        .count()
}

pub const D: usize = 64;
pub const ROWS: usize = 32;

pub fn embed_weights(mapped: bool) -> Weights {
    Weights::new(
        &[(
            "embd",
            GgmlType::F32,
            D,
            ROWS,
            f32_bytes(&values(D * ROWS, 7)),
        )],
        mapped,
    )
}

/// ids -> embd rows -> ((x + x) * x) + x
pub fn elementwise_graph(w: &Weights, nt: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let ids = b.input(InputKind::TokenIds, [nt, 1]);
    let x = b.op(
        "x",
        Op::GetRows {
            weight: w.id("embd").unwrap(),
        },
        &[ids],
        [D, nt],
    );
    let a = b.op("a", Op::Add, &[x, x], [D, nt]);
    let m = b.op("m", Op::Mul, &[a, x], [D, nt]);
    let m2 = b.op("m2", Op::Mul, &[m, a], [D, nt]);
    let o = b.op("o", Op::Add, &[m2, x], [D, nt]);
    b.finish(o)
}

pub const IDS: [i32; 5] = [3, 0, 31, 17, 3];
pub fn norm_matmul_graph(w: &Weights, nt: usize, n_out: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let ids = b.input(InputKind::TokenIds, [nt, 1]);
    let x = b.op(
        "x",
        Op::GetRows {
            weight: w.id("embd").unwrap(),
        },
        &[ids],
        [D, nt],
    );
    let n = b.op(
        "norm",
        Op::RmsNorm {
            eps: 1e-6,
            weight: w.id("gain").unwrap(),
            group: D,
        },
        &[x],
        [D, nt],
    );
    let y = b.op(
        "proj",
        Op::MatMul {
            weight: w.id("proj").unwrap(),
            bias: w.id("bias"),
        },
        &[n],
        [n_out, nt],
    );
    let s = b.op("act", Op::Silu, &[y], [n_out, nt]);
    b.finish(s)
}

pub fn proj_weights(ty: GgmlType, n_out: usize) -> Weights {
    let proj = values(D * n_out, 11);
    let bytes = match ty {
        GgmlType::F32 => f32_bytes(&proj),
        t => proj.chunks(D).flat_map(|r| quantized(t, r)).collect(),
    };
    Weights::new(
        &[
            (
                "embd",
                GgmlType::F32,
                D,
                ROWS,
                f32_bytes(&values(D * ROWS, 7)),
            ),
            ("gain", GgmlType::F32, D, 1, f32_bytes(&values(D, 3))),
            ("proj", ty, D, n_out, bytes),
            (
                "bias",
                GgmlType::F32,
                n_out,
                1,
                f32_bytes(&values(n_out, 5)),
            ),
        ],
        true,
    )
}

pub fn node(name: &str, op: Op, srcs: usize, shape: [usize; 2]) -> minfer_graph::Node {
    minfer_graph::Node {
        id: minfer_graph::NodeId(srcs as u32),
        name: name.into(),
        dtype: if matches!(op, Op::KvStore { .. }) {
            minfer_graph::DType::None
        } else {
            minfer_graph::DType::F32
        },
        op,
        src: (0..srcs as u32).map(minfer_graph::NodeId).collect(),
        shape,
        backend: Some(METAL),
        layer: Some(0),
        dead: false,
    }
}

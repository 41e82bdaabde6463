//! The CPU backend: every op the supported architectures need, over an f32-word buffer pool.
//!
//! Kernels live in [`ops`] as plain slice functions; [`dot`] is the per-weight-type dispatch
//! point for SIMD variants; [`threads`] splits rows across `threads` workers.

pub mod cpu_features;
pub mod dot;
mod dump;
pub mod fastdot;
pub mod huge;
pub mod llamacpp_x86;
pub mod ops;
pub mod plant;
pub mod settings;
pub mod simd;
pub mod threads;

use minfer_gguf::{quants, GgmlType};
use minfer_graph::{
    BackendId, BufId, Capabilities, CaptureLog, DType, Error, ExecArgs, Executor, FusedOp,
    Identity, Memory, Node, NodeId, Op, Result, Support, WeightId, WeightRef, WeightSource,
    WindowLayout,
};
use ops::{attn, elementwise as ew, matmul, norm, rope, rows, KernelError};
pub use settings::CpuSettings;

/// The CPU's fixed backend id.
pub const CPU_ID: BackendId = BackendId(0);

/// The CPU's row of the backend table: always compiled in, always available, taking part
/// unless other backends take every node (the engine's registry lists it last).
pub fn entry() -> minfer_graph::BackendEntry {
    minfer_graph::BackendEntry {
        id: CPU_ID,
        name: "cpu",
        compiled: Ok(()),
        available: Ok(()),
        by_default: true,
    }
}

/// KV cache element types the CPU reads and writes.
pub const KV_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0];

/// Which float arithmetic the kernels follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// minfer's own order: the same bits on every instruction set, the fastest kernels.
    #[default]
    Native,
    /// llama.cpp's x86 CPU build, float op for float op ([`llamacpp_x86`]); refuses what it lacks.
    LlamaCpp(llamacpp_x86::LlamaCppX86),
}

impl Numerics {
    /// The `--numerics` values.
    pub const NAMES: [&'static str; 3] = ["native", "llamacpp-x86-avx2", "llamacpp-x86-avx512"];

    pub fn parse(s: &str) -> Option<Numerics> {
        use llamacpp_x86::LlamaCppX86 as S;
        match s {
            "native" => Some(Numerics::Native),
            "llamacpp-x86-avx2" => Some(Numerics::LlamaCpp(S::Avx2)),
            "llamacpp-x86-avx512" => Some(Numerics::LlamaCpp(S::Avx512)),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        use llamacpp_x86::LlamaCppX86 as S;
        match self {
            Numerics::Native => Self::NAMES[0],
            Numerics::LlamaCpp(S::Avx2) => Self::NAMES[1],
            Numerics::LlamaCpp(S::Avx512) => Self::NAMES[2],
        }
    }

    fn llamacpp(self) -> Option<llamacpp_x86::LlamaCppX86> {
        match self {
            Numerics::Native => None,
            Numerics::LlamaCpp(s) => Some(s),
        }
    }
}

pub struct CpuBackend {
    threads: usize,
    numerics: Numerics,
    /// Buffers as f32 words (4-byte aligned); `None` once freed.
    pool: Vec<Option<Vec<f32>>>,
    /// Per weight id, the f32 values of one-row weights (norms, biases), derived once in
    /// `prepare_weights` so no forward dequantizes them again.
    vectors: Vec<Option<Vec<f32>>>,
    /// Node outputs kept for a trace while armed ([`minfer_graph::Executor::capture`]).
    captures: CaptureLog,
    /// The test-only planted kernel bug (`MINFER_TEST_PLANT_CPU`, [`plant`]); None normally.
    plant: Option<plant::Plant>,
    /// `MINFER_DUMP_DIR`: every node's output written there ([`dump`]).
    dump_dir: Option<std::path::PathBuf>,
    /// Per weight id, the matrix in a packed layout (`ops::matmul::packed`), made the first
    /// time a matmul reads it.
    packed: Vec<Option<(matmul::Layout, huge::HugeBytes)>>,
    /// Per weight id, the packed layout chosen at load and not yet made (`pack_on_first_use`),
    /// and whether the weight's plain bytes are a file mapping whose pages can be released.
    pending: Vec<Option<(matmul::Layout, bool)>>,
    /// `MINFER_CPU_PACK=0`: every matrix stays in its file's plain rows.
    plain_rows: bool,
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; u8 has alignment 1 and every byte is initialised.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is a valid f32, so any byte write keeps it valid.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl CpuBackend {
    /// `threads == 0` means the number of physical cores.
    pub fn new(threads: usize) -> Self {
        let threads = if threads == 0 {
            threads::physical_cores()
        } else {
            threads
        };
        CpuBackend {
            threads,
            numerics: Numerics::Native,
            pool: Vec::new(),
            vectors: Vec::new(),
            captures: CaptureLog::default(),
            plant: None,
            dump_dir: None,
            packed: Vec::new(),
            pending: Vec::new(),
            plain_rows: false,
        }
    }

    /// A backend whose kernels follow `numerics` (nothing planted, nothing dumped).
    pub fn with_numerics(threads: usize, numerics: Numerics) -> Self {
        CpuBackend {
            numerics,
            ..CpuBackend::new(threads)
        }
    }

    /// A backend with the knobs of `s` (what the engine instantiates).
    pub fn with_settings(threads: usize, s: &CpuSettings) -> Self {
        CpuBackend {
            numerics: s.numerics,
            plant: s.plant.clone(),
            dump_dir: s.dump_dir.clone(),
            plain_rows: s.plain_rows,
            ..CpuBackend::new(threads)
        }
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn buf(&self, id: BufId) -> Result<&Vec<f32>> {
        self.pool
            .get(id.0 as usize)
            .and_then(|b| b.as_ref())
            .ok_or_else(|| Error::Backend {
                backend: "cpu".into(),
                problem: format!("buffer {} does not exist", id.0),
            })
    }

    fn take(&mut self, id: BufId) -> Result<Vec<f32>> {
        self.buf(id)?;
        Ok(self.pool[id.0 as usize].take().unwrap_or_default())
    }

    fn put(&mut self, id: BufId, v: Vec<f32>) {
        self.pool[id.0 as usize] = Some(v);
    }

    fn run(
        &self,
        node: &Node,
        args: &ExecArgs,
        alias0: Option<&[f32]>,
        out: &mut [f32],
        kv: Option<&mut (Vec<f32>, Vec<f32>)>,
    ) -> std::result::Result<(), KernelError> {
        let src = |i: usize| -> std::result::Result<&[f32], KernelError> {
            if i == 0 {
                if let Some(a) = alias0 {
                    return Ok(a);
                }
            }
            let id = args
                .srcs
                .get(i)
                .copied()
                .flatten()
                .ok_or_else(|| KernelError(format!("src {i} has no buffer")))?;
            let b = self.buf(id).map_err(|e| KernelError(e.to_string()))?;
            Ok(b.as_slice())
        };
        let weight = |id: WeightId| {
            args.weights.weight(id).ok_or_else(|| {
                KernelError(format!("weight {} is not loaded", args.weights.name(id)))
            })
        };
        let vector = |id: WeightId| -> std::result::Result<&[f32], KernelError> {
            self.vectors
                .get(id.index())
                .and_then(|v| v.as_deref())
                .ok_or_else(|| {
                    KernelError(format!(
                        "weight {} was not prepared as a vector",
                        args.weights.name(id)
                    ))
                })
        };
        let n = node.n_elems();
        let [ne0, ne1] = node.shape;
        match &node.op {
            Op::Input(_) => {}
            Op::GetRows { weight: id } => {
                let w = weight(*id)?;
                rows::get_rows(w.ty, w.bytes, w.ne0, w.ne1, &src(0)?[..ne1], out)?;
            }
            Op::SelectRows => rows::select_rows(src(0)?, ne0, &src(1)?[..ne1], out)?,
            Op::MatMul { weight: id, bias } => {
                let w = weight(*id)?;
                let (layout, bytes) = match self.packed.get(id.index()).and_then(|p| p.as_ref()) {
                    Some((layout, bytes)) => (*layout, &bytes[..]),
                    None => (matmul::Layout::Rows, w.bytes),
                };
                let mw = matmul::Weight {
                    ty: w.ty,
                    k: w.ne0,
                    m: w.ne1,
                    bytes,
                    layout,
                };
                let b = bias.map(vector).transpose()?;
                if let Some(simd) = self.numerics.llamacpp() {
                    return llamacpp_x86::matmul(
                        simd,
                        &mw,
                        &src(0)?[..w.ne0 * ne1],
                        b,
                        out,
                        self.threads,
                    );
                }
                matmul::matmul(&mw, &src(0)?[..w.ne0 * ne1], b, out, self.threads)?;
            }
            Op::RmsNorm {
                eps,
                weight: id,
                group,
            } => {
                let w = vector(*id)?;
                if w.len() != *group {
                    return Err(KernelError(format!(
                        "norm weight {} has {} elements, group is {group}",
                        args.weights.name(*id),
                        w.len()
                    )));
                }
                let eps = match &self.plant {
                    Some(p) if p.hits(node) => *eps + plant::PLANTED_EPS,
                    _ => *eps,
                };
                norm::rms_norm(&src(0)?[..n], w, eps, out);
            }
            Op::Rope {
                style,
                n_head,
                head_dim,
                freq_base,
                freq_scale,
            } => {
                let p = rope::RopeParams {
                    style: *style,
                    n_head: *n_head,
                    head_dim: *head_dim,
                    freq_base: *freq_base,
                    freq_scale: *freq_scale,
                    fused: self.numerics.llamacpp().is_some(),
                };
                rope::rope(&p, &src(0)?[..n], &src(1)?[..ne1], out);
            }
            Op::Add => ew::add(&src(0)?[..n], &src(1)?[..n], out),
            Op::Mul => ew::mul(&src(0)?[..n], &src(1)?[..n], out),
            Op::Silu => match self.numerics.llamacpp() {
                Some(simd) => llamacpp_x86::expf::silu(simd, &src(0)?[..n], out),
                None => ew::silu_into(&src(0)?[..n], out),
            },
            Op::SwiGLU => match self.numerics.llamacpp() {
                Some(simd) => {
                    llamacpp_x86::expf::swiglu(simd, &src(0)?[..n], &src(1)?[..n], ne0, out)
                }
                None => ew::swiglu_threads(&src(0)?[..n], &src(1)?[..n], out, self.threads),
            },
            Op::KvStore {
                kind, cache_type, ..
            } => {
                let (k, v) = kv.ok_or_else(|| KernelError("no KV region".into()))?;
                let region = match kind {
                    minfer_graph::KvKind::K => k,
                    minfer_graph::KvKind::V => v,
                };
                let (x, cells) = (src(0)?, src(1)?);
                // A KV store node has the shape of the rows it writes.
                let (n_embd_kv, nt) = (ne0, ne1);
                attn::kv_store(
                    *cache_type,
                    &x[..n_embd_kv * nt],
                    n_embd_kv,
                    &cells[..nt],
                    as_bytes_mut(region),
                )?;
            }
            Op::KvCopy { .. } | Op::KvRopeShift { .. } => {
                let (k, v) = kv.ok_or_else(|| KernelError("no KV region".into()))?;
                ops::kv_cells::run_cell_op(&node.op, as_bytes_mut(k), as_bytes_mut(v))?;
            }
            Op::Attention {
                n_head,
                n_head_kv,
                head_dim,
                scale,
                cache_type,
                window,
                ..
            } => {
                let (k, v) = kv.ok_or_else(|| KernelError("no KV region".into()))?;
                // The window input is [2, n] (span) or [KV_MAP_WIDTH, n] (kv map), as the op says.
                let width = match window {
                    WindowLayout::Span => attn::SPAN_WIDTH,
                    WindowLayout::KvMap => attn::KV_MAP_WIDTH,
                };
                let p = attn::AttnParams {
                    n_head: *n_head,
                    n_head_kv: *n_head_kv,
                    head_dim: *head_dim,
                    scale: *scale,
                    cache_type: *cache_type,
                    llamacpp: self.numerics.llamacpp(),
                };
                attn::attention(
                    &p,
                    &src(0)?[..n],
                    &src(1)?[..width * ne1],
                    as_bytes(k),
                    as_bytes(v),
                    out,
                    self.threads,
                )?;
            }
            Op::QkvRopeStore(_) | Op::FfnGateUp { .. } | Op::MatMulAdd { .. } => {
                // supports_op refuses them, so fusion never gives the CPU one.
                return Err(KernelError(format!(
                    "{} is a fused decode op the CPU does not run (it runs the unfused chain)",
                    node.op.name()
                )));
            }
        }
        Ok(())
    }
}

impl Identity for CpuBackend {
    fn id(&self) -> BackendId {
        CPU_ID
    }

    fn name(&self) -> &str {
        "cpu"
    }
}

impl CpuBackend {
    /// Packs weight `id` if load chose a layout for it and no matmul has read it yet: the
    /// packed copy in huge pages, then the file pages of its plain rows released (they stay
    /// readable: a tied embedding's rows are looked up there).
    fn pack_on_first_use(&mut self, id: WeightId, weights: &dyn WeightSource) -> Result<()> {
        let Some((layout, mapped)) = self.pending.get_mut(id.index()).and_then(|p| p.take()) else {
            return Ok(());
        };
        let fail = |problem: String| Error::Backend {
            backend: "cpu".into(),
            problem: format!("weight {}: {problem}", weights.name(id)),
        };
        let w = weights
            .weight(id)
            .ok_or_else(|| fail("not in the model".into()))?;
        let p = matmul::packed::pack_x16_on(layout, w.bytes, w.ne0, w.ne1, self.threads, mapped)
            .map_err(|e| fail(e.0))?;
        self.packed[id.index()] = Some((layout, p));
        if mapped {
            // The pages the tasks shared at their boundaries.
            huge::release_mapped(w.bytes);
        }
        Ok(())
    }
}

impl Memory for CpuBackend {
    fn keep_weight_bytes(&mut self, ids: &[WeightId]) {
        // Packing would release the plain rows' pages (`pack_on_first_use`); the device's
        // copies would then fault them back in, page by page, every forward.
        for id in ids {
            if let Some(Some((_, mapped))) = self.pending.get_mut(id.index()) {
                *mapped = false;
            }
        }
    }

    fn can_hold(&self, w: &WeightRef) -> Support {
        if w.ty.is_supported() {
            Ok(())
        } else {
            Err(format!("{} is not a supported weight type", w.ty).into())
        }
    }

    fn prepare_weights(&mut self, weights: &dyn WeightSource, ids: &[WeightId]) -> Result<()> {
        self.vectors = vec![None; weights.len()];
        self.packed = (0..weights.len()).map(|_| None).collect();
        self.pending = vec![None; weights.len()];
        // Packed layouts stream in huge pages (`huge`), and are minfer's own kernels' (llama.cpp's
        // arithmetic reads plain rows).
        let pack =
            !self.plain_rows && self.numerics == Numerics::Native && huge::huge_pages_available();
        for &id in ids {
            let Some(w) = weights.weight(id) else {
                continue;
            };
            let layout = matmul::Layout::packed_for(w.ty)
                .filter(|_| pack && w.ne1 >= matmul::packed::X16)
                .filter(|_| simd::x16_kernel(w.ty).is_some());
            if let Some(layout) = layout {
                // Made when a matmul first reads the weight (`pack_on_first_use`): a weight
                // only looked up by rows (an untied token embedding) or held for nodes another
                // backend runs (the CPU holds every weight of a GPU plan) is never packed.
                self.pending[id.index()] = Some((layout, weights.part(id).is_some()));
                continue;
            }
            // One-row weights are norms and biases: kept as f32, read by every forward.
            if w.ne1 != 1 {
                continue;
            }
            let mut v = vec![0f32; w.ne0];
            quants::dequantize_row(w.ty, w.bytes, &mut v).map_err(|e| Error::Backend {
                backend: "cpu".into(),
                problem: format!("weight {}: {e}", weights.name(id)),
            })?;
            self.vectors[id.index()] = Some(v);
        }
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufId> {
        let v = vec![0f32; bytes.div_ceil(4)];
        let id = match self.pool.iter().position(|b| b.is_none()) {
            Some(i) => {
                self.pool[i] = Some(v);
                i
            }
            None => {
                self.pool.push(Some(v));
                self.pool.len() - 1
            }
        };
        Ok(BufId(id as u32))
    }

    fn free(&mut self, buf: BufId) {
        if let Some(slot) = self.pool.get_mut(buf.0 as usize) {
            *slot = None;
        }
    }

    fn write(&mut self, buf: BufId, offset: usize, data: &[u8]) -> Result<()> {
        let b = self.pool.get_mut(buf.0 as usize).and_then(|b| b.as_mut());
        let bytes = b.map(|v| as_bytes_mut(v)).ok_or_else(|| Error::Backend {
            backend: "cpu".into(),
            problem: format!("write to missing buffer {}", buf.0),
        })?;
        let end = offset + data.len();
        if end > bytes.len() {
            return Err(Error::Backend {
                backend: "cpu".into(),
                problem: format!("write of {end} bytes into a {}-byte buffer", bytes.len()),
            });
        }
        bytes[offset..end].copy_from_slice(data);
        Ok(())
    }

    fn read(&mut self, buf: BufId, offset: usize, out: &mut [u8]) -> Result<()> {
        let bytes = as_bytes(self.buf(buf)?);
        let end = offset + out.len();
        if end > bytes.len() {
            return Err(Error::Backend {
                backend: "cpu".into(),
                problem: format!("read of {end} bytes from a {}-byte buffer", bytes.len()),
            });
        }
        out.copy_from_slice(&bytes[offset..end]);
        Ok(())
    }
}

impl Capabilities for CpuBackend {
    fn batch_invariant(&self) -> bool {
        // llama.cpp's arithmetic changes with the number of rows (tiled paths from 8 and 64).
        self.numerics == Numerics::Native
    }

    fn check_kv_type(&self, ty: GgmlType) -> Support {
        if !KV_TYPES.contains(&ty) {
            return Err("the CPU backend reads f32, f16 and q8_0 KV caches".into());
        }
        if self.numerics != Numerics::Native && ty != GgmlType::F16 {
            return Err(
                format!("--numerics {} needs an f16 KV cache", self.numerics.name()).into(),
            );
        }
        Ok(())
    }

    fn supports_op(&self, op: &Op, _dtype: DType, weights: &dyn WeightSource) -> Support {
        let matrix = |id: WeightId| -> Support {
            let w = weights
                .weight(id)
                .ok_or_else(|| format!("weight {} is not in the model", weights.name(id)))?;
            if !w.ty.is_supported() {
                return Err(
                    format!("{} is {}, not a supported type", weights.name(id), w.ty).into(),
                );
            }
            Ok(())
        };
        let vector = |id: WeightId| -> Support {
            match weights.weight(id) {
                Some(w) if w.ne1 == 1 => Ok(()),
                _ => Err(format!("{} is not a one-row weight", weights.name(id)).into()),
            }
        };
        match op {
            Op::GetRows { weight } => matrix(*weight),
            Op::MatMul { weight, bias } => {
                matrix(*weight)?;
                if let Some(b) = bias {
                    vector(*b)?;
                }
                let w = weights.weight(*weight).ok_or("weight not in the model")?;
                match self.numerics.llamacpp() {
                    Some(_) if !llamacpp_x86::supports_weight(w.ty, w.ne0, w.ne1) => Err(format!(
                        "--numerics {} has no {} matmul of {} rows: it reproduces Q4_1, Q5_0, \
                         Q8_0, Q6_K, and Q4_K with a multiple of 8 rows",
                        self.numerics.name(),
                        w.ty,
                        w.ne1
                    )
                    .into()),
                    _ => Ok(()),
                }
            }
            Op::RmsNorm { weight, .. } => vector(*weight),
            Op::KvStore { cache_type, .. } | Op::Attention { cache_type, .. } => {
                self.check_kv_type(*cache_type)
            }
            Op::KvCopy { layout, .. } => self.check_kv_type(layout.cache_type),
            Op::KvRopeShift { layout, .. } => match layout.cache_type {
                GgmlType::F32 | GgmlType::F16 => Ok(()),
                other => Err(format!(
                    "a {other} KV cache cannot shift positions on the CPU (its rows would be \
                     re-quantized)"
                )
                .into()),
            },
            Op::Input(_)
            | Op::SelectRows
            | Op::Rope { .. }
            | Op::Add
            | Op::Mul
            | Op::Silu
            | Op::SwiGLU => Ok(()),
            Op::QkvRopeStore(_) | Op::FfnGateUp { .. } | Op::MatMulAdd { .. } => Err(format!(
                "{} is a fused decode node; the CPU runs the chain",
                op.name()
            )
            .into()),
        }
    }

    fn supports_fused(&self, op: FusedOp) -> Support {
        match op {
            FusedOp::SwiGLU => Ok(()),
            // The decode fusions exist for dispatch-bound devices; the CPU keeps the chain.
            FusedOp::QkvRopeStore
            | FusedOp::QkvNormRopeStore
            | FusedOp::FfnGateUp
            | FusedOp::InputNorm
            | FusedOp::MatMulAdd => Err(
                "the decode fusions are for dispatch-bound devices; the CPU runs the chain".into(),
            ),
        }
    }
}

impl Executor for CpuBackend {
    fn execute_node(&mut self, node: &Node, args: &ExecArgs) -> Result<()> {
        self.run_node(node, args)
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }

    fn capture(&mut self, on: bool) -> Result<()> {
        self.captures.arm(on);
        Ok(())
    }

    fn take_captures(&mut self) -> Result<Vec<(NodeId, Vec<f32>)>> {
        Ok(self.captures.take())
    }

    fn take_node_times(&mut self) -> Vec<(NodeId, u64)> {
        self.captures.take_times()
    }

    fn node_time_source(&self) -> Option<&'static str> {
        Some("host wall time of the node's kernel call")
    }
}

impl CpuBackend {
    /// A node run by this backend.
    fn run_node(&mut self, node: &Node, args: &ExecArgs) -> Result<()> {
        if let Op::MatMul { weight, .. } = node.op {
            self.pack_on_first_use(weight, args.weights)?;
        }
        // An aliased src0 shares the output buffer: copy it before the output is taken.
        let alias0 = match (args.srcs.first().copied().flatten(), args.out) {
            (Some(s), Some(o)) if s == o => Some(self.buf(s)?[..node.n_elems()].to_vec()),
            _ => None,
        };
        let mut out = match args.out {
            Some(b) => self.take(b)?,
            None => Vec::new(),
        };
        let mut kv = match args.kv {
            Some(p) => Some((self.take(p.k)?, self.take(p.v)?)),
            None => None,
        };
        let n = if args.out.is_some() {
            node.n_elems()
        } else {
            0
        };
        // Timed only while a trace is armed (the same branch the capture below takes).
        let t0 = self.captures.armed().then(std::time::Instant::now);
        let res = if out.len() < n {
            Err(KernelError(format!(
                "output buffer holds {} values, node needs {n}",
                out.len()
            )))
        } else {
            self.run(node, args, alias0.as_deref(), &mut out[..n], kv.as_mut())
        };
        if let Some(t0) = t0 {
            self.captures
                .record_time(node.id, t0.elapsed().as_nanos() as u64);
        }
        if let (Some(dir), Ok(())) = (self.dump_dir.as_deref(), &res) {
            dump::dump_node(dir, node, &out[..n]);
        }
        if self.captures.armed() && res.is_ok() {
            self.captures.record(node, &out[..n]);
        }
        if let Some(b) = args.out {
            self.put(b, out);
        }
        if let (Some(p), Some((k, v))) = (args.kv, kv) {
            self.put(p.k, k);
            self.put(p.v, v);
        }
        res.map_err(|e| Error::Exec {
            node: node.name.clone(),
            problem: e.0,
        })
    }
}

#[cfg(test)]
mod packing_tests {
    use super::*;
    use minfer_gguf::quants::random_blocks;

    /// Two Q4_0 matrices of 32 rows of 64: weight 0 read by a matmul, weight 1 only looked
    /// up by rows.
    struct TwoMatrices(Vec<u8>, Vec<u8>);

    impl WeightSource for TwoMatrices {
        fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
            let bytes = match id.0 {
                0 => &self.0,
                1 => &self.1,
                _ => return None,
            };
            Some(WeightRef {
                ty: GgmlType::Q4_0,
                ne0: 64,
                ne1: 32,
                bytes,
            })
        }
        fn name(&self, id: WeightId) -> &str {
            ["matrix", "table"].get(id.index()).copied().unwrap_or("?")
        }
        fn id(&self, name: &str) -> Option<WeightId> {
            ["matrix", "table"]
                .iter()
                .position(|&n| n == name)
                .map(|i| WeightId(i as u32))
        }
        fn len(&self) -> usize {
            2
        }
    }

    #[test]
    fn a_weight_is_packed_when_a_matmul_first_reads_it_and_not_before() {
        let w = TwoMatrices(
            random_blocks(GgmlType::Q4_0, 64, 3),
            random_blocks(GgmlType::Q4_0, 64, 4),
        );
        let mut be = CpuBackend::new(2);
        be.prepare_weights(&w, &[WeightId(0), WeightId(1)]).unwrap();
        let chosen = be.pending.iter().filter(|p| p.is_some()).count();
        if chosen == 0 {
            println!("SKIP: no packed layout here (no packed kernel or no huge pages)");
            return;
        }
        assert_eq!(chosen, 2, "both matrices can be packed");
        assert!(
            be.packed.iter().all(|p| p.is_none()),
            "nothing packed at load"
        );
        be.pack_on_first_use(WeightId(0), &w).unwrap();
        let (layout, bytes) = be.packed[0].as_ref().expect("packed at its first matmul");
        let want = matmul::packed::pack_x16(*layout, &w.0, 64, 32).unwrap();
        assert!(bytes[..] == want[..], "the packed layout");
        assert!(be.pending[0].is_none() && be.packed[1].is_none() && be.pending[1].is_some());
        // A second read packs nothing again.
        be.pack_on_first_use(WeightId(0), &w).unwrap();
        assert!(be.packed[1].is_none());
    }
}

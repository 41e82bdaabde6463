//! `CudaBackend`: the graph contract (crates/graph/src/backend.rs) on a [`Gpu`]. Modelled on
//! the Metal executor: a pool of device buffers reused at their exact length, weights
//! uploaded once at `prepare_weights` (norm gains and biases as f32 vectors), nodes encoded
//! in order on the engine's one stream, host reads ordered after the work that writes them.
//! Ids, cells and windows that index memory are checked on the host before any launch (an
//! `Err` naming the node, never a silent skip).

use std::collections::HashMap;
use std::sync::Arc;

use minfer_gguf::{quants, GgmlType};
use minfer_graph::{
    support, BackendId, BufId, Capabilities, CaptureLog, DType, Error as GraphError, ExecArgs,
    Executor, FusedOp, Identity, Memory, Node, NodeId, Op, PlanId, Result as GraphResult,
    RowClasses, SplitKey, Support, WeightId, WeightRef, WeightSource, Windows,
};

use crate::device::{DResult, Gpu, SharedAllocs};
use crate::refusal::op_refusal;
use crate::replay::Replayer;
pub(crate) use crate::scratch::{HalfInput, Q8Input, Scratch};
use crate::timing::{ns_of, NodeTimer};

/// KV element types the kernels read and write.
pub const CUDA_KV_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0];

/// Host-written buffers up to this size keep a host copy for the bound checks.
const MIRROR_MAX: usize = 4 << 20;

/// The kernels' weight-type code (kernels/common.cuh `MF_*`).
pub(crate) fn type_code(ty: GgmlType) -> Option<i32> {
    Some(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q8_0 => 2,
        GgmlType::Q4_0 => 3,
        GgmlType::Q4_1 => 4,
        GgmlType::Q5_0 => 5,
        GgmlType::Q4K => 6,
        GgmlType::Q6K => 7,
        _ => return None,
    })
}

/// Why a weight matrix of `ty` with rows of `ne0` cannot run here (None: it can).
pub(crate) fn matrix_refusal(ty: GgmlType, ne0: usize) -> Option<String> {
    if type_code(ty).is_none() {
        return Some(format!(
            "{ty} weights: the CUDA kernels read F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K"
        ));
    }
    if ty.row_bytes(ne0 as u64).is_none() {
        return Some(format!(
            "{ty} rows of {ne0} elements are not whole {}-element blocks",
            ty.block_size()
        ));
    }
    None
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Matrix {
    pub ty: GgmlType,
    pub ne0: usize,
    pub ne1: usize,
    pub ptr: u64,
    pub row_bytes: usize,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Resident {
    Matrix(Matrix),
    Vector { ptr: u64, len: usize },
}

/// Device buffers handed out under graph ids, reused at their exact length, never freed
/// while the backend lives.
#[derive(Default)]
pub(crate) struct Pool {
    pub bufs: Vec<(u64, usize)>,
    pub live: Vec<bool>,
    pub free: HashMap<usize, Vec<u32>>,
}

pub struct CudaBackend {
    id: BackendId,
    name: String,
    pub(crate) gpu: Gpu,
    pub(crate) pool: Pool,
    pub(crate) weights: Vec<Option<Resident>>,
    /// The device memory behind `weights`, shared with this backend's siblings (declared
    /// after `gpu`, whose drop synchronises the stream before the last owner frees it).
    weight_mem: Arc<SharedAllocs>,
    /// Bytes of the weights this backend uploaded (0 for a sibling: they are its origin's).
    weights_bytes: usize,
    /// A sibling ([`Memory::sibling`]): its weights are another backend's, so
    /// `prepare_weights` uploads nothing and checks what it is handed is among them.
    shared: bool,
    /// Host copies of small host-written buffers (inputs), for the bound checks.
    pub(crate) mirror: HashMap<u32, Vec<u8>>,
    /// Nodes executed (tests check the device path ran).
    executed: u64,
    /// `MINFER_CUDA_PROFILE=1`: each node synchronised and timed, per op and row class
    /// (printed at drop). Serialises the stream: for finding where time goes, not for speed.
    profile: Option<Profile>,
    pub(crate) scratch: HashMap<Scratch, (u64, usize)>,
    /// The activations the int8 scratch holds now (reused by the next matmul over them).
    pub(crate) q8_input: Option<Q8Input>,
    /// Quantized weights through int8 dot products (off: `MINFER_CUDA_MATMUL=f32`).
    pub(crate) mmvq: bool,
    /// Tensor-core int8 matmuls for many tokens (crates/cuda/src/mmq.rs).
    pub(crate) mmq: crate::mmq::MmqChoice,
    /// Most generation rows of a matmul on the multi-row vector kernels (`MINFER_CUDA_MVN`).
    pub(crate) mvn_max: usize,
    /// Fewest generation rows of a matmul on the tensor-core generation kernels
    /// (`MINFER_CUDA_MVT`; 0: off).
    pub(crate) mvt_from: usize,
    /// Output rows from which they take 32-row blocks (`MINFER_CUDA_MVT_TALL`; 0: never).
    pub(crate) mvt_tall: usize,
    /// Fewest generation rows of a matmul on the staged tensor-core generation kernels
    /// (`MINFER_CUDA_MVS`; 0: off), their rows a block (`MINFER_CUDA_MVS_ROWS`) and the warps
    /// of a 32-row block (`MINFER_CUDA_MVS_WARPS`).
    pub(crate) mvs: (usize, crate::settings::MvsRows, crate::settings::MvsWarps),
    /// One block per (head, query) instead of split-K chunks (`MINFER_CUDA_ATTN=single`).
    pub(crate) attn_single: bool,
    /// Most queries per block of the warp-tiled attention (kernels/attnw.cu; f16 KV, head
    /// dim 64 or 128, at most 8 query heads per KV head): 0 turns it off for the split-K
    /// kernels (`MINFER_CUDA_ATTN=split`); `MINFER_CUDA_ATTN=w1|w2` caps it (the bits do
    /// not depend on it).
    pub(crate) attn_warp_qt: usize,
    /// Query heads of a KV group per block of the one-query warp-tiled kernels and of the
    /// grouped split-K one: 8 (the whole group), 4 or 2 (`MINFER_CUDA_ATTN_HEADS`; the bits
    /// do not depend on it).
    pub(crate) attn_heads: usize,
    /// The warp-tiled attention's K rows staged in shared memory (`_s` kernels).
    pub(crate) attn_stage: bool,
    /// The decode Q/K/V, RoPE and KV stores in one launch where the walk and the cache
    /// allow (`mf_qkv1r_*`; off: `MINFER_CUDA_QKV_ROPE=0`).
    pub(crate) qkv_rope: bool,
    /// Session 29's q8_0-cache decode kernels (`MINFER_CUDA_Q8_DECODE=1`; settings.rs).
    pub(crate) q8_decode: bool,
    /// Where the one-token int8 kernels get their quantized x (`MINFER_CUDA_MV1_X`).
    pub(crate) mv1_x: crate::settings::Mv1X,
    /// Rows (a warp each) per block of the one-token int8 kernels: 8, or 4 with
    /// `MINFER_CUDA_MV1_WARPS=4` (an ablation switch; the bits do not depend on it).
    pub(crate) mv1_warps: usize,
    /// How the one-token int8 kernels' blocks cover their rows (`MINFER_CUDA_MV1_GRID`).
    pub(crate) mv1_grid: Mv1Grid,
    /// Whether Q4_K and Q6_K rows take the pipelined one-token walks (`MINFER_CUDA_MV1_PIPE`
    /// not 0, the type in `MINFER_CUDA_MV1_PIPE_TYPES`, and its wide walk not switched off by
    /// `MINFER_CUDA_MV1`).
    pub(crate) mv1_pipe: (bool, bool),
    /// Whole splits replayed as CUDA graphs (off: `MINFER_CUDA_GRAPHS=0`, or profiling).
    replayer: Option<Replayer>,
    /// The current forward's row classes (crates/cuda/src/prompt.rs).
    pub(crate) rows: RowClasses,
    /// The current forward's attention windows, typed ([`Executor::set_windows`]), until its
    /// synchronize; `None` for a backend driven node by node (its windows are read from the
    /// window input's host copy).
    pub(crate) windows: Option<Windows>,
    /// Prompt rows' kernels (`MINFER_CUDA_PROMPT`, `MINFER_CUDA_PROMPT_ATTN`).
    pub(crate) prompt: crate::prompt::PromptChoice,
    /// The weight the f16 weight scratch holds now, and the scratch's pointer.
    pub(crate) half_weight: Option<(u64, u64)>,
    /// Streamed blocks (crates/cuda/src/stream.rs): the weights this backend does not hold
    /// that the running split reads, copied into the stream arena, by weight index.
    pub(crate) streamed: HashMap<usize, Resident>,
    /// The split whose weights `streamed` holds, copied in ahead ([`Executor::prefetch_split`]).
    prefetched: Option<SplitKey>,
    /// The activations the f16 activation scratch holds now.
    pub(crate) half_input: Option<HalfInput>,
    /// Node outputs kept for a trace while armed ([`minfer_graph::Executor::capture`]): each
    /// read back right after its node ran, the split run eagerly (no graph replay) while
    /// armed.
    captures: CaptureLog,
    /// Event pairs around nodes, for the profile and an armed trace's node times.
    timer: NodeTimer,
}

/// The grid of the one-token int8 kernels, whose blocks walk their rows (kernels/int8.cuh).
/// A row's bits never depend on it (one warp computes each row alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mv1Grid {
    /// One resident wave of blocks (the default).
    Wave,
    /// A block per `mv1_warps` rows, each quantizing x again (`rows`: the older launch).
    Rows,
    /// At most this many blocks (a number: the gates walk many rows a warp with `1`).
    Blocks(u32),
}

impl CudaBackend {
    /// The backend on GPU 0, registered under `id` as `name`, with the knobs of `s`; prints
    /// the startup line.
    pub fn new(
        id: BackendId,
        name: impl Into<String>,
        s: &crate::CudaSettings,
    ) -> Result<Self, crate::CudaError> {
        let gpu = Gpu::with(s)?;
        let name = name.into();
        let (mmvq, mmq, prompt) = (s.mmvq, s.mmq, s.prompt);
        let (attn_single, attn_warp_qt) = s.attention;
        let (mv1_warps, mv1_grid, mvn_max) = (s.mv1_warps, s.mv1_grid, s.mvn_max);
        let profile = s.profile.then(Profile::default);
        let graphs = s.graphs && profile.is_none();
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        tracing::info!(
            "{name}: {} (compute {}), {:.1} GiB ({:.1} GiB free); kernels: matmul {}, \
             attention {}, {}, {} (NVRTC {}: {})",
            gpu.name,
            gpu.arch,
            gib(gpu.total_mem),
            gib(gpu.free_mem()),
            if mmvq {
                // The multi-row kernels take 2..=mvn_max rows before the tiles' threshold.
                let rows = if mvn_max >= 2 {
                    format!(
                        "multi-row vector kernels for 2-{mvn_max} rows (MINFER_CUDA_MVN), then "
                    )
                } else {
                    String::new()
                };
                let from = if s.mvs_from >= 2 {
                    crate::matvec::MVS_MAX_ROWS + 1
                } else if s.mvt_from >= 2 {
                    crate::matvec::MVT_MAX_ROWS + 1
                } else if mvn_max >= 2 {
                    mvn_max + 1
                } else {
                    0
                };
                let mut mvt = if s.mvs_from >= 2 {
                    format!(
                        "generation rows {}-{} on staged int8 mma (MINFER_CUDA_MVS), ",
                        s.mvs_from,
                        crate::matvec::MVS_MAX_ROWS
                    )
                } else {
                    String::new()
                };
                if s.mvt_from >= 2 {
                    mvt += &format!(
                        "generation rows {}-{} on int8 mma (MINFER_CUDA_MVT), ",
                        s.mvt_from,
                        crate::matvec::MVT_MAX_ROWS
                    );
                }
                format!(
                    "int8 dp4a over 8-bit activations, {mvt}{rows}{}",
                    mmq.describe(from)
                )
            } else {
                "f32".into()
            },
            if attn_single {
                "one block per query".to_string()
            } else if attn_warp_qt > 0 {
                format!(
                    "warp-tiled (f16 KV, head dim 64/128; up to {attn_warp_qt} queries and {} \
                     heads a block), else split-K",
                    s.attn_heads
                )
            } else {
                "split-K".to_string()
            },
            prompt.describe(),
            match (graphs, gpu.pdl) {
                (true, true) => "CUDA graph replay, programmatic dependent launch",
                (true, false) => "CUDA graph replay",
                (false, true) => "eager launches, programmatic dependent launch",
                (false, false) => "eager launches",
            },
            gpu.arch,
            if gpu.cached_modules == gpu.modules {
                format!("{} modules from the PTX cache", gpu.modules)
            } else {
                format!(
                    "{} of {} modules compiling in parallel while the weights upload",
                    gpu.modules - gpu.cached_modules,
                    gpu.modules
                )
            }
        );
        let weight_mem = Arc::new(SharedAllocs::new(&gpu));
        Ok(CudaBackend {
            id,
            name,
            gpu,
            pool: Pool::default(),
            weights: Vec::new(),
            weight_mem,
            weights_bytes: 0,
            shared: false,
            mirror: HashMap::new(),
            executed: 0,
            profile,
            scratch: HashMap::new(),
            q8_input: None,
            mmvq,
            mmq,
            mvn_max: s.mvn_max,
            mvt_from: s.mvt_from,
            mvt_tall: s.mvt_tall,
            mvs: (s.mvs_from, s.mvs_rows, s.mvs_warps),
            attn_single,
            attn_warp_qt,
            attn_heads: s.attn_heads,
            attn_stage: s.attn_stage,
            qkv_rope: s.qkv_rope,
            q8_decode: s.q8_decode,
            mv1_x: s.mv1_x,
            mv1_warps,
            mv1_grid,
            mv1_pipe: (
                s.mv1.pipe > 0 && s.mv1.pipe_types.0 && !s.mv1.narrow_q4k,
                s.mv1.pipe > 0 && s.mv1.pipe_types.1 && !s.mv1.narrow_q6k,
            ),
            replayer: graphs.then(Replayer::default),
            rows: RowClasses::default(),
            windows: None,
            prompt,
            half_weight: None,
            half_input: None,
            streamed: HashMap::new(),
            prefetched: None,
            captures: CaptureLog::default(),
            timer: NodeTimer::default(),
        })
    }

    /// Picks the attention kernels as `MINFER_CUDA_ATTN` does (`""` the default, `single`,
    /// `split`, `w1`, `w2`): the gates compare the choices on one backend.
    pub fn set_attention(&mut self, choice: &str) -> Result<(), crate::CudaError> {
        (self.attn_single, self.attn_warp_qt) = crate::settings::attention(choice)?;
        Ok(())
    }

    /// Query heads per block of the one-query warp-tiled attention and of the grouped
    /// split-K one: 8, 4 or 2 (as `MINFER_CUDA_ATTN_HEADS`; a gate compares them on one
    /// backend).
    pub fn set_attention_heads(&mut self, heads: usize) -> Result<(), crate::CudaError> {
        if ![2, 4, 8].contains(&heads) {
            return Err(crate::CudaError::from(format!(
                "{heads} query heads a block: want 8, 4 or 2"
            )));
        }
        self.attn_heads = heads;
        Ok(())
    }

    /// Whether session 29's q8_0-cache decode kernels run (as `MINFER_CUDA_Q8_DECODE`; the
    /// gates compare them with the kernels before on one backend).
    pub fn set_q8_decode(&mut self, on: bool) {
        self.q8_decode = on;
    }

    /// Whether the warp-tiled attention stages its K rows in shared memory (as
    /// `MINFER_CUDA_ATTN_STAGE`; a gate compares both on one backend).
    pub fn set_attention_stage(&mut self, staged: bool) {
        self.attn_stage = staged;
    }

    /// Waits for the kernel compile the backend started and loads every kernel (what the
    /// end of `prepare_weights` does): the compile's report the first time, None after; a
    /// module that failed is the error naming its file and NVRTC's log.
    pub fn kernels_ready(&self) -> Result<Option<crate::compile::CompileReport>, crate::CudaError> {
        Ok(self.gpu.kernels()?)
    }

    /// Nodes executed since the backend was made.
    pub fn nodes_executed(&self) -> u64 {
        self.executed
    }

    /// Bytes the pool holds (live and free buffers).
    pub fn pool_bytes(&self) -> usize {
        self.pool.bufs.iter().map(|b| b.1).sum()
    }

    /// A zeroed buffer that stays outside the pool's reuse (tests of the OOM path use it).
    pub fn raw_alloc(&mut self, bytes: usize) -> Result<u64, crate::CudaError> {
        Ok(self.gpu.alloc(bytes)?)
    }

    pub(crate) fn err(&self, problem: impl std::fmt::Display) -> GraphError {
        GraphError::Backend {
            backend: self.name.clone(),
            problem: problem.to_string(),
        }
    }

    /// The device pointer and length of a live buffer.
    pub(crate) fn buf(&self, id: BufId) -> DResult<(u64, usize)> {
        let i = id.0 as usize;
        if self.pool.live.get(i).copied() == Some(true) {
            Ok(self.pool.bufs[i])
        } else {
            Err(format!("buffer {} does not exist", id.0))
        }
    }

    /// A buffer's bytes as the host last wrote them, or read back from the device.
    pub(crate) fn host_view(&self, id: BufId, len: usize) -> DResult<Vec<u8>> {
        if let Some(m) = self.mirror.get(&id.0) {
            if m.len() >= len {
                return Ok(m[..len].to_vec());
            }
        }
        let (ptr, blen) = self.buf(id)?;
        if blen < len {
            return Err(format!("buffer {} holds {blen} bytes, {len} needed", id.0));
        }
        let mut out = vec![0u8; len];
        self.gpu.download(ptr, &mut out)?;
        Ok(out)
    }

    /// A resident weight, or one the running split streamed in.
    fn weight_at(&self, id: WeightId) -> Option<Resident> {
        let held = self.weights.get(id.index()).copied().flatten();
        held.or_else(|| self.streamed.get(&id.index()).copied())
    }

    pub(crate) fn vector(&self, w: &dyn WeightSource, id: WeightId, len: usize) -> DResult<u64> {
        match self.weight_at(id) {
            Some(Resident::Vector { ptr, len: l }) if l == len => Ok(ptr),
            Some(Resident::Vector { len: l, .. }) => Err(format!(
                "{} has {l} elements, the node needs {len}",
                w.name(id)
            )),
            _ => Err(format!("{} is not on the device as a vector", w.name(id))),
        }
    }

    pub(crate) fn matrix(&self, w: &dyn WeightSource, id: WeightId) -> DResult<Matrix> {
        match self.weight_at(id) {
            Some(Resident::Matrix(m)) => Ok(m),
            _ => Err(format!("{} is not on the device as a matrix", w.name(id))),
        }
    }
}

impl CudaBackend {
    /// A backend on this one's context that reads this one's uploaded weights and runs its
    /// kernels ([`Memory::sibling`]): its own stream, pool, scratch, replayed graphs and
    /// captures, the same knobs.
    fn make_sibling(&self) -> DResult<CudaBackend> {
        let gpu = self.gpu.sibling()?;
        tracing::info!(
            "{}: a sibling on the same context shares {:.1} MiB of weights and the kernels",
            self.name,
            self.weights_bytes as f64 / (1u64 << 20) as f64
        );
        Ok(CudaBackend {
            id: self.id,
            name: self.name.clone(),
            gpu,
            pool: Pool::default(),
            weights: self.weights.clone(),
            weight_mem: Arc::clone(&self.weight_mem),
            weights_bytes: 0,
            shared: true,
            mirror: HashMap::new(),
            executed: 0,
            profile: self.profile.as_ref().map(|_| Profile::default()),
            scratch: HashMap::new(),
            q8_input: None,
            mmvq: self.mmvq,
            mmq: self.mmq,
            mvn_max: self.mvn_max,
            mvt_from: self.mvt_from,
            mvt_tall: self.mvt_tall,
            mvs: self.mvs,
            attn_single: self.attn_single,
            attn_warp_qt: self.attn_warp_qt,
            attn_heads: self.attn_heads,
            attn_stage: self.attn_stage,
            qkv_rope: self.qkv_rope,
            q8_decode: self.q8_decode,
            mv1_x: self.mv1_x,
            mv1_warps: self.mv1_warps,
            mv1_grid: self.mv1_grid,
            mv1_pipe: self.mv1_pipe,
            replayer: self.replayer.as_ref().map(|_| Replayer::default()),
            rows: RowClasses::default(),
            windows: None,
            prompt: self.prompt,
            half_weight: None,
            half_input: None,
            streamed: HashMap::new(),
            prefetched: None,
            captures: CaptureLog::default(),
            timer: NodeTimer::default(),
        })
    }

    /// A sibling's `prepare_weights`: every weight of `ids` must be resident in the shared
    /// store as the model holds it (a vector of its length, a matrix of its type and shape);
    /// nothing is uploaded.
    fn check_shared(&self, weights: &dyn WeightSource, ids: &[WeightId]) -> GraphResult<()> {
        if !self.gpu.same_context(self.weight_mem.context()) {
            return Err(self.err("the shared weights are on another context"));
        }
        for &id in ids {
            let name = weights.name(id);
            let w = weights
                .weight(id)
                .ok_or_else(|| self.err(format!("weight {name} is not in the model")))?;
            let ok = match self.weights.get(id.index()).copied().flatten() {
                Some(Resident::Vector { len, .. }) => w.ne1 == 1 && len == w.ne0,
                Some(Resident::Matrix(m)) => m.ty == w.ty && m.ne0 == w.ne0 && m.ne1 == w.ne1,
                None => false,
            };
            if !ok {
                return Err(self.err(format!(
                    "weight {name} is not among the weights this sibling shares (nothing is \
                     uploaded a second time)"
                )));
            }
        }
        Ok(())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let mut v: Vec<_> = p.totals.iter().collect();
            v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            let all: f64 = v.iter().map(|x| x.1 .1).sum();
            tracing::info!(
                "{} profile (device time between events around each node; {:.3} ms in all):",
                self.name,
                all
            );
            for (k, (n, ms)) in v {
                tracing::info!(
                    "  {k:<24} {n:>8} nodes {ms:>10.3} ms {:>8.2} us/node",
                    ms * 1e3 / *n as f64
                );
            }
        }
    }
}

/// `MINFER_CUDA_PROFILE=1`: CUDA events around every node (launches stay asynchronous;
/// CUDA graphs are off), read at each synchronisation and summed per op and row class.
#[derive(Default)]
struct Profile {
    totals: HashMap<String, (u64, f64)>,
}

impl CudaBackend {
    /// `copy` on the stream, and under the profile timed by an event pair under `key`: the
    /// profile's table then says what the host's writes and reads (inputs, values crossing
    /// a block boundary, logits) and the streamed weights cost beside the nodes.
    pub(crate) fn timed_copy(
        &mut self,
        key: &str,
        copy: impl FnOnce(&Gpu) -> DResult<()>,
    ) -> DResult<()> {
        if self.profile.is_none() {
            return copy(&self.gpu);
        }
        let start = NodeTimer::event(&self.gpu)?;
        copy(&self.gpu)?;
        let end = NodeTimer::event(&self.gpu)?;
        self.timer.push(Some(key.to_string()), None, start, end);
        Ok(())
    }

    /// A captured node's output, read back now (the stream is in order, so the read sees the
    /// values as the node wrote them, before any later node reuses the buffer).
    fn capture_output(&mut self, node: &Node, out: BufId) -> DResult<()> {
        let (ptr, len) = self.buf(out)?;
        let bytes = (node.n_elems() * 4).min(len);
        let mut raw = vec![0u8; bytes];
        self.gpu.download(ptr, &mut raw)?;
        let values = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        self.captures.push(node.id, values);
        Ok(())
    }

    /// Reads the event pairs of the work just synchronised: the profile's totals, and an
    /// armed trace's node times (a pair that cannot be read is then an error, not a gap).
    fn collect_times(&mut self) -> DResult<()> {
        let mut first_err = None;
        for span in self.timer.take() {
            let ms = span.elapsed_ms();
            if let (Some(p), Some(k)) = (&mut self.profile, span.key) {
                let e = p.totals.entry(k).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += *ms.as_ref().unwrap_or(&0.0) as f64;
            }
            if let Some(id) = span.node {
                match ms {
                    Ok(ms) => self.captures.record_time(id, ns_of(ms)),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

pub(crate) fn theta_scale(freq_base: f32, head_dim: usize) -> f32 {
    freq_base.powf(-2.0 / head_dim as f32)
}

impl Identity for CudaBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl CudaBackend {
    /// Every weight of `ids` uploaded: vectors as f32, matrices as stored.
    fn upload_weights(&mut self, weights: &dyn WeightSource, ids: &[WeightId]) -> GraphResult<()> {
        self.weights = vec![None; weights.len()];
        self.weights_bytes = 0;
        // Owned apart from the `Gpu`, so a sibling keeps them alive (freed with the last).
        let mut mem = SharedAllocs::new(&self.gpu);
        let r = self.upload_into(&mut mem, weights, ids);
        self.weight_mem = Arc::new(mem);
        r
    }

    fn upload_into(
        &mut self,
        mem: &mut SharedAllocs,
        weights: &dyn WeightSource,
        ids: &[WeightId],
    ) -> GraphResult<()> {
        let mut alloc = |gpu: &Gpu, bytes: usize| -> DResult<u64> {
            let (ptr, bytes) = gpu.alloc_raw(bytes)?;
            mem.own(ptr, bytes);
            Ok(ptr)
        };
        for &id in ids {
            let name = weights.name(id).to_string();
            let w = weights
                .weight(id)
                .ok_or_else(|| self.err(format!("weight {name} is not in the model")))?;
            let r = if w.ne1 == 1 {
                let mut v = vec![0f32; w.ne0];
                quants::dequantize_row(w.ty, w.bytes, &mut v)
                    .map_err(|e| self.err(format!("weight {name}: {e}")))?;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let ptr = alloc(&self.gpu, bytes.len()).map_err(|e| self.err(e))?;
                self.gpu.upload(ptr, &bytes).map_err(|e| self.err(e))?;
                self.weights_bytes += bytes.len();
                Resident::Vector { ptr, len: w.ne0 }
            } else {
                if let Some(why) = matrix_refusal(w.ty, w.ne0) {
                    return Err(self.err(format!("weight {name}: {why}")));
                }
                let row_bytes = w.ty.row_bytes(w.ne0 as u64).unwrap_or(0) as usize;
                let ptr = alloc(&self.gpu, w.bytes.len()).map_err(|e| self.err(e))?;
                self.gpu.upload(ptr, w.bytes).map_err(|e| self.err(e))?;
                self.weights_bytes += w.bytes.len();
                Resident::Matrix(Matrix {
                    ty: w.ty,
                    ne0: w.ne0,
                    ne1: w.ne1,
                    ptr,
                    row_bytes,
                })
            };
            self.weights[id.index()] = Some(r);
        }
        Ok(())
    }
}

impl Memory for CudaBackend {
    fn can_hold(&self, w: &WeightRef) -> Support {
        if w.ne1 == 1 {
            return if w.ty.is_supported() {
                Ok(())
            } else {
                Err(format!("{} vectors cannot be converted to f32", w.ty).into())
            };
        }
        support(matrix_refusal(w.ty, w.ne0))
    }

    fn prepare_weights(&mut self, weights: &dyn WeightSource, ids: &[WeightId]) -> GraphResult<()> {
        if self.shared {
            return self.check_shared(weights, ids);
        }
        let started = std::time::Instant::now();
        let before = self.weights_bytes;
        self.upload_weights(weights, ids)?;
        self.presize_half(weights, ids).map_err(|e| self.err(e))?;
        // The copies are queued from pageable memory: the upload is over when the stream is.
        self.gpu.sync().map_err(|e| self.err(e))?;
        let upload = started.elapsed();
        tracing::info!(
            "{}: weights {:.1} MiB uploaded in {:.2} s",
            self.name,
            (self.weights_bytes - before) as f64 / (1u64 << 20) as f64,
            upload.as_secs_f64()
        );
        // The kernels compiled meanwhile (crate::compile): joined here (their line printed by
        // the join), so a compile failure fails the load.
        self.gpu.kernels().map_err(|e| self.err(e))?;
        Ok(())
    }

    fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    fn prepare_streamed(
        &mut self,
        weights: &dyn WeightSource,
        ids: &[WeightId],
    ) -> GraphResult<()> {
        self.presize_half(weights, ids).map_err(|e| self.err(e))?;
        self.lock_streamed(weights, ids).map_err(|e| self.err(e))
    }

    fn scratch_bytes(&self, weights: &dyn WeightSource, ids: &[WeightId], n_batch: usize) -> u64 {
        self.scratch_bound(weights, ids, n_batch)
    }

    fn sibling(&self) -> GraphResult<Box<dyn minfer_graph::Backend>> {
        self.make_sibling()
            .map(|b| Box::new(b) as Box<dyn minfer_graph::Backend>)
            .map_err(|e| self.err(e))
    }

    fn set_device_budget(&mut self, bytes: usize) {
        // Every allocation (weights, pool, scratch, cuBLASLt's workspace) goes through
        // `Gpu::alloc_raw`, which checks it against this before it is made.
        self.gpu.set_budget(Some(bytes));
    }

    fn free_memory(&self) -> std::result::Result<usize, minfer_graph::Refusal> {
        self.gpu
            .try_free_mem()
            .map_err(|e| minfer_graph::Refusal(e.to_string()))
    }

    fn alloc(&mut self, bytes: usize) -> GraphResult<BufId> {
        let bytes = bytes.max(4);
        if let Some(id) = self.pool.free.get_mut(&bytes).and_then(|v| v.pop()) {
            self.pool.live[id as usize] = true;
            self.mirror.remove(&id);
            let (ptr, len) = self.pool.bufs[id as usize];
            // Stream-ordered: after any queued work that used it.
            self.gpu.memset0(ptr, len).map_err(|e| self.err(e))?;
            return Ok(BufId(id));
        }
        let ptr = self.gpu.alloc(bytes).map_err(|e| self.err(e))?;
        self.pool.bufs.push((ptr, bytes));
        self.pool.live.push(true);
        Ok(BufId((self.pool.bufs.len() - 1) as u32))
    }

    fn free(&mut self, buf: BufId) {
        let i = buf.0 as usize;
        if self.pool.live.get(i).copied() == Some(true) {
            self.pool.live[i] = false;
            self.mirror.remove(&buf.0);
            let len = self.pool.bufs[i].1;
            self.pool.free.entry(len).or_default().push(buf.0);
        }
    }

    fn write(&mut self, buf: BufId, offset: usize, data: &[u8]) -> GraphResult<()> {
        let (ptr, len) = self.buf(buf).map_err(|e| self.err(e))?;
        if offset + data.len() > len {
            return Err(self.err(format!(
                "write of {} bytes at {offset} into buffer {} of {len}",
                data.len(),
                buf.0
            )));
        }
        self.written(buf);
        if offset == 0 && data.len() <= MIRROR_MAX {
            self.mirror.insert(buf.0, data.to_vec());
        } else {
            self.mirror.remove(&buf.0);
        }
        // Large writes (a block boundary's rows under layer offload) go through the
        // page-locked staging, queued without waiting for the device.
        self.timed_copy("copy host->device", |g| {
            g.upload_pinned(ptr + offset as u64, data)
        })
        .map_err(|e| self.err(e))
    }

    fn read(&mut self, buf: BufId, offset: usize, out: &mut [u8]) -> GraphResult<()> {
        let (ptr, len) = self.buf(buf).map_err(|e| self.err(e))?;
        if offset + out.len() > len {
            return Err(self.err(format!(
                "read of {} bytes at {offset} from buffer {} of {len}",
                out.len(),
                buf.0
            )));
        }
        self.timed_copy("copy device->host", |g| {
            g.download(ptr + offset as u64, out)
        })
        .map_err(|e| self.err(e))
    }
}

impl Capabilities for CudaBackend {
    fn batch_invariant(&self) -> bool {
        // One matmul kernel for every row count, each row's arithmetic independent of the
        // others; attention per (head, query).
        true
    }

    fn check_kv_type(&self, ty: GgmlType) -> Support {
        if CUDA_KV_TYPES.contains(&ty) {
            Ok(())
        } else {
            Err(format!("{} reads f32, f16 and q8_0 KV caches", self.name).into())
        }
    }

    fn supports_op(&self, op: &Op, _dtype: DType, weights: &dyn WeightSource) -> Support {
        support(op_refusal(op, weights))
    }

    fn can_stream(&self, w: &WeightRef<'_>) -> Support {
        if w.ne1 == 1 {
            // Copied in as f32, as `prepare_weights` holds a vector.
            return self.can_hold(w);
        }
        // A streamed block's rows are prompt rows: its matrices go to the prompt GEMM,
        // which reads a copy of the stored bytes (the int8 and f32 kernels read in place).
        let m = Self::streamed_matrix(w).map_err(minfer_graph::Refusal)?;
        match self.prompt_gemm(&m) {
            Some(_) => Ok(()),
            None => Err(format!(
                "{}'s prompt rows multiply a {} matrix of {} x {} on the int8 or f32 kernels, which read it in place",
                self.name, w.ty, w.ne1, w.ne0
            )
            .into()),
        }
    }

    fn supports_fused(&self, op: FusedOp) -> Support {
        match op {
            FusedOp::SwiGLU => Ok(()),
            // Only on the int8 path, where it is the unfused chain bit for bit.
            FusedOp::FfnGateUp
            | FusedOp::QkvRopeStore
            | FusedOp::InputNorm
            | FusedOp::MatMulAdd
                if self.mmvq =>
            {
                Ok(())
            }
            FusedOp::FfnGateUp
            | FusedOp::QkvRopeStore
            | FusedOp::InputNorm
            | FusedOp::MatMulAdd => Err(
                "the decode fusions run on the int8 path (MINFER_CUDA_MATMUL=f32 is off it)".into(),
            ),
            FusedOp::QkvNormRopeStore => Err("the per-head Q/K norm is not fused on CUDA".into()),
        }
    }
}

impl Executor for CudaBackend {
    fn set_row_classes(&mut self, rows: &RowClasses) {
        self.rows.clone_from(rows);
    }

    fn set_windows(&mut self, windows: &Windows) {
        self.windows = Some(windows.clone());
    }

    fn execute_node(&mut self, node: &Node, args: &ExecArgs) -> GraphResult<()> {
        if let Some(o) = args.out {
            self.mirror.remove(&o.0);
            self.written(o);
        }
        if let Some(kv) = args.kv {
            self.mirror.remove(&kv.k.0);
            self.mirror.remove(&kv.v.0);
        }
        self.executed += 1;
        // Off (no profile, no trace armed) this is the only cost: no event is made.
        let traced = self.captures.armed();
        let start = (traced || self.profile.is_some()).then(|| NodeTimer::event(&self.gpu));
        let issued = self.gpu.issued();
        let r = self.encode(node, args);
        let r = match start {
            Some(s) => r.and_then(|_| {
                let (s, e) = (s?, NodeTimer::event(&self.gpu)?);
                let key = self.profile.is_some().then(|| {
                    let rows = if node.shape[1] == 1 { "1 row" } else { "rows" };
                    format!("{} {rows}", node.op.name())
                });
                // A trace times the nodes that put work on the stream (a fused node's
                // launches are its own); one that launched nothing has no time.
                let id = (traced && self.gpu.issued() != issued).then_some(node.id);
                self.timer.push(key, id, s, e);
                Ok(())
            }),
            None => r,
        };
        let r = match (r, args.out) {
            (Ok(()), Some(out))
                if self.captures.armed() && minfer_graph::capture::captured(node) =>
            {
                self.capture_output(node, out)
            }
            (r, _) => r,
        };
        r.map_err(|e| GraphError::Exec {
            node: node.name.clone(),
            problem: format!("{} ({}): {e}", self.name, node.op.name()),
        })
    }

    fn capture(&mut self, on: bool) -> GraphResult<()> {
        self.captures.arm(on);
        Ok(())
    }

    fn take_captures(&mut self) -> GraphResult<Vec<(NodeId, Vec<f32>)>> {
        Ok(self.captures.take())
    }

    fn take_node_times(&mut self) -> Vec<(NodeId, u64)> {
        // Pairs still unread belong to a forward that never synchronised.
        self.timer.forget_nodes();
        self.captures.take_times()
    }

    fn node_time_source(&self) -> Option<&'static str> {
        Some(crate::timing::MEASURES)
    }

    fn execute_split(
        &mut self,
        key: SplitKey,
        nodes: &[&Node],
        args: &[ExecArgs],
    ) -> GraphResult<()> {
        // The quantized-input caches never span splits: another backend may have written
        // the buffer in between.
        self.q8_input = None;
        self.half_input = None;
        self.half_weight = None;
        if self.prefetched.take() != Some(key) {
            self.stream_split_weights(nodes, args)
                .map_err(|e| self.err(e))?;
        }
        // While a trace is armed every node's output is read back as it runs, which would
        // make a recorded split eager anyway: run it eagerly from the start. A split of no
        // plan has no identity to replay under.
        // A sequence's cell operations are one-off edits: nothing to replay.
        if self.replayer.is_none()
            || self.captures.armed()
            || key.plan == SplitKey::UNPLANNED.plan
            || nodes.iter().any(|n| n.op.is_cell_op())
        {
            for (node, a) in nodes.iter().zip(args) {
                self.execute_node(node, a)?;
            }
            return Ok(());
        }
        self.gpu.begin_record();
        for (node, a) in nodes.iter().zip(args) {
            if let Err(e) = self.execute_node(node, a) {
                let _ = self.gpu.end_record();
                return Err(e);
            }
        }
        self.q8_input = None;
        self.half_input = None;
        self.half_weight = None;
        let (launches, whole) = self.gpu.end_record();
        let r = if whole {
            let gpu = &self.gpu;
            self.replayer
                .as_mut()
                .expect("checked above")
                .run(gpu, key, launches)
        } else {
            // A read or upload came between the nodes: the rest runs eagerly.
            self.gpu.issue_all(&launches)
        };
        r.map_err(|e| self.err(e))
    }

    fn prefetch_split(
        &mut self,
        key: SplitKey,
        nodes: &[&Node],
        args: &[ExecArgs],
    ) -> GraphResult<()> {
        // The copies queue behind the reads of the split before (the stream is in order):
        // they run while the other backend computes.
        self.prefetched = None;
        self.stream_split_weights(nodes, args)
            .map_err(|e| self.err(e))?;
        self.prefetched = Some(key);
        Ok(())
    }

    fn forget_plan(&mut self, plan: PlanId) {
        if let Some(r) = &mut self.replayer {
            r.forget(plan);
        }
    }

    fn synchronize(&mut self) -> GraphResult<()> {
        // The forward is over: its windows describe no later node.
        self.windows = None;
        self.gpu.sync().map_err(|e| self.err(e))?;
        self.collect_times().map_err(|e| self.err(e))
    }
}

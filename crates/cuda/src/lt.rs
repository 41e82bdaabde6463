//! The prompt rows' vendor GEMM: cuBLASLt (loaded at run time like the driver), one algorithm
//! pinned per (output rows, input length, operand type) so that a row's bits never depend on
//! how many rows share the call (docs/PRECISION.md, "Row classes"; ADR 0011).
//!
//! `D[n × m] = Wᵀ-layout · X`: the weight matrix dequantized to f16 (or bf16) row-major
//! `[n rows × k]` is cuBLAS's column-major `k × n` operand transposed, the activations
//! row-major `[m × k]` its column-major `k × m`, and the f32 output column-major `n × m` is
//! the graph's row-major `[m × n]`. The algorithm is the heuristic's first for a reference
//! `m` ([`REF_M`]) with split-K and every reduction scheme excluded, its split count then
//! forced to 1, and the same algorithm runs every `m`: one tile order over k per output.
//!
//! `MINFER_CUDA_GEMM_PIN=0` (a gate's control only) asks the heuristic anew for every `m`,
//! split-K allowed: rows then change bits with the row count.

use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::sys as lt;

use crate::device::DResult;

/// The row count the heuristic picks the pinned algorithm for (a typical prompt chunk).
pub(crate) const REF_M: u64 = 512;

/// Workspace given to cuBLASLt (the unpinned control's split-K needs one).
pub(crate) const WORKSPACE: usize = 32 << 20;

/// The operands' element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    F16,
    Bf16,
}

impl GemmType {
    fn data_type(self) -> lt::cudaDataType {
        match self {
            GemmType::F16 => lt::cudaDataType::CUDA_R_16F,
            GemmType::Bf16 => lt::cudaDataType::CUDA_R_16BF,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            GemmType::F16 => "f16",
            GemmType::Bf16 => "bf16",
        }
    }
}

/// One GEMM as recorded: the plan, the operands' device pointers and the row count.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmCall {
    pub plan: usize,
    /// `n × k` weights (row-major, `ty`).
    pub w: u64,
    /// `m × k` activations (row-major, `ty`).
    pub x: u64,
    /// `m × n` f32 output (row-major).
    pub y: u64,
    pub m: u64,
}

struct Plan {
    n: u64,
    k: u64,
    ty: GemmType,
    desc: lt::cublasLtMatmulDesc_t,
    /// The pinned algorithm (None: the unpinned control asks per call).
    algo: Option<lt::cublasLtMatmulAlgo_t>,
}

/// A cuBLASLt handle and the plans made on it.
pub(crate) struct Lt {
    handle: lt::cublasLtHandle_t,
    plans: Vec<Plan>,
    workspace: u64,
    pin: bool,
    /// The row count the pinned algorithm is chosen for (`MINFER_CUDA_GEMM_REF_M`).
    ref_m: u64,
    /// Workspace the pinned algorithm may use (`MINFER_CUDA_GEMM_WS=1`: [`WORKSPACE`]).
    pinned_ws: u64,
}

fn ok(what: &str, s: lt::cublasStatus_t) -> DResult<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("cuBLASLt {what}: {s:?}"))
    }
}

/// Sets one attribute of a descriptor from a plain value.
unsafe fn desc_attr<T>(
    d: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> DResult<()> {
    ok(
        "matmul descriptor attribute",
        lt::cublasLtMatmulDescSetAttribute(d, a, v as *const T as *const c_void, size_of::<T>()),
    )
}

/// A column-major layout of `rows × cols` with leading dimension `rows`.
struct Layout(lt::cublasLtMatrixLayout_t);

impl Layout {
    fn new(ty: lt::cudaDataType, rows: u64, cols: u64) -> DResult<Layout> {
        let mut l = std::ptr::null_mut();
        // SAFETY: an out-pointer to a handle the call fills.
        ok("matrix layout", unsafe {
            lt::cublasLtMatrixLayoutCreate(&mut l, ty, rows, cols, rows as i64)
        })?;
        Ok(Layout(l))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once.
        unsafe {
            lt::cublasLtMatrixLayoutDestroy(self.0);
        }
    }
}

impl Lt {
    /// A handle (the library loaded now: a missing libcublasLt is an error naming it) over
    /// `workspace`, a device allocation of [`WORKSPACE`] bytes.
    pub(crate) fn new(workspace: u64, g: crate::settings::GemmPin) -> DResult<Lt> {
        // SAFETY: only tries to open the library.
        if !unsafe { lt::is_culib_present() } {
            return Err(
                "cuBLASLt (libcublasLt) is not on this machine; MINFER_CUDA_PROMPT=mmq runs \
                 prompt rows on the int8 kernels without it"
                    .into(),
            );
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: an out-pointer to a handle the call fills.
        ok("create", unsafe { lt::cublasLtCreate(&mut handle) })?;
        Ok(Lt {
            handle,
            plans: Vec::new(),
            workspace,
            pin: g.pin,
            ref_m: g.ref_m,
            pinned_ws: if g.workspace { WORKSPACE as u64 } else { 0 },
        })
    }

    /// The plan of `n` outputs over rows of `k` in `ty` (made once, then reused).
    pub fn plan(&mut self, n: u64, k: u64, ty: GemmType) -> DResult<usize> {
        if let Some(i) = self
            .plans
            .iter()
            .position(|p| p.n == n && p.k == k && p.ty == ty)
        {
            return Ok(i);
        }
        let mut desc = std::ptr::null_mut();
        // SAFETY: out-pointer; plain enum values.
        ok("matmul descriptor", unsafe {
            lt::cublasLtMatmulDescCreate(
                &mut desc,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType::CUDA_R_32F,
            )
        })?;
        // cublasOperation_t: CUBLAS_OP_T is 1.
        unsafe {
            desc_attr(
                desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &1i32,
            )?
        };
        let mut plan = Plan {
            n,
            k,
            ty,
            desc,
            algo: None,
        };
        if self.pin {
            plan.algo = Some(self.heuristic(&plan, self.ref_m, false)?);
        }
        self.plans.push(plan);
        Ok(self.plans.len() - 1)
    }

    /// The heuristic's first algorithm for `m` rows; without `split`, only algorithms that
    /// reduce over k inside one tile (split-K and every reduction scheme excluded, the split
    /// count forced to 1).
    fn heuristic(&self, p: &Plan, m: u64, split: bool) -> DResult<lt::cublasLtMatmulAlgo_t> {
        let (a, b, d) = (
            Layout::new(p.ty.data_type(), p.k, p.n)?,
            Layout::new(p.ty.data_type(), p.k, m)?,
            Layout::new(lt::cudaDataType::CUDA_R_32F, p.n, m)?,
        );
        let mut pref = std::ptr::null_mut();
        // SAFETY: out-pointer; the attribute values are plain integers of the sizes the
        // library documents (u64 workspace bytes, u32 reduction mask).
        unsafe {
            ok("preference", lt::cublasLtMatmulPreferenceCreate(&mut pref))?;
            let ws: u64 = if split {
                WORKSPACE as u64
            } else {
                self.pinned_ws
            };
            let r = ok(
                "preference attribute",
                lt::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const u64 as *const c_void,
                    8,
                ),
            )
            .and_then(|_| {
                if split {
                    return Ok(());
                }
                let mask: u32 = lt::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
                ok(
                    "preference attribute",
                    lt::cublasLtMatmulPreferenceSetAttribute(
                        pref,
                        lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                        &mask as *const u32 as *const c_void,
                        4,
                    ),
                )
            });
            if let Err(e) = r {
                lt::cublasLtMatmulPreferenceDestroy(pref);
                return Err(e);
            }
            let mut res: [lt::cublasLtMatmulHeuristicResult_t; 8] = std::mem::zeroed();
            let mut count = 0i32;
            let s = lt::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                p.desc,
                a.0,
                b.0,
                d.0,
                d.0,
                pref,
                8,
                res.as_mut_ptr(),
                &mut count,
            );
            lt::cublasLtMatmulPreferenceDestroy(pref);
            ok("heuristic", s)?;
            let found = res[..count.max(0) as usize]
                .iter()
                .find(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                .ok_or_else(|| {
                    format!(
                        "cuBLASLt has no {} algorithm for {} x {} outputs over rows of {}{}",
                        p.ty.name(),
                        m,
                        p.n,
                        p.k,
                        if split { "" } else { " without split-K" }
                    )
                })?;
            let mut algo = found.algo;
            if !split {
                let one: u32 = 1;
                ok(
                    "algorithm split count",
                    lt::cublasLtMatmulAlgoConfigSetAttribute(
                        &mut algo,
                        lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                        &one as *const u32 as *const c_void,
                        4,
                    ),
                )?;
                let none: u32 = 0;
                ok(
                    "algorithm reduction scheme",
                    lt::cublasLtMatmulAlgoConfigSetAttribute(
                        &mut algo,
                        lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                        &none as *const u32 as *const c_void,
                        4,
                    ),
                )?;
            }
            Ok(algo)
        }
    }

    /// The pinned algorithm's identity for messages: (algo id, tile id, stages id).
    pub fn describe(&self, plan: usize) -> String {
        let Some(algo) = self.plans.get(plan).and_then(|p| p.algo) else {
            return "unpinned (heuristic per call)".into();
        };
        let get = |a: lt::cublasLtMatmulAlgoConfigAttributes_t| -> u32 {
            let mut v: u32 = 0;
            let mut written = 0usize;
            // SAFETY: reads one u32 attribute of a valid algorithm into `v`.
            unsafe {
                lt::cublasLtMatmulAlgoConfigGetAttribute(
                    &algo,
                    a,
                    &mut v as *mut u32 as *mut c_void,
                    4,
                    &mut written,
                );
            }
            v
        };
        use lt::cublasLtMatmulAlgoConfigAttributes_t as A;
        format!(
            "algo {} tile {} stages {} split {}",
            get(A::CUBLASLT_ALGO_CONFIG_ID),
            get(A::CUBLASLT_ALGO_CONFIG_TILE_ID),
            get(A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            get(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM)
        )
    }

    /// Issues `c` on `stream` (or into the stream's capture).
    pub fn issue(&self, c: &GemmCall, stream: lt::cudaStream_t) -> DResult<()> {
        let p = self
            .plans
            .get(c.plan)
            .ok_or_else(|| format!("no GEMM plan {}", c.plan))?;
        let algo = match p.algo {
            Some(a) => a,
            None => self.heuristic(p, c.m, true)?,
        };
        let (a, b, d) = (
            Layout::new(p.ty.data_type(), p.k, p.n)?,
            Layout::new(p.ty.data_type(), p.k, c.m)?,
            Layout::new(lt::cudaDataType::CUDA_R_32F, p.n, c.m)?,
        );
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the pointers are device allocations of at least the sizes the layouts
        // describe (checked by the caller), the workspace is WORKSPACE bytes.
        ok("matmul", unsafe {
            lt::cublasLtMatmul(
                self.handle,
                p.desc,
                &alpha as *const f32 as *const c_void,
                c.w as *const c_void,
                a.0,
                c.x as *const c_void,
                b.0,
                &beta as *const f32 as *const c_void,
                c.y as *const c_void,
                d.0,
                c.y as *mut c_void,
                d.0,
                &algo,
                self.workspace as *mut c_void,
                WORKSPACE,
                stream,
            )
        })
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: each descriptor and the handle were created here and are destroyed once.
        unsafe {
            for p in &self.plans {
                lt::cublasLtMatmulDescDestroy(p.desc);
            }
            lt::cublasLtDestroy(self.handle);
        }
    }
}

// SAFETY: the handle and descriptors are used only through `&self`/`&mut self` of the one
// backend that owns them (which is `Send`, never shared), as cuBLASLt allows for a handle
// used from one thread at a time.
unsafe impl Send for Lt {}

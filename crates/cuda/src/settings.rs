//! Every `MINFER_CUDA_*` knob (docs/SETTINGS.md), read once into [`CudaSettings`], which the
//! engine's settings hold and hand to [`crate::CudaBackend::new`] by value: the device, the
//! kernels and cuBLASLt take their part from it, none reads the environment. A value a knob
//! does not name is refused by name ([`Refused`]) with the words it always had.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use minfer_graph::Refused;

use crate::backend::Mv1Grid;
use crate::lt::GemmType;
use crate::mmq::{MmqChoice, MmqTile, DEFAULT_MIN_TOKENS};
use crate::prompt::PromptChoice;

/// Generation rows of one matmul on the multi-row vector kernels by default
/// (`MINFER_CUDA_MVN`): up to one pass of 8 (kernels/mmvq.cu `mf_mmvqn*`).
pub(crate) const DEFAULT_MVN_MAX: usize = 8;
/// Generation rows from which a matmul runs on the tensor-core generation kernels
/// (`mf_mmvt*`, `MINFER_CUDA_MVT`).
pub(crate) const DEFAULT_MVT_FROM: usize = 9;
/// Output rows from which a matmul's generation rows take the 32-row tensor-core blocks
/// (`mf_mmvt*_m2`, `MINFER_CUDA_MVT_TALL`): never by default. Measured on the H100 (7B,
/// from 8,192 rows): S_TG 930 / 1,251 at N = 16 / 32 against 1,007 / 1,524 with 16-row
/// blocks only (the halved activation traffic does not pay for 128 registers a thread).
pub(crate) const DEFAULT_MVT_TALL: usize = 0;
/// Generation rows from which a matmul runs on the staged tensor-core generation kernels
/// (`mf_mmvs*`, `MINFER_CUDA_MVS`; 0: off). Measured on the H100 (7B, S_TG, session 19 calls
/// 1-3, the kernels with 8-token tiles and up to 6 stages): 4 / 8 / 16 / 32 / 64 rows 577 /
/// 1,154 / 1,758 / 2,561 / 2,747 t/s against 528 / 638 / 953 / 1,352 / 1,623 with them off;
/// but 2 rows 256 against 367 on the multi-row vector kernels (not understood: the staged
/// kernel of 2 rows is the one of 4, and neither graphs nor PDL change it), so they start at 4.
pub(crate) const DEFAULT_MVS_FROM: usize = 4;

/// Weight rows a block of the staged tensor-core generation kernels takes
/// (`MINFER_CUDA_MVS_ROWS`). The bits never depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MvsRows {
    /// 64 where the grid still has a block for every multiprocessor and the type's two
    /// stages fit, else 32.
    Auto,
    /// 32 (the default: measured ahead of 64 on the 7B, S_TG 1,835 against 1,705 at N = 32,
    /// session 18 call 5) or 64 (64 falls back to 32 for a type whose stages do not fit).
    Fixed(usize),
}

/// Warps of a 32-row block of the staged tensor-core generation kernels
/// (`MINFER_CUDA_MVS_WARPS`): 8 (each two m16 tiles: a weight fragment's decode and each
/// activation fragment spread over more rows) or 16 (each one tile: twice the warps for a
/// matrix of few rows, whose grid leaves multiprocessors a single block). The bits never depend
/// on it. Measured on the H100 (7B, S_TG, session 19 call 3, two rounds): 8 warps everywhere
/// (the default) 1,154 / 1,758 / 2,561 / 2,747 t/s at N = 8 / 16 / 32 / 64, 16 warps on the
/// matrices of few rows (`auto`) 1,133 / 1,702 / 2,299 / 2,443, 16 everywhere 1,052 / 1,534 /
/// 1,917 / 2,040 (one round): the second tile's shared fragment loads are worth more than
/// the warps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MvsWarps {
    /// 16 where the 32-row grid has fewer than two blocks a multiprocessor, else 8.
    Auto,
    Eight,
    Sixteen,
}

/// Where the one-token int8 kernels get their quantized x (`MINFER_CUDA_MV1_X`; kernels/int8.cuh
/// `MF_MV1_X`): quantized once before the kernel and read from global memory, or by every
/// block into its shared memory. The bits never depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mv1X {
    /// Global from rows of [`MV1_GLOBAL_FROM`] values, shared below (the default).
    Auto,
    Shared,
    Global,
}

/// Row length from which `Mv1X::Auto` quantizes x once before the kernel. Measured on the
/// H100 (docs/PERFORMANCE.md, session 16): every row global took the 7B's tg128 from 251 to
/// 271 t/s but the 0.5B's from 910 to 810 (its rows of 896 pay a launch for a prologue that
/// cost less); the 7B's gain is its 18,944-value down projection's per-block prologue.
pub(crate) const MV1_GLOBAL_FROM: usize = 8192;

impl Mv1X {
    pub(crate) fn global(self, ne0: usize) -> bool {
        match self {
            Mv1X::Auto => ne0 >= MV1_GLOBAL_FROM,
            Mv1X::Shared => false,
            Mv1X::Global => true,
        }
    }
}

/// Query heads per block of the one-query warp-tiled attention by default
/// (`MINFER_CUDA_ATTN_HEADS`): two, so a KV group of 7 runs as 4 blocks. Measured on the H100
/// (session 16, 7B tg128): 2 heads 304.8 t/s, 4 heads 296.9, the whole group (8) 271.4.
pub(crate) const DEFAULT_ATTN_HEADS: usize = 2;

/// Programmatic dependent launch (`MINFER_CUDA_PDL`; sm_90 on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pdl {
    /// The next kernel may start once this one's main loop is done (the default).
    Late,
    /// At this one's entry.
    Early,
    /// Plain launches (`0`).
    Off,
}

/// The one-token walks' ablation switches, compiled into the program as defines
/// (kernels/int8.cuh; the bits never depend on them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mv1Walk {
    /// Q4_K rows on the narrow (4-byte-load) walk (`MINFER_CUDA_MV1=narrow|narrow-q4k`).
    pub narrow_q4k: bool,
    /// Q6_K rows on the narrow (2-byte-load) walk (`MINFER_CUDA_MV1=narrow|narrow-q6k`).
    pub narrow_q6k: bool,
    /// Row loops unrolled by 4 instead of 2 (`MINFER_CUDA_MV1_UNROLL=4`).
    pub unroll4: bool,
    /// L2 prefetches: 0 none, 1 each block's first rows, 2 also each next row
    /// (`MINFER_CUDA_MV1_PREFETCH`).
    pub prefetch: u8,
    /// Chunks of weight loads a warp of the pipelined walks keeps in flight, 1 to 4; 0: Q4_K
    /// and Q6_K rows on the plain walks too (`MINFER_CUDA_MV1_PIPE`, kernels/walk.cuh
    /// `MF_MV1_PIPE`).
    pub pipe: u8,
    /// Which types take the pipelined walks: Q4_K, Q6_K (`MINFER_CUDA_MV1_PIPE_TYPES`:
    /// `q4k,q6k`, the default, `q4k` or `q6k`).
    pub pipe_types: (bool, bool),
    /// Stages of the pipelined Q/K/V kernels and of the one-token kernels that quantize x
    /// per block (rows of a few chunks), 1 to 4; 0: as `pipe` (`MINFER_CUDA_MV1_PIPE_SHORT`).
    pub pipe_short: u8,
    /// Rows ahead of the one walked that the pipelined walks ask L2 for, 0 to 4
    /// (`MINFER_CUDA_MV1_PIPE_AHEAD`, walk.cuh `MF_MV1_PIPE_AHEAD`; 0: none).
    pub pipe_ahead: u8,
    /// Blocks of 256 threads a multiprocessor the pipelined Q6_K kernels are compiled to fit,
    /// 1 to 4; 0: no bound (`MINFER_CUDA_MV1_P6_BLOCKS`, walk.cuh `MF_MV1_P6_BLOCKS`).
    pub p6_blocks: u8,
}

/// The pipelined walks' stages unless `MINFER_CUDA_MV1_PIPE` says otherwise (walk.cuh's
/// `MF_MV1_PIPE` default).
pub(crate) const DEFAULT_MV1_PIPE: u8 = 1;

impl Mv1Walk {
    /// The defines the program is compiled with.
    pub(crate) fn defines(&self) -> String {
        let mut d = String::new();
        if self.narrow_q4k {
            d.push_str("#define MF_MV1_NARROW_Q4K 1\n");
        }
        if self.narrow_q6k {
            d.push_str("#define MF_MV1_NARROW_Q6K 1\n");
        }
        if self.unroll4 {
            d.push_str("#define MF_MV1_UNROLL 4\n");
        }
        if self.prefetch > 0 {
            d.push_str(&format!("#define MF_MV1_PREFETCH {}\n", self.prefetch));
        }
        if self.pipe > 0 && self.pipe != DEFAULT_MV1_PIPE {
            d.push_str(&format!("#define MF_MV1_PIPE {}\n", self.pipe));
        }
        if self.pipe > 0 && self.pipe_short > 0 {
            d.push_str(&format!("#define MF_MV1_PIPE_SHORT {}\n", self.pipe_short));
        }
        if self.pipe > 0 && self.pipe_ahead > 0 {
            d.push_str(&format!("#define MF_MV1_PIPE_AHEAD {}\n", self.pipe_ahead));
        }
        if self.p6_blocks > 0 {
            d.push_str(&format!("#define MF_MV1_P6_BLOCKS {}\n", self.p6_blocks));
        }
        d
    }
}

/// cuBLASLt's pinning of prompt-row GEMM algorithms (crate::lt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmPin {
    /// One algorithm pinned per shape (off: `MINFER_CUDA_GEMM_PIN=0`, the heuristic per row
    /// count).
    pub pin: bool,
    /// The row count the pinned algorithm is chosen at (`MINFER_CUDA_GEMM_REF_M`).
    pub ref_m: u64,
    /// The pinned algorithms may use the workspace (`MINFER_CUDA_GEMM_WS=1`).
    pub workspace: bool,
}

/// The CUDA backend's settings, one field per `MINFER_CUDA_*` knob.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaSettings {
    /// Where compiled PTX is cached (`MINFER_CUDA_CACHE`, else `$HOME/.cache/minfer/cuda`;
    /// None: no cache).
    pub(crate) cache_dir: Option<PathBuf>,
    /// Kernel sources compiled instead of the built-in ones (`MINFER_CUDA_KERNEL_DIR`).
    pub(crate) kernel_dir: Option<PathBuf>,
    /// How long a synchronisation waits before it reports a hung device
    /// (`MINFER_CUDA_SYNC_TIMEOUT_S`, default 120 s).
    pub(crate) sync_timeout: Duration,
    /// CUDA graph replay (off: `MINFER_CUDA_GRAPHS=0`).
    pub(crate) graphs: bool,
    pub(crate) pdl: Pdl,
    /// Every node synchronised and timed (`MINFER_CUDA_PROFILE=1`).
    pub(crate) profile: bool,
    /// Quantized weights through the int8 kernels (off: `MINFER_CUDA_MATMUL=f32`).
    pub(crate) mmvq: bool,
    /// Rows (a warp each) per one-token int8 block: 8, or 4 (`MINFER_CUDA_MV1_WARPS=4`).
    pub(crate) mv1_warps: usize,
    pub(crate) mv1_grid: Mv1Grid,
    pub(crate) mv1: Mv1Walk,
    /// Where the one-token kernels' quantized x comes from (`MINFER_CUDA_MV1_X`).
    pub(crate) mv1_x: Mv1X,
    /// Generation-row attention (`MINFER_CUDA_ATTN`): one block per query, and the
    /// warp-tiled kernels' most queries a block.
    pub(crate) attention: (bool, usize),
    /// Query heads per block of the one-query warp-tiled attention (`MINFER_CUDA_ATTN_HEADS`:
    /// 8, 4 or 2; default [`DEFAULT_ATTN_HEADS`]).
    pub(crate) attn_heads: usize,
    /// The warp-tiled attention with its K rows staged in shared memory by cp.async
    /// (`MINFER_CUDA_ATTN_STAGE`: `1` the default, measured 7B tg128 @ d4096 +7 % on the H100
    /// (docs/PERFORMANCE.md, session 24); `0` the direct loads; the same bits either way).
    pub(crate) attn_stage: bool,
    /// The decode Q/K/V with RoPE and the KV stores in one launch where it can
    /// (`MINFER_CUDA_QKV_ROPE`: `1` default, `0` the two launches; the same bits either way).
    pub(crate) qkv_rope: bool,
    /// Session 29's decode kernels for a q8_0 cache (`MINFER_CUDA_Q8_DECODE=1`): the RoPE
    /// store a warp per 32-value block, and the grouped split-K attention's KV group shared
    /// out over blocks of `attn_heads`; `0`, the default until a device has run their gates
    /// (the fused-against-unfused and attention gates), keeps the kernels before them. The
    /// same bits either way by construction.
    pub(crate) q8_decode: bool,
    pub(crate) mmq: MmqChoice,
    /// Most generation rows of one matmul the multi-row vector kernels take
    /// (`MINFER_CUDA_MVN`, 0 ..= 16; 0: off, the dp4a / `mma` kernels as before): a warp per
    /// output row reading its weights once for up to 8 rows (more in passes of 8). The bits
    /// never depend on it.
    pub(crate) mvn_max: usize,
    /// Generation rows of one matmul from which the tensor-core generation kernels
    /// (`mf_mmvt*`: 16 weight rows x 8 to 64 tokens a block, a warp per residue of the
    /// canonical order) take them, before the multi-row vector kernels and the `mma` prefill
    /// tiles (`MINFER_CUDA_MVT`, 2 ..= 4096; 0: off). The bits never depend on it.
    pub(crate) mvt_from: usize,
    /// Output rows from which those kernels take 32 weight rows a block instead of 16 (each
    /// activation fragment then feeds two row tiles; `MINFER_CUDA_MVT_TALL`, 0: never).
    pub(crate) mvt_tall: usize,
    /// Generation rows of one matmul from which the staged tensor-core generation kernels
    /// (`mf_mmvs*`: 32 or 64 weight rows x 8 to 32 tokens a block, weights and activations
    /// through shared memory by cp.async, a warp per residue of the canonical order) take
    /// them, up to 64, before every other generation kernel (`MINFER_CUDA_MVS`, 1 ..= 64;
    /// 0: off; 1 takes single rows off the one-token kernels too). The bits never depend on it.
    pub(crate) mvs_from: usize,
    /// Their rows a block (`MINFER_CUDA_MVS_ROWS`: 32, 64 or auto).
    pub(crate) mvs_rows: MvsRows,
    /// Warps of their 32-row blocks (`MINFER_CUDA_MVS_WARPS`: 8, 16 or auto).
    pub(crate) mvs_warps: MvsWarps,
    pub(crate) prompt: PromptChoice,
    pub(crate) gemm: GemmPin,
    /// What the device loads of each module (`MINFER_CUDA_IMAGE`: `ptx`, the default, which
    /// the driver compiles again at load into its own cache, or `cubin`, NVRTC's own machine
    /// code, nothing left to compile at load; the kernels are the same).
    pub(crate) image: crate::compile::ImageKind,
}

impl CudaSettings {
    /// The knobs as this process's environment sets them.
    pub fn from_env() -> Result<CudaSettings, Refused> {
        CudaSettings::from_lookup(|k| std::env::var_os(k))
    }

    /// The knobs as `var` gives them (the environment, or a test's table).
    pub fn from_lookup(var: impl Fn(&str) -> Option<OsString>) -> Result<CudaSettings, Refused> {
        let text = |k: &str| {
            var(k)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let cache_dir = var("MINFER_CUDA_CACHE").map(PathBuf::from).or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/cuda"))
        });
        // Not refused: a value that is no number keeps the default (as it always has).
        let sync_s = text("MINFER_CUDA_SYNC_TIMEOUT_S").parse().unwrap_or(120u64);
        let pdl = match text("MINFER_CUDA_PDL").as_str() {
            "" | "late" => Pdl::Late,
            "early" => Pdl::Early,
            "0" => Pdl::Off,
            other => {
                return Err(Refused::new(
                    "MINFER_CUDA_PDL",
                    other,
                    "want 0, early or late",
                ))
            }
        };
        let mv1_grid = match text("MINFER_CUDA_MV1_GRID").as_str() {
            "" | "wave" => Mv1Grid::Wave,
            "rows" => Mv1Grid::Rows,
            n => match n.parse::<u32>() {
                Ok(b) if b > 0 => Mv1Grid::Blocks(b),
                _ => {
                    return Err(Refused::new(
                        "MINFER_CUDA_MV1_GRID",
                        n,
                        "want wave, rows or a block count",
                    ))
                }
            },
        };
        let profile = text("MINFER_CUDA_PROFILE") == "1";
        Ok(CudaSettings {
            cache_dir,
            kernel_dir: var("MINFER_CUDA_KERNEL_DIR").map(PathBuf::from),
            sync_timeout: Duration::from_secs(sync_s),
            graphs: text("MINFER_CUDA_GRAPHS") != "0",
            pdl,
            profile,
            mmvq: text("MINFER_CUDA_MATMUL") != "f32",
            mv1_warps: if text("MINFER_CUDA_MV1_WARPS") == "4" {
                4
            } else {
                8
            },
            mv1_grid,
            mv1: mv1_walk(&text)?,
            mv1_x: match text("MINFER_CUDA_MV1_X").as_str() {
                "" | "auto" => Mv1X::Auto,
                "shared" => Mv1X::Shared,
                "global" => Mv1X::Global,
                v => {
                    return Err(Refused::new(
                        "MINFER_CUDA_MV1_X",
                        v,
                        "want auto, shared or global",
                    ))
                }
            },
            attention: attention(&text("MINFER_CUDA_ATTN"))?,
            attn_heads: match text("MINFER_CUDA_ATTN_HEADS").as_str() {
                "" => DEFAULT_ATTN_HEADS,
                "8" => 8,
                "4" => 4,
                "2" => 2,
                v => return Err(Refused::new("MINFER_CUDA_ATTN_HEADS", v, "want 8, 4 or 2")),
            },
            attn_stage: match text("MINFER_CUDA_ATTN_STAGE").as_str() {
                "0" => false,
                "" | "1" => true,
                v => return Err(Refused::new("MINFER_CUDA_ATTN_STAGE", v, "want 0 or 1")),
            },
            qkv_rope: match text("MINFER_CUDA_QKV_ROPE").as_str() {
                "" | "1" => true,
                "0" => false,
                v => return Err(Refused::new("MINFER_CUDA_QKV_ROPE", v, "want 0 or 1")),
            },
            q8_decode: match text("MINFER_CUDA_Q8_DECODE").as_str() {
                "" | "0" => false,
                "1" => true,
                v => return Err(Refused::new("MINFER_CUDA_Q8_DECODE", v, "want 0 or 1")),
            },
            mmq: mmq(&text)?,
            mvn_max: match text("MINFER_CUDA_MVN").as_str() {
                "" => DEFAULT_MVN_MAX,
                v => v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n <= 16)
                    .ok_or_else(|| {
                        Refused::new("MINFER_CUDA_MVN", v, "want a row count from 0 to 16")
                    })?,
            },
            mvt_from: match text("MINFER_CUDA_MVT").as_str() {
                "" => DEFAULT_MVT_FROM,
                v => v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n == 0 || (2..=4096).contains(&n))
                    .ok_or_else(|| {
                        Refused::new("MINFER_CUDA_MVT", v, "want 0 (off) or a row count from 2")
                    })?,
            },
            mvt_tall: match text("MINFER_CUDA_MVT_TALL").as_str() {
                "" => DEFAULT_MVT_TALL,
                v => v.parse::<usize>().map_err(|_| {
                    Refused::new("MINFER_CUDA_MVT_TALL", v, "want a row count (0: never)")
                })?,
            },
            mvs_from: match text("MINFER_CUDA_MVS").as_str() {
                "" => DEFAULT_MVS_FROM,
                v => v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n <= 64)
                    .ok_or_else(|| {
                        Refused::new(
                            "MINFER_CUDA_MVS",
                            v,
                            "want 0 (off) or a row count from 1 to 64",
                        )
                    })?,
            },
            mvs_rows: match text("MINFER_CUDA_MVS_ROWS").as_str() {
                "auto" => MvsRows::Auto,
                "" => MvsRows::Fixed(32),
                "32" => MvsRows::Fixed(32),
                "64" => MvsRows::Fixed(64),
                v => {
                    return Err(Refused::new(
                        "MINFER_CUDA_MVS_ROWS",
                        v,
                        "want 32, 64 or auto",
                    ))
                }
            },
            mvs_warps: match text("MINFER_CUDA_MVS_WARPS").as_str() {
                "auto" => MvsWarps::Auto,
                "" | "8" => MvsWarps::Eight,
                "16" => MvsWarps::Sixteen,
                v => {
                    return Err(Refused::new(
                        "MINFER_CUDA_MVS_WARPS",
                        v,
                        "want 8, 16 or auto",
                    ))
                }
            },
            prompt: prompt(&text)?,
            gemm: gemm(&text)?,
            image: match text("MINFER_CUDA_IMAGE").as_str() {
                "" | "ptx" => crate::compile::ImageKind::Ptx,
                "cubin" => crate::compile::ImageKind::Cubin,
                v => return Err(Refused::new("MINFER_CUDA_IMAGE", v, "want ptx or cubin")),
            },
        })
    }
}

/// `MINFER_CUDA_ATTN`: (one block per query, the warp-tiled kernels' most queries a block).
pub(crate) fn attention(v: &str) -> Result<(bool, usize), Refused> {
    Ok(match v {
        "" | "w2" => (false, 2),
        "single" => (true, 0),
        "split" => (false, 0),
        "w1" => (false, 1),
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_ATTN",
                other,
                "want single, split, w1 or w2",
            ))
        }
    })
}

fn mv1_walk(var: &impl Fn(&str) -> String) -> Result<Mv1Walk, Refused> {
    let (narrow_q4k, narrow_q6k) = match var("MINFER_CUDA_MV1").as_str() {
        "" | "wide" => (false, false),
        "narrow" => (true, true),
        "narrow-q4k" => (true, false),
        "narrow-q6k" => (false, true),
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_MV1",
                other,
                "want wide, narrow, narrow-q4k or narrow-q6k",
            ))
        }
    };
    let unroll4 = match var("MINFER_CUDA_MV1_UNROLL").as_str() {
        "" | "2" => false,
        "4" => true,
        other => return Err(Refused::new("MINFER_CUDA_MV1_UNROLL", other, "want 2 or 4")),
    };
    let prefetch = match var("MINFER_CUDA_MV1_PREFETCH").as_str() {
        "" | "0" => 0,
        "1" => 1,
        "2" => 2,
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_MV1_PREFETCH",
                other,
                "want 0, 1 or 2",
            ))
        }
    };
    let pipe = count(
        var,
        "MINFER_CUDA_MV1_PIPE",
        DEFAULT_MV1_PIPE,
        0..=4,
        "want 0 (off) or 1 to 4 stages",
    )?;
    let pipe_types = match var("MINFER_CUDA_MV1_PIPE_TYPES").as_str() {
        "" | "q4k,q6k" | "q6k,q4k" => (true, true),
        "q4k" => (true, false),
        "q6k" => (false, true),
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_MV1_PIPE_TYPES",
                other,
                "want q4k,q6k, q4k or q6k",
            ))
        }
    };
    let pipe_short = count(
        var,
        "MINFER_CUDA_MV1_PIPE_SHORT",
        0,
        1..=4,
        "want 1 to 4 stages",
    )?;
    let pipe_ahead = count(
        var,
        "MINFER_CUDA_MV1_PIPE_AHEAD",
        0,
        0..=4,
        "want 0 (none) or 1 to 4 rows",
    )?;
    let p6_blocks = count(
        var,
        "MINFER_CUDA_MV1_P6_BLOCKS",
        0,
        0..=4,
        "want 0 (no bound) or 1 to 4 blocks",
    )?;
    Ok(Mv1Walk {
        narrow_q4k,
        narrow_q6k,
        unroll4,
        prefetch,
        pipe,
        pipe_types,
        pipe_short,
        pipe_ahead,
        p6_blocks,
    })
}

/// A small count knob: `unset` when empty, else a number in `range`, anything else refused
/// with `want`.
fn count(
    var: &impl Fn(&str) -> String,
    name: &'static str,
    unset: u8,
    range: std::ops::RangeInclusive<u8>,
    want: &str,
) -> Result<u8, Refused> {
    match var(name).as_str() {
        "" => Ok(unset),
        v => v
            .parse::<u8>()
            .ok()
            .filter(|n| range.contains(n))
            .ok_or_else(|| Refused::new(name, v, want)),
    }
}

fn mmq(var: &impl Fn(&str) -> String) -> Result<MmqChoice, Refused> {
    let on = match var("MINFER_CUDA_MMQ").as_str() {
        "" | "1" => true,
        "0" => false,
        other => return Err(Refused::new("MINFER_CUDA_MMQ", other, "want 0 or 1")),
    };
    let min_tokens = match var("MINFER_CUDA_MMQ_MIN").as_str() {
        "" => DEFAULT_MIN_TOKENS,
        v => v
            .parse::<usize>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| Refused::new("MINFER_CUDA_MMQ_MIN", v, "want a token count >= 1"))?,
    };
    let tile = match var("MINFER_CUDA_MMQ_TILE").as_str() {
        "" | "64x64" => MmqTile::R64T64,
        "128x64" => MmqTile::R128T64,
        "64x32" => MmqTile::R64T32,
        "64x64k8" => MmqTile::R64T64K8,
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_MMQ_TILE",
                other,
                "want 64x64, 128x64, 64x32 or 64x64k8",
            ))
        }
    };
    let split = match var("MINFER_CUDA_MMQ_SPLIT").as_str() {
        "" => None,
        "1" => Some(1),
        "2" => Some(2),
        "4" => Some(4),
        "8" => Some(8),
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_MMQ_SPLIT",
                other,
                "want 1, 2, 4 or 8",
            ))
        }
    };
    Ok(MmqChoice {
        on,
        min_tokens,
        tile,
        split,
    })
}

fn prompt(var: &impl Fn(&str) -> String) -> Result<PromptChoice, Refused> {
    let gemm = match var("MINFER_CUDA_PROMPT").as_str() {
        "" | "gemm" => Some(GemmType::F16),
        "gemm-bf16" => Some(GemmType::Bf16),
        "mmq" => None,
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_PROMPT",
                other,
                "want gemm, gemm-bf16 or mmq",
            ))
        }
    };
    // The q8_0 flash kernels have not run on a GPU yet (issue 26): opt-in until their H200
    // gate passes, so a q8_0 cache's prompt rows stay on the gated generation kernels.
    let (fa, fa_q8) = match var("MINFER_CUDA_PROMPT_ATTN").as_str() {
        "" | "fa" | "fa-q8" => (true, true),
        "fa-f16" => (true, false),
        "rows" => (false, false),
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_PROMPT_ATTN",
                other,
                "want fa, fa-q8, fa-f16 or rows",
            ))
        }
    };
    let control_by_rows = match var("MINFER_CUDA_PROMPT_CONTROL").as_str() {
        "" => false,
        "type-by-rows" => true,
        other => {
            return Err(Refused::new(
                "MINFER_CUDA_PROMPT_CONTROL",
                other,
                "want type-by-rows (a gate's control)",
            ))
        }
    };
    Ok(PromptChoice {
        gemm,
        fa,
        fa_q8,
        control_by_rows,
    })
}

fn gemm(var: &impl Fn(&str) -> String) -> Result<GemmPin, Refused> {
    let pin = match var("MINFER_CUDA_GEMM_PIN").as_str() {
        "" | "1" => true,
        "0" => false,
        other => return Err(Refused::new("MINFER_CUDA_GEMM_PIN", other, "want 0 or 1")),
    };
    let ref_m =
        match var("MINFER_CUDA_GEMM_REF_M").as_str() {
            "" => crate::lt::REF_M,
            v => v.parse::<u64>().ok().filter(|&m| m >= 1).ok_or_else(|| {
                Refused::new("MINFER_CUDA_GEMM_REF_M", v, "want a row count >= 1")
            })?,
        };
    let workspace = match var("MINFER_CUDA_GEMM_WS").as_str() {
        "" | "0" => false,
        "1" => true,
        other => return Err(Refused::new("MINFER_CUDA_GEMM_WS", other, "want 0 or 1")),
    };
    Ok(GemmPin {
        pin,
        ref_m,
        workspace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<CudaSettings, Refused> {
        CudaSettings::from_lookup(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        })
    }

    /// Unset knobs are the documented defaults; each named value is taken.
    #[test]
    fn defaults_and_named_values() {
        let d = with(&[]).unwrap();
        assert!(d.graphs && d.mmvq && !d.profile && d.mmq.on && d.gemm.pin);
        assert_eq!(
            (d.pdl, d.mv1_warps, d.mv1_grid),
            (Pdl::Late, 8, Mv1Grid::Wave)
        );
        assert_eq!(d.attention, (false, 2));
        assert_eq!(d.mvn_max, DEFAULT_MVN_MAX);
        assert_eq!(
            (d.mvt_from, d.mvt_tall),
            (DEFAULT_MVT_FROM, DEFAULT_MVT_TALL)
        );
        assert_eq!(
            (d.mvs_from, d.mvs_rows, d.mvs_warps),
            (DEFAULT_MVS_FROM, MvsRows::Fixed(32), MvsWarps::Eight)
        );
        assert_eq!(d.image, crate::compile::ImageKind::Ptx);
        assert_eq!(d.attn_heads, DEFAULT_ATTN_HEADS);
        assert!(d.attn_stage);
        assert!(d.qkv_rope);
        assert_eq!(d.mv1_x, Mv1X::Auto);
        assert!(!d.mv1_x.global(MV1_GLOBAL_FROM - 32) && d.mv1_x.global(MV1_GLOBAL_FROM));
        assert_eq!(d.sync_timeout, Duration::from_secs(120));
        assert_eq!(d.mv1.defines(), "");
        let s = with(&[
            ("MINFER_CUDA_GRAPHS", "0"),
            ("MINFER_CUDA_PDL", "early"),
            ("MINFER_CUDA_MV1_GRID", "1"),
            ("MINFER_CUDA_MV1", "narrow-q6k"),
            ("MINFER_CUDA_MV1_PREFETCH", "2"),
            ("MINFER_CUDA_MV1_PIPE", "3"),
            ("MINFER_CUDA_MV1_PIPE_TYPES", "q4k"),
            ("MINFER_CUDA_MV1_PIPE_SHORT", "4"),
            ("MINFER_CUDA_MV1_PIPE_AHEAD", "2"),
            ("MINFER_CUDA_MV1_P6_BLOCKS", "3"),
            ("MINFER_CUDA_ATTN", "split"),
            ("MINFER_CUDA_MMQ_TILE", "64x32"),
            ("MINFER_CUDA_PROMPT", "mmq"),
            ("MINFER_CUDA_MVN", "0"),
            ("MINFER_CUDA_MVT", "0"),
            ("MINFER_CUDA_MVS", "5"),
            ("MINFER_CUDA_MVS_ROWS", "auto"),
            ("MINFER_CUDA_MVS_WARPS", "16"),
            ("MINFER_CUDA_IMAGE", "cubin"),
            ("MINFER_CUDA_ATTN_STAGE", "0"),
            ("MINFER_CUDA_QKV_ROPE", "0"),
        ])
        .unwrap();
        assert!(!s.attn_stage);
        assert!(!s.qkv_rope);
        assert_eq!((s.mvn_max, s.mvt_from), (0, 0));
        assert_eq!(
            (s.mvs_from, s.mvs_rows, s.mvs_warps),
            (5, MvsRows::Auto, MvsWarps::Sixteen)
        );
        assert_eq!(s.image, crate::compile::ImageKind::Cubin);
        assert!(!s.graphs);
        assert_eq!((s.pdl, s.mv1_grid), (Pdl::Early, Mv1Grid::Blocks(1)));
        assert_eq!(
            s.mv1.defines(),
            "#define MF_MV1_NARROW_Q6K 1\n#define MF_MV1_PREFETCH 2\n#define MF_MV1_PIPE 3\n\
             #define MF_MV1_PIPE_SHORT 4\n#define MF_MV1_PIPE_AHEAD 2\n#define MF_MV1_P6_BLOCKS 3\n"
        );
        assert_eq!((s.mv1.pipe, s.mv1.pipe_types), (3, (true, false)));
        assert_eq!(d.mv1.pipe_types, (true, true));
        assert_eq!(d.mv1.pipe, DEFAULT_MV1_PIPE);
        assert_eq!(s.attention, (false, 0));
        assert_eq!(s.mmq.tile, MmqTile::R64T32);
        assert_eq!(s.prompt.gemm, None);
    }

    /// Control: a value a knob does not name is refused with its old text, never defaulted.
    #[test]
    fn bad_values_are_refused_by_name() {
        for (k, v, want) in [
            (
                "MINFER_CUDA_PDL",
                "x",
                "MINFER_CUDA_PDL=x: want 0, early or late",
            ),
            (
                "MINFER_CUDA_MV1_GRID",
                "0",
                "MINFER_CUDA_MV1_GRID=0: want wave, rows or a block count",
            ),
            (
                "MINFER_CUDA_MV1_UNROLL",
                "3",
                "MINFER_CUDA_MV1_UNROLL=3: want 2 or 4",
            ),
            (
                "MINFER_CUDA_MV1_PIPE",
                "5",
                "MINFER_CUDA_MV1_PIPE=5: want 0 (off) or 1 to 4 stages",
            ),
            (
                "MINFER_CUDA_MV1_P6_BLOCKS",
                "8",
                "MINFER_CUDA_MV1_P6_BLOCKS=8: want 0 (no bound) or 1 to 4 blocks",
            ),
            (
                "MINFER_CUDA_MV1_PIPE_SHORT",
                "0",
                "MINFER_CUDA_MV1_PIPE_SHORT=0: want 1 to 4 stages",
            ),
            (
                "MINFER_CUDA_MV1_PIPE_AHEAD",
                "5",
                "MINFER_CUDA_MV1_PIPE_AHEAD=5: want 0 (none) or 1 to 4 rows",
            ),
            (
                "MINFER_CUDA_MV1_PIPE_TYPES",
                "q5k",
                "MINFER_CUDA_MV1_PIPE_TYPES=q5k: want q4k,q6k, q4k or q6k",
            ),
            (
                "MINFER_CUDA_ATTN",
                "w3",
                "MINFER_CUDA_ATTN=w3: want single, split, w1 or w2",
            ),
            (
                "MINFER_CUDA_MMQ_MIN",
                "0",
                "MINFER_CUDA_MMQ_MIN=0: want a token count >= 1",
            ),
            (
                "MINFER_CUDA_MV1_X",
                "smem",
                "MINFER_CUDA_MV1_X=smem: want auto, shared or global",
            ),
            (
                "MINFER_CUDA_ATTN_HEADS",
                "3",
                "MINFER_CUDA_ATTN_HEADS=3: want 8, 4 or 2",
            ),
            (
                "MINFER_CUDA_ATTN_STAGE",
                "yes",
                "MINFER_CUDA_ATTN_STAGE=yes: want 0 or 1",
            ),
            (
                "MINFER_CUDA_MVN",
                "17",
                "MINFER_CUDA_MVN=17: want a row count from 0 to 16",
            ),
            (
                "MINFER_CUDA_MVS",
                "65",
                "MINFER_CUDA_MVS=65: want 0 (off) or a row count from 1 to 64",
            ),
            (
                "MINFER_CUDA_MVS_ROWS",
                "16",
                "MINFER_CUDA_MVS_ROWS=16: want 32, 64 or auto",
            ),
            (
                "MINFER_CUDA_MVS_WARPS",
                "4",
                "MINFER_CUDA_MVS_WARPS=4: want 8, 16 or auto",
            ),
            (
                "MINFER_CUDA_IMAGE",
                "sass",
                "MINFER_CUDA_IMAGE=sass: want ptx or cubin",
            ),
            (
                "MINFER_CUDA_MMQ_SPLIT",
                "3",
                "MINFER_CUDA_MMQ_SPLIT=3: want 1, 2, 4 or 8",
            ),
            (
                "MINFER_CUDA_PROMPT_ATTN",
                "x",
                "MINFER_CUDA_PROMPT_ATTN=x: want fa, fa-q8, fa-f16 or rows",
            ),
            (
                "MINFER_CUDA_GEMM_WS",
                "2",
                "MINFER_CUDA_GEMM_WS=2: want 0 or 1",
            ),
        ] {
            assert_eq!(with(&[(k, v)]).unwrap_err().to_string(), want);
        }
    }
}

//! The kernel program as NVRTC compiles it: several modules, one per `.cu` file (each after
//! the `.cuh` headers and the defines the settings ask for), compiled in parallel threads,
//! each cached on disk by the hash of its own source, architecture and options. A compile
//! may run while the weights upload ([`start`]); the device layer joins it when the first
//! kernel is needed ([`Pending::join`]).
//!
//! Each `.cu` file is self-contained after the headers (the self-test compiles them one by
//! one), and no header declares a device variable, so a module compiled alone holds the
//! same kernels as the whole program did.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use sha2::{Digest, Sha256};

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};

use crate::device::{drv, guarded, DResult};

/// The kernel sources in program order (headers first).
pub const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("dequant.cuh", include_str!("../kernels/dequant.cuh")),
    ("int8.cuh", include_str!("../kernels/int8.cuh")),
    ("walk.cuh", include_str!("../kernels/walk.cuh")),
    ("mvt.cuh", include_str!("../kernels/mvt.cuh")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("kv.cu", include_str!("../kernels/kv.cu")),
    ("attn.cu", include_str!("../kernels/attn.cu")),
    ("attnw.cu", include_str!("../kernels/attnw.cu")),
    ("mmvq.cu", include_str!("../kernels/mmvq.cu")),
    ("mmvt.cu", include_str!("../kernels/mmvt.cu")),
    ("mmvs.cu", include_str!("../kernels/mmvs.cu")),
    ("fused.cu", include_str!("../kernels/fused.cu")),
    ("mmq.cu", include_str!("../kernels/mmq.cu")),
    ("prompt.cu", include_str!("../kernels/prompt.cu")),
];

/// Every kernel the executor launches.
pub const KERNELS: &[&str] = &[
    "mf_add",
    "mf_mul",
    "mf_silu",
    "mf_swiglu",
    "mf_rms_norm",
    "mf_rope",
    "mf_matmul",
    "mf_get_rows",
    "mf_kv_store",
    "mf_kv_rope_shift",
    "mf_attn_window",
    "mf_attn_split",
    "mf_attn_combine",
    "mf_attn_w1_64",
    "mf_attn_w2_64",
    "mf_attn_w1_128",
    "mf_attn_w1_64_h2",
    "mf_attn_w1_64_h4",
    "mf_attn_w1_128_h2",
    "mf_attn_w1_128_h4",
    "mf_attn_w1_64_s",
    "mf_attn_w2_64_s",
    "mf_attn_w1_128_s",
    "mf_attn_w1_64_h2_s",
    "mf_attn_w1_64_h4_s",
    "mf_attn_w1_128_h2_s",
    "mf_attn_w1_128_h4_s",
    "mf_quantize_q8",
    "mf_quantize_q8_1",
    "mf_mmvq_q8_0",
    "mf_mmvq_q4_0",
    "mf_mmvq_q4_1",
    "mf_mmvq_q5_0",
    "mf_mmvq_q4_k",
    "mf_mmvq_q6_k",
    "mf_mmvq1",
    "mf_mmvq1_gx",
    "mf_mmvq1_p4",
    "mf_mmvq1_p4_gx",
    "mf_mmvq1_p6",
    "mf_mmvq1_p6_gx",
    "mf_mmvqn2",
    "mf_mmvqn4",
    "mf_mmvqn8",
    "mf_mmvs1_r1_q8_0",
    "mf_mmvs1_r1_q4_0",
    "mf_mmvs1_r1_q4_1",
    "mf_mmvs1_r1_q5_0",
    "mf_mmvs1_r1_q4_k",
    "mf_mmvs1_r1_q6_k",
    "mf_mmvs1_r2_q8_0",
    "mf_mmvs1_r2_q4_0",
    "mf_mmvs1_r2_q4_1",
    "mf_mmvs1_r2_q5_0",
    "mf_mmvs1_r2_q4_k",
    "mf_mmvs1_r2_q6_k",
    "mf_mmvs1_w16_q8_0",
    "mf_mmvs1_w16_q4_0",
    "mf_mmvs1_w16_q4_1",
    "mf_mmvs1_w16_q5_0",
    "mf_mmvs1_w16_q4_k",
    "mf_mmvs1_w16_q6_k",
    "mf_mmvs2_r1_q8_0",
    "mf_mmvs2_r1_q4_0",
    "mf_mmvs2_r1_q4_1",
    "mf_mmvs2_r1_q5_0",
    "mf_mmvs2_r1_q4_k",
    "mf_mmvs2_r1_q6_k",
    "mf_mmvs2_r2_q8_0",
    "mf_mmvs2_r2_q4_0",
    "mf_mmvs2_r2_q4_1",
    "mf_mmvs2_r2_q5_0",
    "mf_mmvs2_r2_q4_k",
    "mf_mmvs2_r2_q6_k",
    "mf_mmvs2_w16_q8_0",
    "mf_mmvs2_w16_q4_0",
    "mf_mmvs2_w16_q4_1",
    "mf_mmvs2_w16_q5_0",
    "mf_mmvs2_w16_q4_k",
    "mf_mmvs2_w16_q6_k",
    "mf_mmvs4_r1_q8_0",
    "mf_mmvs4_r1_q4_0",
    "mf_mmvs4_r1_q4_1",
    "mf_mmvs4_r1_q5_0",
    "mf_mmvs4_r1_q4_k",
    "mf_mmvs4_r1_q6_k",
    "mf_mmvs4_r2_q4_0",
    "mf_mmvs4_r2_q4_1",
    "mf_mmvs4_r2_q5_0",
    "mf_mmvs4_r2_q4_k",
    "mf_mmvs4_w16_q8_0",
    "mf_mmvs4_w16_q4_0",
    "mf_mmvs4_w16_q4_1",
    "mf_mmvs4_w16_q5_0",
    "mf_mmvs4_w16_q4_k",
    "mf_mmvs4_w16_q6_k",
    "mf_mmvt1",
    "mf_mmvt2",
    "mf_mmvt4",
    "mf_mmvt8",
    "mf_mmvt1_m2",
    "mf_mmvt2_m2",
    "mf_mmvt4_m2",
    "mf_gate_up1",
    "mf_gate_up1_gx",
    "mf_gate_up1_p4",
    "mf_gate_up1_p4_gx",
    "mf_gate_up1_p6",
    "mf_gate_up1_p6_gx",
    "mf_attn_gqa",
    "mf_qkv1",
    "mf_qkv1_gx",
    "mf_qkv1_p4",
    "mf_qkv1_p4_gx",
    "mf_qkv1_p6",
    "mf_qkv1_p6_gx",
    "mf_qkv1_p46",
    "mf_qkv1_p46_gx",
    "mf_rope_store",
    "mf_qkv1r",
    "mf_qkv1r_gx",
    "mf_qkv1r_p4",
    "mf_qkv1r_p4_gx",
    "mf_qkv1r_p6",
    "mf_qkv1r_p6_gx",
    "mf_qkv1r_p46",
    "mf_qkv1r_p46_gx",
    "mf_mmq_q8_0",
    "mf_mmq_q4_0",
    "mf_mmq_q4_1",
    "mf_mmq_q5_0",
    "mf_mmq_q4_k",
    "mf_mmq_q6_k",
    "mf_mmq_q8_0_r128",
    "mf_mmq_q4_0_r128",
    "mf_mmq_q4_1_r128",
    "mf_mmq_q5_0_r128",
    "mf_mmq_q4_k_r128",
    "mf_mmq_q6_k_r128",
    "mf_mmq_q8_0_t32",
    "mf_mmq_q4_0_t32",
    "mf_mmq_q4_1_t32",
    "mf_mmq_q5_0_t32",
    "mf_mmq_q4_k_t32",
    "mf_mmq_q6_k_t32",
    "mf_mmq_q8_0_k8",
    "mf_mmq_q4_0_k8",
    "mf_mmq_q4_1_k8",
    "mf_mmq_q5_0_k8",
    "mf_mmq_q4_k_k8",
    "mf_mmq_q6_k_k8",
    "mf_mmq_combine",
    "mf_deq_half",
    "mf_to_half",
    "mf_bias_rows",
    "mf_fa_64",
    "mf_fa_128",
    "mf_fa_q8_64",
    "mf_fa_q8_128",
];

/// NVRTC's options beside the architecture (part of every cache key).
const OPTIONS: &[&str] = &["-lineinfo"];

/// One module of the program: a `.cu` file after the defines and the headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleSource {
    /// The `.cu` file it is compiled for (error messages and the cache name it).
    pub file: String,
    pub src: String,
}

/// The defines prepended to every module (settings that choose kernel variants).
pub fn prelude(mv1_defines: &str, pdl_early: bool) -> String {
    let mut p = String::new();
    if pdl_early {
        p.push_str("#define MF_PDL_EARLY 1\n");
    }
    p.push_str(mv1_defines);
    p
}

/// The sources in program order: the built-in ones, or every file of [`SOURCES`] read from
/// `dir` (`MINFER_CUDA_KERNEL_DIR`; a missing file is an error naming it).
pub fn sources(dir: Option<&Path>) -> DResult<Vec<(String, String)>> {
    match dir {
        None => Ok(SOURCES
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect()),
        Some(dir) => SOURCES
            .iter()
            .map(|(name, _)| {
                let p = dir.join(name);
                std::fs::read_to_string(&p)
                    .map(|s| (name.to_string(), s))
                    .map_err(|e| format!("MINFER_CUDA_KERNEL_DIR: {}: {e}", p.display()))
            })
            .collect(),
    }
}

fn section(out: &mut String, name: &str, src: &str) {
    out.push_str(&format!("// ---- {name} ----\n"));
    out.push_str(src);
    out.push('\n');
}

/// The whole program as one text: `prelude`, then every source in order.
pub fn whole(prelude: &str, sources: &[(String, String)]) -> String {
    let mut s = prelude.to_string();
    for (name, src) in sources {
        section(&mut s, name, src);
    }
    s
}

/// One module per `.cu` file of `sources`: `prelude`, every header, then the file.
pub fn modules(prelude: &str, sources: &[(String, String)]) -> Vec<ModuleSource> {
    let mut headers = prelude.to_string();
    for (name, src) in sources.iter().filter(|(n, _)| n.ends_with(".cuh")) {
        section(&mut headers, name, src);
    }
    sources
        .iter()
        .filter(|(n, _)| n.ends_with(".cu"))
        .map(|(name, src)| {
            let mut s = headers.clone();
            section(&mut s, name, src);
            ModuleSource {
                file: name.clone(),
                src: s,
            }
        })
        .collect()
}

/// Compiles `src` for `arch` (the caller guards against a missing NVRTC library).
pub fn compile(src: &str, arch: &str) -> std::result::Result<Ptx, CompileError> {
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|o| o.to_string()));
    compile_ptx_with_opts(
        src,
        CompileOptions {
            options,
            ..Default::default()
        },
    )
}

/// NVRTC's log of a failed compile.
pub fn compile_log(e: &CompileError) -> String {
    match e {
        CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    }
}

/// What the device loads of a module: NVRTC's PTX (the driver compiles it again when it
/// loads it, into its own cache) or NVRTC's CUBIN for the device's architecture, which NVRTC
/// makes anyway for a real architecture and the driver loads as it is
/// (`MINFER_CUDA_IMAGE`). PTX stays the default until a device measures the cold start both
/// ways (`tests/modules.rs` prints them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImageKind {
    #[default]
    Ptx,
    Cubin,
}

/// A compiled module's image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    Ptx(String),
    Cubin(Vec<u8>),
}

impl Image {
    /// The PTX text (None for a CUBIN).
    pub fn ptx(&self) -> Option<&str> {
        match self {
            Image::Ptx(s) => Some(s),
            Image::Cubin(_) => None,
        }
    }
}

/// Where module `m`'s PTX for `arch` is cached under `dir`: the hash covers its source (the
/// defines included), the architecture and NVRTC's options, so a changed file, setting or
/// option never reads a stale module.
pub fn cache_path(dir: &Path, m: &ModuleSource, arch: &str) -> PathBuf {
    cache_path_of(dir, m, arch, ImageKind::Ptx)
}

/// Where module `m`'s image of `kind` for `arch` is cached under `dir` (a CUBIN's key also
/// covers the kind, and its file ends in `.cubin`).
pub fn cache_path_of(dir: &Path, m: &ModuleSource, arch: &str, kind: ImageKind) -> PathBuf {
    let mut h = Sha256::new();
    h.update(m.src.as_bytes());
    h.update([0]);
    h.update(arch.as_bytes());
    for o in OPTIONS {
        h.update([0]);
        h.update(o.as_bytes());
    }
    if kind == ImageKind::Cubin {
        h.update(b"\0cubin");
    }
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stem = m.file.trim_end_matches(".cu");
    let ext = match kind {
        ImageKind::Ptx => "ptx",
        ImageKind::Cubin => "cubin",
    };
    dir.join(format!("{hex}-{stem}-{arch}.{ext}"))
}

/// Compiles `src` for the real architecture `arch` (`sm_XY`) and returns NVRTC's CUBIN (the
/// caller guards against a missing NVRTC library); a failure names NVRTC's log.
pub fn compile_cubin(src: &str, arch: &str) -> DResult<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    if !arch.starts_with("sm_") {
        return Err(format!(
            "a CUBIN needs a real architecture (sm_XY), not {arch}"
        ));
    }
    let csrc = std::ffi::CString::new(src).map_err(|_| "a NUL byte in the kernel source")?;
    let prog =
        result::create_program(&csrc, None).map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|o| o.to_string()));
    // SAFETY: `prog` was just created and is destroyed once, below, on every path; `csrc`
    // outlives it; the out-pointers point at live values of the sizes NVRTC reports.
    let out = unsafe {
        let r = match result::compile_program(prog, &options) {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                Err(format!("{e:?}: {log}"))
            }
            Ok(()) => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))
                    .and_then(|()| {
                        let mut buf = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                            .result()
                            .map(|()| buf)
                            .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))
                    })
            }
        };
        let _ = result::destroy_program(prog);
        r
    };
    match out {
        Ok(b) if elf_whole(&b) => Ok(b),
        Ok(_) => Err("NVRTC's CUBIN is not a whole ELF image".into()),
        Err(e) => Err(e),
    }
}

/// Whether `b` is a whole 64-bit ELF image: the magic, and its section header table (which
/// comes last in NVIDIA's CUBINs) inside the bytes. A cached file cut short fails it.
pub fn elf_whole(b: &[u8]) -> bool {
    let le = |at: usize, n: usize| -> Option<u64> {
        let s = b.get(at..at + n)?;
        Some(s.iter().rev().fold(0u64, |v, &x| (v << 8) | x as u64))
    };
    let (Some(shoff), Some(shentsize), Some(shnum)) = (le(0x28, 8), le(0x3a, 2), le(0x3c, 2))
    else {
        return false;
    };
    b.starts_with(b"\x7fELF\x02")
        && shoff
            .checked_add(shentsize * shnum)
            .is_some_and(|end| end <= b.len() as u64)
}

/// One module's image and where it came from.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub file: String,
    pub image: Image,
    /// Read from the disk cache (not compiled).
    pub cached: bool,
    /// How long NVRTC took (zero for a cached module).
    pub compile: Duration,
    /// When NVRTC finished it (None for a cached module).
    pub ended: Option<Instant>,
}

/// What a finished compile did, for the startup report.
#[derive(Clone, Debug, Default)]
pub struct CompileReport {
    pub modules: usize,
    pub cached: usize,
    /// From the start of the compile to the last module's end (zero when all were cached).
    pub wall: Duration,
    /// The slowest module and its time.
    pub slowest: Option<(String, Duration)>,
    /// How long the caller waited at the join (the compile not yet done by then).
    pub waited: Duration,
}

impl CompileReport {
    /// `9 modules: 9 compiled in parallel in 12.3 s wall (slowest mmq.cu 12.1 s)`, or `9
    /// modules from the PTX cache`.
    pub fn describe(&self) -> String {
        let compiled = self.modules - self.cached;
        if compiled == 0 {
            return format!("{} modules from the PTX cache", self.modules);
        }
        let slow = self
            .slowest
            .as_ref()
            .map(|(f, d)| format!(" (slowest {f} {:.1} s)", d.as_secs_f64()))
            .unwrap_or_default();
        let cached = if self.cached > 0 {
            format!(", {} from the PTX cache", self.cached)
        } else {
            String::new()
        };
        format!(
            "{} modules: {compiled} compiled by NVRTC in parallel in {:.1} s wall{slow}{cached}",
            self.modules,
            self.wall.as_secs_f64()
        )
    }
}

/// A compile under way: the cached modules already read, the others compiling in their own
/// threads.
pub struct Pending {
    done: Vec<Compiled>,
    running: Vec<(String, JoinHandle<DResult<Compiled>>)>,
    started: Instant,
}

/// Reads what the cache holds and starts a thread per module it does not. The NVRTC library
/// is loaded here first (guarded: a missing library is an error, not a panic), so the
/// threads only call into a library already loaded. PTX images ([`start_images`] for CUBIN).
pub fn start(mods: Vec<ModuleSource>, arch: &str, cache: Option<&Path>) -> DResult<Pending> {
    start_images(mods, arch, cache, ImageKind::Ptx)
}

/// [`start`] for images of `kind`. A cached CUBIN that is not an ELF image (a file cut short)
/// is compiled again.
pub fn start_images(
    mods: Vec<ModuleSource>,
    arch: &str,
    cache: Option<&Path>,
    kind: ImageKind,
) -> DResult<Pending> {
    let started = Instant::now();
    let mut done = Vec::new();
    let mut todo = Vec::new();
    for m in mods {
        let path = cache.map(|d| cache_path_of(d, &m, arch, kind));
        let cached = path.as_ref().and_then(|p| match kind {
            ImageKind::Ptx => std::fs::read_to_string(p).ok().map(Image::Ptx),
            ImageKind::Cubin => std::fs::read(p)
                .ok()
                .filter(|b| elf_whole(b))
                .map(Image::Cubin),
        });
        match cached {
            Some(image) => done.push(Compiled {
                file: m.file,
                image,
                cached: true,
                compile: Duration::ZERO,
                ended: None,
            }),
            None => todo.push((m, path)),
        }
    }
    if !todo.is_empty() {
        guarded("NVRTC", nvrtc_loads)?;
    }
    let mut running = Vec::new();
    for (m, path) in todo {
        let arch = arch.to_string();
        let file = m.file.clone();
        let h = std::thread::Builder::new()
            .name(format!("nvrtc {file}"))
            .spawn(move || compile_one(m, &arch, path.as_deref(), kind))
            .map_err(|e| format!("cannot start the NVRTC thread for {file}: {e}"))?;
        running.push((file, h));
    }
    Ok(Pending {
        done,
        running,
        started,
    })
}

/// Whether the NVRTC library loads (cudarc's loader panics when it does not).
fn nvrtc_loads() -> DResult<()> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion: {e:?}"))
}

fn compile_one(
    m: ModuleSource,
    arch: &str,
    path: Option<&Path>,
    kind: ImageKind,
) -> DResult<Compiled> {
    let t = Instant::now();
    let image = match kind {
        ImageKind::Ptx => Image::Ptx(
            compile(&m.src, arch)
                .map_err(|e| format!("NVRTC ({arch}) {}: {}", m.file, compile_log(&e)))?
                .to_src(),
        ),
        ImageKind::Cubin => Image::Cubin(
            compile_cubin(&m.src, arch).map_err(|e| format!("NVRTC ({arch}) {}: {e}", m.file))?,
        ),
    };
    if let Some(p) = path {
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // Written whole under a temporary name, then renamed: a process starting meanwhile
        // never reads half a module.
        let tmp = p.with_extension(format!("part.{}", std::process::id()));
        let bytes: &[u8] = match &image {
            Image::Ptx(s) => s.as_bytes(),
            Image::Cubin(b) => b,
        };
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, p).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(Compiled {
        file: m.file,
        image,
        cached: false,
        compile: t.elapsed(),
        ended: Some(Instant::now()),
    })
}

impl Pending {
    /// Whether any module is still being compiled (not read from the cache).
    pub fn compiling(&self) -> usize {
        self.running.len()
    }

    /// Modules in all.
    pub fn modules(&self) -> usize {
        self.done.len() + self.running.len()
    }

    /// Waits for every module: their PTX, in no particular order, and the report; the first
    /// failure is an error naming its file and NVRTC's log (a thread that panicked is one
    /// naming the file too).
    pub fn join(mut self) -> DResult<(Vec<Compiled>, CompileReport)> {
        let waited_from = Instant::now();
        let mut out = std::mem::take(&mut self.done);
        let mut first_err = None;
        for (file, h) in std::mem::take(&mut self.running) {
            match h.join() {
                Ok(Ok(c)) => out.push(c),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panic".into());
                    first_err.get_or_insert(format!("NVRTC {file}: {msg}"));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let cached = out.iter().filter(|c| c.cached).count();
        let slowest = out
            .iter()
            .filter(|c| !c.cached)
            .max_by_key(|c| c.compile)
            .map(|c| (c.file.clone(), c.compile));
        // From the start to the last module's end (a join may come long after that).
        let wall = out
            .iter()
            .filter_map(|c| c.ended)
            .max()
            .map_or(Duration::ZERO, |e| e.duration_since(self.started));
        let report = CompileReport {
            modules: out.len(),
            cached,
            wall,
            slowest,
            waited: waited_from.elapsed(),
        };
        Ok((out, report))
    }
}

/// Loads every module into `ctx` (bound to this thread) and looks each kernel of [`KERNELS`]
/// up in the one module that defines it: a kernel in none, or in two, is an error naming it.
pub(crate) fn load(
    ctx: &Arc<CudaContext>,
    mods: Vec<Compiled>,
) -> DResult<HashMap<&'static str, CudaFunction>> {
    let loaded = mods
        .into_iter()
        .map(|m| {
            let kind = match m.image {
                Image::Ptx(_) => "PTX",
                Image::Cubin(_) => "CUBIN",
            };
            let what = if m.cached {
                format!("cached {kind} of")
            } else {
                format!("{kind} of")
            };
            let image = match m.image {
                Image::Ptx(s) => Ptx::from_src(s),
                Image::Cubin(b) => Ptx::from_binary(b),
            };
            ctx.load_module(image)
                .map(|module| (m.file.clone(), module))
                .map_err(|e| drv(&format!("cuModuleLoadData ({what} {})", m.file), e))
        })
        .collect::<DResult<Vec<_>>>()?;
    let mut funcs = HashMap::new();
    for &k in KERNELS {
        let mut found = loaded
            .iter()
            .filter_map(|(file, module)| module.load_function(k).ok().map(|f| (file, f)));
        let (file, f) = found
            .next()
            .ok_or_else(|| format!("kernel {k} is in none of the {} modules", loaded.len()))?;
        if let Some((other, _)) = found.next() {
            return Err(format!("kernel {k} is in both {file} and {other}"));
        }
        funcs.insert(k, f);
    }
    Ok(funcs)
}

/// A compile never outlives its owner: dropped before it was joined (a load that failed
/// after the backend was made), it waits for its threads. A process must not exit while a
/// thread is inside NVRTC (its library is torn down under it: a crash at exit, not the error
/// the load reported); the modules it finishes are cached for the next start.
impl Drop for Pending {
    fn drop(&mut self) {
        for (_, h) in self.running.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
#[path = "compile_tests.rs"]
mod tests;

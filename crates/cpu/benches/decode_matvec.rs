//! Decode-shaped matmuls on a real model: one activation row against every 2-D weight of the
//! model except the token-embedding table (a decode step's weight reads, in file order), through
//! `ops::matmul::matmul` (kernels + thread pool), so per weight type this measures the weight
//! GB/s a decode step can reach without attention and the small ops.
//!
//! `MINFER_MODEL=path cargo bench -p minfer-cpu --bench decode_matvec -- [threads] [passes]`
//! (default: the cached demo model, `minfer_testkit::models::qwen()`; threads 1,
//! 5 passes). Prints, per type, the median over passes of the ms spent in that type's matmuls
//! per pass and the GB/s that gives, and the median whole pass (the weight bytes of one token).
//! Not a test: nothing is asserted.
//!
//! `MINFER_WITH_EMBD=1`: the token-embedding table too (a tied model's output matrix).
//! `MINFER_CPU_PACK=0`: the weights in their plain rows (default: packed where the backend
//! would pack them).
//!
//! `MINFER_HOT_KB=n`: each weight cut to its first rows of about n KiB (whole groups of 16
//! rows) and each matmul run 8 times in a row, so the weights come from cache: the kernels'
//! compute speed, to set against the streaming figure (a kernel as fast hot as cold is
//! compute-bound).

use std::collections::BTreeMap;
use std::time::Instant;

use minfer_cpu::ops::matmul::{matmul, Weight};
use minfer_gguf::GgufModel;
use minfer_testkit::models;

#[cfg(unix)]
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

#[cfg(unix)]
extern "C" {
    /// POSIX `clock_gettime` from the C library std already links.
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// This thread's CPU time in seconds (`CLOCK_THREAD_CPUTIME_ID`): on a shared machine it
/// excludes the time other processes held the core. NaN where unavailable.
#[cfg(unix)]
fn thread_cpu() -> f64 {
    #[cfg(target_vendor = "apple")]
    const CLOCK_THREAD_CPUTIME_ID: i32 = 16;
    #[cfg(not(target_vendor = "apple"))]
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec (two 64-bit fields on 64-bit targets).
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

#[cfg(not(unix))]
fn thread_cpu() -> f64 {
    f64::NAN
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let threads: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(1);
    let passes: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let Some(path) = std::env::var_os("MINFER_MODEL")
        .map(std::path::PathBuf::from)
        .or_else(models::qwen)
    else {
        return;
    };
    let model = match GgufModel::open(&path) {
        Ok(m) => m,
        Err(e) => {
            println!("SKIP: {}: {e}", path.display());
            return;
        }
    };
    let mut weights = Vec::new();
    for t in model.tensors() {
        let info = &t.info;
        if info.dims.len() != 2
            || (info.name.starts_with("token_embd")
                && std::env::var_os("MINFER_WITH_EMBD").is_none())
            || info.ty == minfer_gguf::GgmlType::F32
        {
            continue;
        }
        let (_, bytes) = model.tensor_data(&info.name).expect("tensor data");
        weights.push(Weight {
            ty: info.ty,
            k: info.dims[0] as usize,
            m: info.dims[1] as usize,
            bytes,
            layout: Default::default(),
        });
    }
    let hot_kb: Option<usize> = std::env::var("MINFER_HOT_KB")
        .ok()
        .and_then(|v| v.parse().ok());
    let repeat = if hot_kb.is_some() { 8 } else { 1 };
    if let Some(kb) = hot_kb {
        for w in &mut weights {
            let wrb = w.bytes.len() / w.m;
            let m = (kb * 1024 / wrb.max(1)).max(16) / 16 * 16;
            w.m = w.m.min(m);
            w.bytes = &w.bytes[..w.m * wrb];
        }
    }
    // Q4_K and Q6_K rows packed 16 at a time where the backend would pack them (`MINFER_CPU_PACK`).
    let pack = std::env::var("MINFER_CPU_PACK").map_or(true, |v| v != "0")
        && minfer_cpu::huge::huge_pages_available();
    let packed: Vec<Option<(minfer_cpu::ops::matmul::Layout, minfer_cpu::huge::HugeBytes)>> =
        weights
            .iter()
            .map(|w| {
                let layout = minfer_cpu::ops::matmul::Layout::packed_for(w.ty)?;
                (pack && w.m >= 16 && minfer_cpu::simd::x16_kernel(w.ty).is_some()).then(|| {
                    let p = minfer_cpu::ops::matmul::packed::pack_x16(layout, w.bytes, w.k, w.m);
                    (layout, p.expect("pack"))
                })
            })
            .collect();
    for (w, p) in weights.iter_mut().zip(&packed) {
        if let Some((layout, p)) = p {
            w.bytes = &p[..];
            w.layout = *layout;
        }
    }
    println!("K-quant rows packed 16 at a time: {pack}");
    let kmax = weights.iter().map(|w| w.k).max().unwrap_or(0);
    let mmax = weights.iter().map(|w| w.m).max().unwrap_or(0);
    let x: Vec<f32> = (0..kmax)
        .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.002)
        .collect();
    let mut out = vec![0f32; mmax];
    let mut types: Vec<_> = weights.iter().map(|w| w.ty).collect();
    types.sort_by_key(|t| format!("{t}"));
    types.dedup();
    // type -> (bytes, wall per pass, thread CPU per pass)
    let mut per_type: BTreeMap<String, (u64, Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut totals = Vec::new();
    let mut in_order = Vec::new();
    for pass in 0..=passes {
        let (start, cpu0) = (Instant::now(), thread_cpu());
        // Grouped by type, so that thread CPU time can be read per type.
        for &ty in &types {
            let (t, c) = (Instant::now(), thread_cpu());
            let mut b = 0u64;
            for w in weights.iter().filter(|w| w.ty == ty) {
                for _ in 0..repeat {
                    matmul(w, &x[..w.k], None, &mut out[..w.m], threads).expect("matmul");
                    b += w.bytes.len() as u64;
                }
            }
            let (wall, cpu) = (t.elapsed().as_secs_f64(), thread_cpu() - c);
            // Pass 0 is the warm-up (page cache, pool start).
            if pass > 0 {
                let e = per_type.entry(format!("{ty}")).or_default();
                e.0 = b;
                e.1.push(wall);
                e.2.push(cpu);
            }
        }
        if pass > 0 {
            totals.push((start.elapsed().as_secs_f64(), thread_cpu() - cpu0));
        }
        // Then every weight once more in file order (a decode step's order: the types
        // interleaved), timed as a whole.
        let (t, c) = (Instant::now(), thread_cpu());
        for w in &weights {
            matmul(w, &x[..w.k], None, &mut out[..w.m], threads).expect("matmul");
        }
        if pass > 0 {
            in_order.push((t.elapsed().as_secs_f64(), thread_cpu() - c));
        }
    }
    let bytes: u64 = per_type.values().map(|v| v.0).sum();

    println!("threads {threads}, {passes} passes, medians (wall; calling thread's CPU time)");
    for (ty, (b, wall, cpu)) in per_type {
        let (wall, cpu) = (median(wall), median(cpu));
        println!(
            "{ty:>6}: {:>7.1} MB {:>7.2} ms {:>6.2} GB/s; cpu {:>7.2} ms {:>6.2} GB/s",
            b as f64 / 1e6,
            wall * 1e3,
            b as f64 / wall / 1e9,
            cpu * 1e3,
            b as f64 / cpu / 1e9
        );
    }
    let wall = median(totals.iter().map(|t| t.0).collect());
    let cpu = median(totals.iter().map(|t| t.1).collect());
    println!(
        "   all: {:>7.1} MB {:>7.2} ms {:>6.2} GB/s; cpu {:>7.2} ms {:>6.2} GB/s",
        bytes as f64 / 1e6,
        wall * 1e3,
        bytes as f64 / wall / 1e9,
        cpu * 1e3,
        bytes as f64 / cpu / 1e9
    );
    let wall = median(in_order.iter().map(|t| t.0).collect());
    let cpu = median(in_order.iter().map(|t| t.1).collect());
    println!(
        " order: {:>7.1} MB {:>7.2} ms {:>6.2} GB/s; cpu {:>7.2} ms {:>6.2} GB/s (file order)",
        bytes as f64 / 1e6 / repeat as f64,
        wall * 1e3,
        bytes as f64 / repeat as f64 / wall / 1e9,
        cpu * 1e3,
        bytes as f64 / repeat as f64 / cpu / 1e9
    );
}

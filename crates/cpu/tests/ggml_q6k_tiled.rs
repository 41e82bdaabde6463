//! Gate: `llamacpp_x86::q6k_tiled` equals llama.cpp's own tiled Q6_K matmul bit for bit.
//!
//! The reference is llama.cpp 0c1e570 itself: scripts/ggml-harness/q6k_tiled.c runs one
//! MUL_MAT graph against the peer build's static libraries (scripts/peer-build; an AVX2
//! `-march=native` build on this machine), at 1, 2 and 3 threads (which must agree). Inputs:
//! seeded random Q6_K blocks (minfer_gguf's `random_blocks`: every quant bit pattern, every
//! i8 scale) and random normal activations, which ggml Q8_K-quantizes itself; the harness
//! hands back those Q8_K bytes, and they go unchanged into `matmul_q6k_tiled`.
//!
//! Shapes: n in {8, 9, 16, 21, 42, 74} x k in {256, 4864} x m in {16, 896}, plus the cases
//! the driver treats specially: a narrow band (n <= 16) over several slabs per stream
//! (k = 768, 1536), ragged weight rows (m % 16 != 0), a standard band with a ragged 16-column
//! tail (n = 17), more than one 256-row window (m = 300) and more than one 256-column window
//! (n = 257).
//!
//! Controls:
//! - built in: the same harness with `GGML_CPU_TILED_MM=0` (ggml's vec_dot path) must differ
//!   from the tiled result somewhere, and equal minfer's `q6k::dot_q6_k` bit for bit, so the
//!   gate tells the two float orders apart.
//! - mutations tried in `WeightRows::matmul`: fusing the other product,
//!   `(wd * ad).mul_add(s1 as f32, acc)`, fails this gate with 148,140 of 322,132 outputs
//!   different; leaving it unfused, `acc += wd * s1 as f32 * ad`, with 91,449.
//!
//! AVX-512 (VNNI microkernel): no AVX-512 here; `remote_avx512_outputs` compares outputs made
//! by the harness on an AVX-512 build (scripts/ggml-harness/q6k-tiled-avx512 stages it).

use minfer_cpu::llamacpp_x86::q6k::dot_q6_k;
use minfer_cpu::llamacpp_x86::q6k_tiled::{matmul_q6k_tiled, matmul_q6k_tiled_threads};
use minfer_cpu::llamacpp_x86::LlamaCppX86;
use minfer_gguf::quants::{quantize_act_row, random_blocks};
use minfer_gguf::GgmlType;
use minfer_testkit::rng::Rng;
use std::path::{Path, PathBuf};
use std::process::Command;

const W_BYTES: usize = 210;
const A_BYTES: usize = 292;

struct Case {
    name: String,
    k: usize,
    m: usize,
    n: usize,
}

fn cases() -> Vec<Case> {
    let mut shapes = Vec::new();
    for n in [8, 9, 16, 21, 42, 74] {
        for k in [256, 4864] {
            for m in [16, 896] {
                shapes.push((k, m, n));
            }
        }
    }
    // Narrow path with 3 and 6 slabs per weight-row stream, ragged weight rows.
    shapes.extend([(768, 40, 13), (1536, 33, 8)]);
    // Standard path: ragged 16-column band, two 256-row windows, two 256-column windows.
    shapes.extend([(512, 300, 17), (256, 24, 257)]);
    shapes
        .into_iter()
        .map(|(k, m, n)| Case {
            name: format!("k{k}_m{m}_n{n}"),
            k,
            m,
            n,
        })
        .collect()
}

/// Writes NAME.w, NAME.x and cases.txt under `dir`.
fn stage(dir: &Path, cases: &[Case]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut list = String::new();
    for (i, c) in cases.iter().enumerate() {
        let w = random_blocks(GgmlType::Q6K, c.m * c.k / 256, 0x5eed_0000 + i as u64);
        let mut rng = Rng::splitmix64(0xac7_0000 + i as u64);
        // A per-row magnitude so the Q8_K scales vary between rows as well as blocks.
        let x: Vec<f32> = (0..c.n)
            .flat_map(|_| {
                let row_scale = 0.25 + 4.0 * rng.unit() as f32;
                (0..c.k)
                    .map(|_| row_scale * rng.normal())
                    .collect::<Vec<_>>()
            })
            .collect();
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.join(format!("{}.w", c.name)), &w).unwrap();
        std::fs::write(dir.join(format!("{}.x", c.name)), xb).unwrap();
        list += &format!("{} {} {} {}\n", c.name, c.k, c.m, c.n);
    }
    std::fs::write(dir.join("cases.txt"), list).unwrap();
}

/// The peer build's static libraries and the llama.cpp source they came from.
fn peer() -> Option<(PathBuf, PathBuf)> {
    let root = std::env::var_os("MINFER_PEER")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/peer"))
        })?;
    let src = root.join("src/llama_cpp_python-0.3.36/vendor/llama.cpp");
    let lib = root.join("build/ggml/src");
    let present = src.join("ggml/include/ggml-cpu.h").is_file()
        && ["libggml.a", "libggml-cpu.a", "libggml-base.a"]
            .iter()
            .all(|l| lib.join(l).is_file());
    present.then_some((src, lib))
}

fn build_harness(src: &Path, lib: &Path, out: &Path) -> PathBuf {
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ggml-harness/q6k_tiled.c");
    let (obj, exe) = (out.join("q6k_tiled.o"), out.join("q6k_tiled"));
    let ok = Command::new("gcc")
        .args(["-O2", "-c"])
        .arg(&c)
        .arg("-I")
        .arg(src.join("ggml/include"))
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap()
        .success();
    assert!(ok, "compiling {}", c.display());
    let ok = Command::new("g++")
        .arg(&obj)
        .arg("-o")
        .arg(&exe)
        .args(["libggml.a", "libggml-cpu.a", "libggml-base.a"].map(|l| lib.join(l)))
        .args(["-lm", "-fopenmp", "-lpthread"])
        .status()
        .unwrap()
        .success();
    assert!(ok, "linking the harness against {}", lib.display());
    exe
}

fn run_harness(exe: &Path, dir: &Path, tiled: bool) {
    let mut cmd = Command::new(exe);
    cmd.arg(dir).args(["1", "2", "3"]);
    if !tiled {
        cmd.env("GGML_CPU_TILED_MM", "0");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "harness on {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Compares `simd`'s tiled matmul of the inputs in `inputs` (NAME.w) and the Q8_K rows the
/// harness left in `outputs` (NAME.q8) with its results there (NAME.y); returns (outputs
/// compared, outputs that differ); `report` prints each case's first difference.
fn compare(
    simd: LlamaCppX86,
    inputs: &Path,
    outputs: &Path,
    cases: &[Case],
    threads: usize,
    report: bool,
) -> (usize, usize) {
    let (mut total, mut bad) = (0, 0);
    for c in cases {
        let w = std::fs::read(inputs.join(format!("{}.w", c.name))).unwrap();
        let file = |ext: &str| outputs.join(format!("{}.{ext}", c.name));
        let act = std::fs::read(file("q8")).unwrap();
        let want = read_f32(&file("y"));
        assert_eq!(act.len(), c.n * c.k / 256 * A_BYTES, "{}.q8", c.name);
        assert_eq!(want.len(), c.n * c.m, "{}.y", c.name);
        let mut got = vec![0f32; c.n * c.m];
        if threads == 1 {
            matmul_q6k_tiled(simd, &w, c.k, c.m, &act, c.n, &mut got).unwrap();
        } else {
            matmul_q6k_tiled_threads(simd, &w, c.k, c.m, &act, c.n, &mut got, threads).unwrap();
        }
        let diff = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if diff > 0 && report {
            let i = (0..got.len())
                .find(|&i| got[i].to_bits() != want[i].to_bits())
                .unwrap();
            eprintln!(
                "{}: {diff} of {} differ; first out[{}][{}] = {:e}, llama.cpp {:e}",
                c.name,
                got.len(),
                i / c.m,
                i % c.m,
                got[i],
                want[i]
            );
        }
        total += got.len();
        bad += diff;
    }
    (total, bad)
}

/// minfer's Q8_K quantizer gives the bytes ggml's did (so the engine feeds the same codes).
fn check_q8(inputs: &Path, outputs: &Path, cases: &[Case]) {
    for c in cases {
        let x = read_f32(&inputs.join(format!("{}.x", c.name)));
        let arb = c.k / 256 * A_BYTES;
        let mut act = vec![0u8; c.n * arb];
        for (xr, ar) in x.chunks_exact(c.k).zip(act.chunks_exact_mut(arb)) {
            quantize_act_row(GgmlType::Q8K, xr, ar).unwrap();
        }
        let ggml = std::fs::read(outputs.join(format!("{}.q8", c.name))).unwrap();
        assert!(act == ggml, "{}: Q8_K bytes differ from ggml's", c.name);
    }
}

#[test]
fn q6k_tiled_matches_llama_cpp_avx2_build() {
    let Some((src, lib)) = peer() else {
        println!("SKIP: no llama.cpp peer build (scripts/peer-build)");
        return;
    };
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ggml_q6k_tiled");
    let (tiled_dir, vec_dot_dir) = (tmp.join("tiled"), tmp.join("vec_dot"));
    let _ = std::fs::remove_dir_all(&tmp);
    let cases = cases();
    stage(&tiled_dir, &cases);
    stage(&vec_dot_dir, &cases);
    let exe = build_harness(&src, &lib, &tmp);
    run_harness(&exe, &tiled_dir, true);
    run_harness(&exe, &vec_dot_dir, false);

    check_q8(&tiled_dir, &tiled_dir, &cases);

    let (total, bad) = compare(LlamaCppX86::Avx2, &tiled_dir, &tiled_dir, &cases, 1, true);
    assert_eq!(
        bad, 0,
        "{bad} of {total} outputs differ from llama.cpp's tiled path"
    );
    let (_, bad) = compare(LlamaCppX86::Avx2, &tiled_dir, &tiled_dir, &cases, 3, true);
    assert_eq!(bad, 0, "3 threads differ");
    println!("{total} outputs in {} cases bit-identical", cases.len());

    // Control: the vec_dot order is a different result, which minfer's dot_q6_k reproduces.
    let (_, tiled_vs_vec_dot) = compare(
        LlamaCppX86::Avx2,
        &vec_dot_dir,
        &vec_dot_dir,
        &cases,
        1,
        false,
    );
    assert!(
        tiled_vs_vec_dot > 0,
        "vec_dot and tiled outputs agree everywhere: the gate cannot tell them apart"
    );
    for c in &cases {
        let file = |ext: &str| vec_dot_dir.join(format!("{}.{ext}", c.name));
        let (w, act, want) = (
            std::fs::read(file("w")).unwrap(),
            std::fs::read(file("q8")).unwrap(),
            read_f32(&file("y")),
        );
        let (wrb, arb) = (c.k / 256 * W_BYTES, c.k / 256 * A_BYTES);
        for t in 0..c.n {
            for r in 0..c.m {
                let v = dot_q6_k(&w[r * wrb..(r + 1) * wrb], &act[t * arb..(t + 1) * arb]);
                assert_eq!(
                    v.to_bits(),
                    want[t * c.m + r].to_bits(),
                    "{} vec_dot",
                    c.name
                );
            }
        }
    }
    println!("control: {tiled_vs_vec_dot} outputs of ggml's vec_dot path differ from tiled");
}

/// The AVX-512 round trip (scripts/ggml-harness/q6k-tiled-avx512): with
/// MINFER_Q6K_TILED_STAGE=DIR, writes the inputs there; with MINFER_Q6K_TILED_REMOTE=DIR,
/// compares the .q8/.y files an AVX-512 build of the harness made from them with the
/// `Avx512` flavour (the inputs are regenerated: they depend only on the seeds).
#[test]
fn remote_avx512_outputs() {
    let cases = cases();
    if let Some(dir) = std::env::var_os("MINFER_Q6K_TILED_STAGE") {
        stage(Path::new(&dir), &cases);
        println!(
            "staged {} cases in {}",
            cases.len(),
            Path::new(&dir).display()
        );
    }
    let Some(outputs) = std::env::var_os("MINFER_Q6K_TILED_REMOTE") else {
        println!("SKIP: MINFER_Q6K_TILED_REMOTE not set");
        return;
    };
    let inputs = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ggml_q6k_tiled_remote");
    let _ = std::fs::remove_dir_all(&inputs);
    stage(&inputs, &cases);
    let outputs = Path::new(&outputs);
    check_q8(&inputs, outputs, &cases);
    let (total, bad) = compare(LlamaCppX86::Avx512, &inputs, outputs, &cases, 1, true);
    assert_eq!(
        bad, 0,
        "{bad} of {total} outputs differ from the AVX-512 build"
    );
    println!(
        "{total} outputs in {} cases bit-identical to the AVX-512 build",
        cases.len()
    );
}

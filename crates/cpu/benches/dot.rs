//! ns per 4096-element row dot (and per 4096-element activation quantization), scalar
//! reference vs each SIMD instruction set this machine has. Rows are hot in cache, so this
//! measures compute, not memory bandwidth. `cargo bench -p minfer-cpu --bench dot`.
//! Not a test: it asserts nothing about speed (results of both paths are checked equal).

use std::hint::black_box;
use std::time::Instant;

use minfer_cpu::simd::{self, Isa, RowDot};
use minfer_gguf::quants::{self, random_blocks, vec_dot_type};
use minfer_gguf::GgmlType;

const N: usize = 4096;

/// Minimum over 40 rounds (~1 ms each) of the mean ns per call of `f`. The minimum, because
/// the machine is shared: slower rounds are other processes' time, not the kernel's.
fn ns_per_call(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed().as_micros() < 1000 {
        f();
        calls += 1;
    }
    (0..40)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                f();
            }
            t.elapsed().as_nanos() as f64 / calls as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn activations(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.002)
        .collect()
}

fn main() {
    let isas: Vec<Isa> = simd::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect();
    let header: Vec<String> = isas.iter().map(|i| format!("{i:>8} ns  speedup")).collect();
    println!("| type    |  scalar ns | {} |", header.join(" | "));
    let x = activations(N);
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::Q5K,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
        GgmlType::Q8K,
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
    ];
    for ty in types {
        let w = random_blocks(ty, N / ty.block_size() as usize, 1);
        let at = vec_dot_type(ty);
        let mut act = vec![0u8; at.row_bytes(N as u64).unwrap() as usize];
        quants::quantize_row(at, &x, &mut act).unwrap();
        let want = quants::vec_dot(ty, N, &w, &act).unwrap();
        let scalar = ns_per_call(|| {
            black_box(quants::vec_dot(ty, N, black_box(&w), black_box(&act)).unwrap());
        });
        let cols: Vec<String> = isas
            .iter()
            .map(|&isa| {
                // The hoisted kernel, as a matmul loop would use it.
                let dot = RowDot::on(isa, ty).unwrap();
                let got = dot.dot(N, &w, &act).unwrap();
                assert_eq!(got.to_bits(), want.to_bits(), "{isa} {ty}");
                let ns = ns_per_call(|| {
                    black_box(dot.dot(N, black_box(&w), black_box(&act)).unwrap());
                });
                format!("{ns:>11.0}  {:>6.1}x", scalar / ns)
            })
            .collect();
        println!(
            "| {:<7} | {scalar:>10.0} | {} |",
            ty.name(),
            cols.join(" | ")
        );
    }
    println!();
    side_rows(&isas, &x);
    println!();
    four_rows(&isas, &x);
    println!();
    matvec(&isas, &x);
    println!();
    println!(
        "| quantize 4096 f32 to | scalar ns | {} |",
        header.join(" | ")
    );
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K] {
        let mut out = vec![0u8; ty.row_bytes(N as u64).unwrap() as usize];
        let scalar = ns_per_call(|| {
            quants::quantize_row(ty, black_box(&x), &mut out).unwrap();
            black_box(&out);
        });
        let cols: Vec<String> = isas
            .iter()
            .map(|&isa| {
                let ns = ns_per_call(|| {
                    simd::quantize_act_on(isa, ty, black_box(&x), &mut out).unwrap();
                    black_box(&out);
                });
                format!("{ns:>11.0}  {:>6.1}x", scalar / ns)
            })
            .collect();
        println!(
            "| {:<20} | {scalar:>9.0} | {} |",
            ty.name(),
            cols.join(" | ")
        );
    }
}

/// The side kernels (decode: activation block facts from the matmul's side table), ns per
/// 4096-element row next to the plain kernel of the same instruction set (rows hot in cache).
fn side_rows(isas: &[Isa], x: &[f32]) {
    println!("| side kernel | isa | plain ns | side ns | speedup |");
    for ty in [GgmlType::Q5_0] {
        let w = random_blocks(ty, N / ty.block_size() as usize, 1);
        let at = vec_dot_type(ty);
        let arb = at.row_bytes(N as u64).unwrap() as usize;
        let mut act = vec![0u8; arb];
        quants::quantize_row(at, x, &mut act).unwrap();
        let mut table = simd::TileSide::default();
        assert!(table.fill_rows(at, &act, arb));
        let (d, sums) = table.row(0);
        for &isa in isas {
            let dot = RowDot::on(isa, ty).unwrap();
            let (Some(plain), Some(side)) = (
                dot.kernel_for(N, w.len(), arb),
                dot.side_for(N, w.len(), arb),
            ) else {
                continue;
            };
            let side = |w: &[u8], a: &[u8], d: &[f32], s: &[i32]| {
                let mut out = [0f32];
                side(w, a, d, s, &mut out);
                out[0]
            };
            assert_eq!(plain(&w, &act).to_bits(), side(&w, &act, d, sums).to_bits());
            let p = ns_per_call(|| {
                black_box(plain(black_box(&w), black_box(&act)));
            });
            let s = ns_per_call(|| {
                black_box(side(black_box(&w), black_box(&act), d, sums));
            });
            println!(
                "| {:<11} | {isa} | {p:>8.0} | {s:>7.0} | {:>6.2}x |",
                ty.name(),
                p / s
            );
        }
    }
}

/// The 4-activation-row kernels (prefill: one weight row against 4 tokens), ns per weight
/// row and token, next to the 1-row kernel of the same instruction set (rows hot in cache).
fn four_rows(isas: &[Isa], x: &[f32]) {
    let header: Vec<String> = isas
        .iter()
        .map(|i| format!("{i:>8} 1-row ns  4-row ns/token"))
        .collect();
    println!("| 4-row kernels | {} |", header.join(" | "));
    let types = [
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Iq4Nl,
    ];
    for ty in types {
        let w = random_blocks(ty, N / ty.block_size() as usize, 3);
        let at = vec_dot_type(ty);
        let acts: Vec<Vec<u8>> = (0..4)
            .map(|t| {
                let xt: Vec<f32> = x.iter().map(|v| v * (1.0 + t as f32 * 0.25)).collect();
                let mut act = vec![0u8; at.row_bytes(N as u64).unwrap() as usize];
                quants::quantize_row(at, &xt, &mut act).unwrap();
                act
            })
            .collect();
        let cols: Vec<String> = isas
            .iter()
            .map(|&isa| {
                let dot = RowDot::on(isa, ty).unwrap();
                let one = ns_per_call(|| {
                    black_box(dot.dot(N, black_box(&w), black_box(&acts[0])).unwrap());
                });
                let four = dot
                    .kernel4_for(N, w.len(), acts[0].len())
                    .map(|f4| {
                        let a = [&acts[0][..], &acts[1], &acts[2], &acts[3]];
                        let got = f4(&w, a);
                        for (g, act) in got.iter().zip(&acts) {
                            let want = quants::vec_dot(ty, N, &w, act).unwrap();
                            assert_eq!(g.to_bits(), want.to_bits(), "{isa} {ty} 4-row");
                        }
                        let ns = ns_per_call(|| {
                            black_box(f4(black_box(&w), a));
                        });
                        format!("{:>14.0}", ns / 4.0)
                    })
                    .unwrap_or_else(|| format!("{:>14}", "-"));
                format!("{one:>16.0}  {four}")
            })
            .collect();
        println!("| {:<13} | {} |", ty.name(), cols.join(" | "));
    }
}

/// One thread, one 4096-element activation row against a 4096 x 4096 weight matrix (9-18 MB,
/// more than the caches hold), so the weights stream from memory as in a real matmul.
fn matvec(isas: &[Isa], x: &[f32]) {
    const ROWS: usize = 4096;
    let header: Vec<String> = isas.iter().map(|i| format!("{i:>8} ms  GB/s")).collect();
    println!(
        "| matvec {ROWS}x{N} | MB | scalar ms | {} |",
        header.join(" | ")
    );
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::Q4_1] {
        let w = random_blocks(ty, ROWS * N / ty.block_size() as usize, 2);
        let row = ty.row_bytes(N as u64).unwrap() as usize;
        let at = vec_dot_type(ty);
        let mut act = vec![0u8; at.row_bytes(N as u64).unwrap() as usize];
        quants::quantize_row(at, x, &mut act).unwrap();
        let mut out = vec![0.0f32; ROWS];
        let time = |f: &dyn Fn(&[u8]) -> f32, out: &mut [f32]| {
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    for (o, r) in out.iter_mut().zip(w.chunks_exact(row)) {
                        *o = f(black_box(r));
                    }
                    black_box(&out);
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let scalar = time(&|r| quants::vec_dot(ty, N, r, &act).unwrap(), &mut out);
        let mb = w.len() as f64 / 1e6;
        let cols: Vec<String> = isas
            .iter()
            .map(|&isa| {
                let dot = RowDot::on(isa, ty).unwrap();
                let s = time(&|r| dot.dot(N, r, &act).unwrap(), &mut out);
                format!("{:>11.2}  {:>4.1}", s * 1e3, mb / 1e3 / s)
            })
            .collect();
        println!(
            "| {:<14} | {mb:>4.1} | {:>9.2} | {} |",
            ty.name(),
            scalar * 1e3,
            cols.join(" | ")
        );
    }
}

//! The packed kernels alone (`simd::x16_kernel_on`), without the matmul around them: one
//! group of 16 rows against 64 tokens, four a call, hot in L1 and L2, on each instruction
//! set here; the packed kernel and its facts form on the packed group beside the prompt form
//! on its expansion (`X16Wide`), and the expansion itself; ns for the 64 tokens, the minimum
//! over rounds. `cargo bench -p minfer-cpu --bench x16_kernels [-- K]` (K: the row length;
//! by default the demo model's, 896 for Q5_0 and 4864 for the K-quants).
//! Not a test: it asserts nothing about speed.

use std::hint::black_box;
use std::time::Instant;

use minfer_cpu::ops::matmul::packed::pack_x16;
use minfer_cpu::ops::matmul::Layout;
use minfer_cpu::simd::{self, ActFacts, TileSide};
use minfer_gguf::quants::{self, random_blocks, vec_dot_type};
use minfer_gguf::GgmlType;

/// The minimum over 30 rounds of `reps` calls of `f`, in ns per call.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..30 {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / reps as f64);
    }
    best
}

fn main() {
    let k_arg: Option<usize> = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse().expect("K"));
    let nt = 64;
    for isa in simd::available() {
        for (ty, k) in [
            (GgmlType::Q5_0, 896),
            (GgmlType::Q6K, 4864),
            (GgmlType::Q4K, 4864),
        ] {
            let k = k_arg.unwrap_or(k);
            let Some(x16) = simd::x16_kernel_on(isa, ty) else {
                continue;
            };
            let w = random_blocks(ty, 16 * k / ty.block_size() as usize, 3);
            let g = pack_x16(Layout::packed_for(ty).unwrap(), &w, k, 16).unwrap();
            let at = vec_dot_type(ty);
            let arb = at.row_bytes(k as u64).unwrap() as usize;
            let mut acts = vec![0u8; nt * arb];
            for (t, a) in acts.chunks_exact_mut(arb).enumerate() {
                let x: Vec<f32> = (0..k)
                    .map(|i| (((i + 31 * t) * 7919 % 1013) as f32 - 506.0) * 0.002)
                    .collect();
                quants::quantize_row(at, &x, a).unwrap();
            }
            let mut side = TileSide::default();
            assert!(side.fill_rows(at, &acts, arb));
            let rows: Vec<&[u8]> = acts.chunks_exact(arb).collect();
            let facts: Vec<ActFacts> = (0..nt)
                .map(|t| {
                    let (d, sums) = side.row(t);
                    ActFacts { d, sums }
                })
                .collect();
            let mut out = [[0f32; 16]; 4];
            let macs = (16 * k * nt) as f64;
            let report = |what: &str, ns: f64| {
                println!(
                    "{isa} {ty} k={k} {what:>22}: {:>9.0} ns for {nt} tokens  {:>6.1} GMAC/s",
                    ns,
                    macs / ns
                )
            };
            let ns = time(50, || {
                for t in (0..nt).step_by(4) {
                    (x16.four)(
                        black_box(&g),
                        std::array::from_fn(|i| rows[t + i]),
                        &mut out,
                    );
                }
                black_box(&out);
            });
            report("packed", ns);
            if let Some(f) = x16.facts {
                let ns = time(200, || {
                    for t in (0..nt).step_by(4) {
                        (f.four)(
                            black_box(&g),
                            std::array::from_fn(|i| rows[t + i]),
                            std::array::from_fn(|i| facts[t + i]),
                            &mut out,
                        );
                    }
                    black_box(&out);
                });
                report("packed, facts", ns);
            }
            if let Some(wd) = x16.wide {
                let mut e = vec![0u8; k / ty.block_size() as usize * wd.block_bytes];
                let ns = time(200, || (wd.expand)(black_box(&g), black_box(&mut e)));
                println!("{isa} {ty} k={k} {:>22}: {ns:>9.0} ns", "expand");
                let ns = time(200, || {
                    for t in (0..nt).step_by(4) {
                        (wd.four)(
                            black_box(&e),
                            std::array::from_fn(|i| rows[t + i]),
                            std::array::from_fn(|i| facts[t + i]),
                            &mut out,
                        );
                    }
                    black_box(&out);
                });
                report("wide (expanded)", ns);
            }
        }
    }
}

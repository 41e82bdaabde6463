//! Wall time of a fixed set of realistic dispatches (Qwen2.5-0.5B shapes) on the emulator.
//!
//! `cargo run --release -p minfer-msl-emu --example emu_bench [-- FILTER] [--reps N]`; the
//! worker count comes from `MINFER_EMU_THREADS` (default: every core). Each case prints its
//! mean wall time and an FNV hash of its output bytes, which must not change with the worker
//! count (nor with a change to the runtime that keeps the reduction order).

use std::time::Instant;

use minfer_gguf::quants::random_blocks;
use minfer_gguf::GgmlType;
use minfer_metal::launch::{self, AttnShape, KvType};
use minfer_metal::Device;
use minfer_msl_emu::{EmuDevice, Schedule};

type Buf = <EmuDevice as Device>::Buffer;

fn floats(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5).to_le_bytes()
        })
        .collect()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

struct Case {
    name: &'static str,
    run: Box<dyn Fn(&EmuDevice) -> Buf>,
    out_len: usize,
}

fn matmul_case(
    name: &'static str,
    tier: launch::MatmulTier,
    ty: GgmlType,
    k: usize,
    n: usize,
    nt: usize,
) -> Case {
    let w = random_blocks(ty, n * k / ty.block_size() as usize, 7);
    let x = floats(k * nt, 3);
    Case {
        name,
        out_len: n * nt * 4,
        run: Box::new(move |dev| {
            let wb = dev.buffer_from(&w).unwrap();
            let xb = dev.buffer_from(&x).unwrap();
            let out = dev.new_buffer(n * nt * 4).unwrap();
            launch::launch_matmul_tier(dev, tier, ty, &wb, 0, &xb, &out, k, n, nt).unwrap();
            dev.submit().unwrap();
            out
        }),
    }
}

fn attn_case(name: &'static str, n_tokens: usize, n_ctx: usize, kv_type: KvType) -> Case {
    let s = AttnShape {
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
        n_tokens,
        n_ctx,
        kv: kv_type,
    };
    let q = floats(n_tokens * 14 * 64, 11);
    let (kv, vv) = if kv_type == KvType::Q8_0 {
        // rows of 128 elements: 4 blocks each
        (
            random_blocks(GgmlType::Q8_0, n_ctx * 4, 12),
            random_blocks(GgmlType::Q8_0, n_ctx * 4, 13),
        )
    } else {
        (floats(n_ctx * 2 * 64, 12), floats(n_ctx * 2 * 64, 13))
    };
    let pos: Vec<u8> = (0..n_tokens)
        .flat_map(|t| ((n_ctx - n_tokens + t) as i32).to_le_bytes())
        .collect();
    Case {
        name,
        out_len: n_tokens * 14 * 64 * 4,
        run: Box::new(move |dev| {
            let qb = dev.buffer_from(&q).unwrap();
            let kb = dev.buffer_from(&kv).unwrap();
            let vb = dev.buffer_from(&vv).unwrap();
            let pb = dev.buffer_from(&pos).unwrap();
            let out = dev.new_buffer(n_tokens * 14 * 64 * 4).unwrap();
            if kv_type == KvType::Q8_0 {
                launch::launch_attn_classic(dev, &s, &qb, &kb, &vb, &pb, &out).unwrap();
            } else if n_tokens == 1 {
                let scratch = dev
                    .new_buffer(launch::flash_decode_scratch_bytes(&s))
                    .unwrap();
                launch::launch_flash_decode(dev, &s, &qb, &kb, &vb, &pb, &scratch, &out).unwrap();
            } else {
                let scratch = dev
                    .new_buffer(launch::flash_prefill_scratch_bytes(&s))
                    .unwrap();
                launch::launch_flash_prefill(dev, &s, &qb, &kb, &vb, &pb, &scratch, &out).unwrap();
            }
            dev.submit().unwrap();
            out
        }),
    }
}

fn norm_case(name: &'static str, ncols: usize, nrows: usize) -> Case {
    let x = floats(ncols * nrows, 21);
    let w = floats(ncols, 22);
    Case {
        name,
        out_len: ncols * nrows * 4,
        run: Box::new(move |dev| {
            let xb = dev.buffer_from(&x).unwrap();
            let wb = dev.buffer_from(&w).unwrap();
            let out = dev.new_buffer(ncols * nrows * 4).unwrap();
            launch::launch_rms_norm(dev, &xb, &wb, &out, ncols, nrows, 1e-6).unwrap();
            dev.submit().unwrap();
            out
        }),
    }
}

/// Per-dispatch overhead: 100 small adds (896 f32, the hidden size) in one submit.
fn small_case(name: &'static str) -> Case {
    let a = floats(896, 31);
    let b = floats(896, 32);
    Case {
        name,
        out_len: 896 * 4,
        run: Box::new(move |dev| {
            let ab = dev.buffer_from(&a).unwrap();
            let bb = dev.buffer_from(&b).unwrap();
            let out = dev.new_buffer(896 * 4).unwrap();
            launch::launch_add(dev, &ab, &bb, &out, 896).unwrap();
            for _ in 0..99 {
                launch::launch_add(dev, &out, &bb, &out, 896).unwrap();
            }
            dev.submit().unwrap();
            out
        }),
    }
}

fn main() {
    use launch::MatmulTier::{Gemm, Multi, Mv};
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 3usize;
    let mut filter = None;
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--reps" {
            reps = args[i + 1].parse().expect("--reps N");
            i += 1;
        } else if !args[i].starts_with("--") {
            filter = Some(args[i].clone());
        }
        i += 1;
    }
    // built lazily: a filtered-out case costs nothing (its random weights included)
    type Make = Box<dyn Fn() -> Case>;
    let cases: Vec<(&str, Make)> = vec![
        (
            "mv q8_0 896->4864",
            Box::new(|| matmul_case("mv q8_0 896->4864", Mv, GgmlType::Q8_0, 896, 4864, 1)),
        ),
        (
            "mv q4_k 4864->896",
            Box::new(|| matmul_case("mv q4_k 4864->896", Mv, GgmlType::Q4K, 4864, 896, 1)),
        ),
        (
            "mv q6_k 4864->896",
            Box::new(|| matmul_case("mv q6_k 4864->896", Mv, GgmlType::Q6K, 4864, 896, 1)),
        ),
        (
            "multi q8_0 896->4864 x4",
            Box::new(|| {
                matmul_case(
                    "multi q8_0 896->4864 x4",
                    Multi,
                    GgmlType::Q8_0,
                    896,
                    4864,
                    4,
                )
            }),
        ),
        (
            "gemm q4_k 4864->896 x32",
            Box::new(|| {
                matmul_case(
                    "gemm q4_k 4864->896 x32",
                    Gemm,
                    GgmlType::Q4K,
                    4864,
                    896,
                    32,
                )
            }),
        ),
        (
            "gemm q8_0 896->4864 x32",
            Box::new(|| {
                matmul_case(
                    "gemm q8_0 896->4864 x32",
                    Gemm,
                    GgmlType::Q8_0,
                    896,
                    4864,
                    32,
                )
            }),
        ),
        (
            "rms_norm 896 x64",
            Box::new(|| norm_case("rms_norm 896 x64", 896, 64)),
        ),
        (
            "flash decode ctx 512",
            Box::new(|| attn_case("flash decode ctx 512", 1, 512, KvType::F32)),
        ),
        (
            "flash prefill 64 tok",
            Box::new(|| attn_case("flash prefill 64 tok", 64, 64, KvType::F32)),
        ),
        (
            "classic q8_0 decode ctx 512",
            Box::new(|| attn_case("classic q8_0 decode ctx 512", 1, 512, KvType::Q8_0)),
        ),
        (
            "classic q8_0 prefill 64 tok",
            Box::new(|| attn_case("classic q8_0 prefill 64 tok", 64, 64, KvType::Q8_0)),
        ),
        ("100 x add 896", Box::new(|| small_case("100 x add 896"))),
    ];
    let dev = EmuDevice::new(Schedule::Forward);
    println!("workers: {}", dev.workers());
    let mut total = 0.0;
    for (name, make) in &cases {
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let c = make();
        let out = (c.run)(&dev); // warm-up (maps stacks, starts workers)
        let mut bytes = vec![0u8; c.out_len];
        dev.read_bytes(&out, 0, &mut bytes).unwrap();
        let t = Instant::now();
        for _ in 0..reps {
            (c.run)(&dev);
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
        total += ms;
        println!("{:<28} {:>9.1} ms  hash {:016x}", c.name, ms, fnv(&bytes));
    }
    println!("{:<28} {:>9.1} ms", "total", total);
}

//! Gate: the threaded matmul kernel gives, for every thread count, exactly the bits of a plain
//! single-loop computation written here from the definitions (the scalar reference dot of
//! `minfer_gguf::quants` per (row, token)). Splitting rows across the pool and tiling tokens
//! must not change a single result bit. (Attention is a tolerance gate since the flash kernel:
//! `tests/attn_flash.rs`, which also asserts its results are the same for every thread count.)
//!
//! Controls (tried while writing the pool): a task range off by one row
//! (`rows = task * 16 + 1..`) fails `matmul_is_exact_for_every_thread_count` (the first row of
//! every task is left unwritten); the 4-token Q5_0 kernel (AVX2) combining its lanes as
//! (0 + 1) + (2 + 3) instead of the reference's (0 + 2) + (1 + 3) fails the matmul test (Q5_0,
//! 19 tokens runs it).

use minfer_cpu::ops::matmul::{matmul, Weight};
use minfer_gguf::quants::{self, random_blocks, vec_dot_type};
use minfer_gguf::GgmlType;

/// splitmix64 floats in [-1, 1).
fn floats(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn matmul_is_exact_for_every_thread_count() {
    // m = 200 is not a multiple of the 16-row task; nt = 19 is not a multiple of the tile.
    let (k, m) = (512, 200);
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::Q5_0] {
        let wrb = ty.row_bytes(k as u64).unwrap() as usize;
        let bs = ty.block_size() as usize;
        let wbytes = random_blocks(ty, m * k / bs, 7);
        assert_eq!(wbytes.len(), wrb * m);
        for nt in [1usize, 3, 19] {
            let x = floats(nt * k, 11 + nt as u64);
            // Reference: quantize each token row, then the scalar dot per (row, token).
            let at = vec_dot_type(ty);
            let arb = at.row_bytes(k as u64).unwrap() as usize;
            let mut want = vec![0f32; nt * m];
            for t in 0..nt {
                let mut a = vec![0u8; arb];
                quants::quantize_row(at, &x[t * k..(t + 1) * k], &mut a).unwrap();
                for o in 0..m {
                    want[t * m + o] =
                        quants::vec_dot(ty, k, &wbytes[o * wrb..(o + 1) * wrb], &a).unwrap();
                }
            }
            let w = Weight {
                ty,
                k,
                m,
                bytes: &wbytes,
            };
            for threads in [1, 2, 3, 8] {
                let mut got = vec![f32::NAN; nt * m];
                matmul(&w, &x, None, &mut got, threads).unwrap();
                assert_eq!(bits(&got), bits(&want), "{ty} nt={nt} threads={threads}");
            }
        }
    }
}

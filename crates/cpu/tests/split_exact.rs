//! Gate: the threaded matmul kernel and the llama.cpp-arithmetic attention of an F16 cache
//! (fewer than 64 tokens) give, for every thread count, exactly the bits of a plain single-loop
//! computation written here from the definitions (the scalar reference dot of
//! `minfer_gguf::quants` per (row, token); the scalar `attn_f16::attend_head_ref` per
//! (token, head)). Splitting rows or heads across the pool and tiling tokens must not change a
//! single result bit. (The flash kernel, used for every other cache type and batch, is a
//! tolerance gate: `tests/attn_flash.rs`, which also asserts its results are the same for
//! every thread count.)
//!
//! Controls (tried while writing the pool): a task range off by one row
//! (`rows = task * 16 + 1..`) fails `matmul_is_exact_for_every_thread_count` (the first row of
//! every task is left unwritten); an attention task writing its head one slot over
//! (`task * hd + 1`, `hd - 1` long) fails `attention_is_exact_for_every_thread_count`; the
//! 4-token Q5_0 kernel (AVX2) combining its lanes as (0 + 1) + (2 + 3) instead of the
//! reference's (0 + 2) + (1 + 3) fails the matmul test (Q5_0, 19 tokens runs it); decode's
//! larger tasks counted as `m / rows_per_task` (the partial last task dropped) fail it too.
//!
//! The 8-token tile kernels (`simd/x86/avx2_tiles.rs`, full tiles of the 19-token case), each
//! control made `matmul_is_exact_for_every_thread_count` fail: lanes combined as
//! (0 + 1) + (2 + 3) (Q4_K at k = 1280: k = 512 has only 2 super-blocks, where both orders
//! agree); Q6_K's offset removed as 16 · bsum instead of 32 · bsum; Q4_K's mins paired with
//! the wrong block sums (`mn[i % 8]`); Q5_0's offset as 8 · Σa instead of 16 · Σa; Q4_1's
//! min term scaled by 1 + ε; Q8_0 weights clamped to -127 before `abs` (the -128 weights
//! planted below); Q5_0's kernel on interleaved activations pairing each 4 activations with
//! the weights of the neighbouring group (`q5[g ^ 1]`).
//!
//! Decode's Q5_0 side kernel (`dot_q5_0_side`, nt = 1 and 3, activation block facts from the
//! matmul's side table): removing the offset as 8 · Σa instead of 16 · Σa fails the matmul test,
//! and so does swapping the two halves of its i16 fold (`hadd_epi32(h23, h01)`). Its
//! several-rows-per-call form (`dot_q5_0_side_rows`) skipping its first row, and its
//! broadcast-loaded nibbles shifted in the wrong half (`srlv` by (0, 0, 4, 4)), each fail it.
//!
//! The AVX-512 VNNI tile kernels (`simd/x86/avx512_tiles.rs`: Q5_0, Q8_0, Q4_K, Q6_K) run in
//! the matmul test on AVX-512 VNNI machines, and `tile_kernels_are_exact_on_every_isa` calls
//! every instruction set's tile kernels directly (so an AVX-512 machine checks its AVX2 tiles
//! too), over one block range and over uneven ones (odd starts, across the 32-block chunks).
//! Each control made both tests fail (2026-12-01, AMD EPYC with AVX-512 VNNI): Q8_0's bias
//! taken back as 64 · Σa instead of 128 · Σa; Q8_0 weights clamped to -127 before the bias
//! (the planted -128 weights); the interleaved groups paired with the neighbouring group's
//! weights (Q5_0 and Q8_0: `group(g ^ 1)` in the first, 256-bit form, the two groups of a
//! 512-bit pair swapped in the permute in the final one); Q5_0's float part reassociated as
//! d_w · (d_a · s); Q4_K's nibble mask shifting the low half (`0x0000_ffff`); Q4_K's mins
//! not doubled per 32-element sub-block; Q6_K's scales spread to the neighbouring sub-block
//! (`(s + i / 8) ^ 1`), and its sub-block scales of a chunk swapped (ymm form); Q6_K's
//! second chunk of a pair read 32 bytes off.
//!
//! The AVX-512 Q4_K tile on Q8_K activations interleaved by 8 (`simd/x86/avx512_q4k_tile.rs`,
//! 2026-12-06): each control made both tests fail: every sub-block's partial sums scaled by
//! the neighbouring sub-block's scale (`sc >> 8 · (s ^ 1)`); the mins of a pair of sub-blocks
//! swapped against the pair facts of `TileSide::fill` (`hi | lo << 16`); in the `packs` form,
//! the scale vector of a pair of sub-blocks swapped (`2j + 1 - (i % 8) / 4`); its two-tile
//! kernel (`tile2_q4_k`) reading the first tile's activations for the second tile too.
//!
//! Decode's AVX-512 Q4_K side kernel (`simd/x86/avx512_q4k_side.rs`, 4 rows per group, nt = 1
//! and 3; m = 43 leaves tasks with rows past the last group): each control made the matmul
//! test fail (2026-12-06): the scales spread as the other pairing of sub-blocks
//! (`first + (lane >= 2) + 2 · (pos >= 4)`); the activation re-laid out in element order
//! (`[0, 32, 64, 96]`) instead of the nibble vectors' order; the rows past the last group
//! left at 0.
//!
//! The two-tile kernels (`simd/x86/avx512_tile_pairs.rs`: Q5_0, Q8_0; Q4_K's in
//! `avx512_q4k_tile.rs`) run in the matmul test
//! (nt = 12: a full tile and a padded one; nt = 19) and are called directly by
//! `tile_kernels_are_exact_on_every_isa`; control: Q8_0's second tile taking back its bias
//! with the first tile's block sums made both tests fail (2026-12-01). The matmul's decode
//! batches (long tasks walked 16 rows at a time, side-kernel rows in chunks: the (k, 264)
//! shapes; a last tile of 4 or more tokens padded with zero rows: nt = 5, 12) run in
//! `matmul_is_exact_for_every_thread_count`.

use minfer_cpu::llamacpp_x86::attn_f16;
use minfer_cpu::ops::attn::{self, AttnParams};
use minfer_cpu::ops::matmul::packed::pack_x16;
use minfer_cpu::ops::matmul::{matmul, Layout, Weight};
use minfer_cpu::simd::{self, finish_tile, Isa, TileAcc, TileSide, TILE};
use minfer_gguf::quants::{self, random_blocks, vec_dot_type};
use minfer_gguf::GgmlType;
use minfer_testkit::exact::{assert_bits_eq, bits};
use minfer_testkit::reference;
use minfer_testkit::rng::floats;

#[test]
fn matmul_is_exact_for_every_thread_count() {
    // m = 200 is not a multiple of the 16-row task; nt = 19 is not a multiple of the tile (8
    // tokens): 2 full tiles through the tile kernels, 3 tokens per row. m = 1000: decode
    // (nt = 1, 3) splits it into a few large tasks per thread (64 rows for 2 threads, 48 for
    // 3), the last one partial. k = 1280 gives the 256-element types 5 super-blocks, so all 4
    // block lanes and a second round of lane 0.
    let types = [
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
    ];
    for (k, m, ty) in types.into_iter().flat_map(|ty| {
        // Odd shapes: rows whose blocks the tile kernels walk in several ranges, starting at
        // odd blocks (45 blocks per range of Q8_0 activations, 5 of Q8_K ones), beyond the
        // 32-block chunks of the Q5_0 kernel's first pass; m not a multiple of 16.
        let odd = if ty.block_size() == 256 {
            (2304, 24, ty)
        } else {
            (4864, 24, ty)
        };
        // (k, 264): long rows in tasks of 32 rows or more, which a decode batch's side
        // kernel walks in chunks of fewer rows, every token per chunk.
        let chunked = (odd.0, 264, ty);
        [
            (512, 200, ty),
            // 43 rows: tasks whose rows are not whole groups of a side kernel's 4.
            (1280, 43, ty),
            (512, 1000, ty),
            odd,
            chunked,
        ]
    }) {
        let wrb = ty.row_bytes(k as u64).unwrap() as usize;
        // Weights from a file may hold -128 (Q8_0), which the tile kernels must take exactly.
        let wbytes = weights(ty, k, m, 7);
        assert_eq!(wbytes.len(), wrb * m);
        // nt = 5 and 12: a last tile padded with zero rows (at least 4 tokens in it).
        for nt in [1usize, 3, 5, 8, 12, 19] {
            let x = floats(nt * k, 11 + nt as u64);
            // Reference: quantize each token row, then the scalar dot per (row, token).
            let want = reference::matmul(ty, k, m, &wbytes, &x);
            let w = Weight {
                ty,
                k,
                m,
                bytes: &wbytes,
                layout: Default::default(),
            };
            for threads in [1, 2, 3, 8] {
                let mut got = vec![f32::NAN; nt * m];
                matmul(&w, &x, None, &mut got, threads).unwrap();
                assert_bits_eq(
                    &got,
                    &want,
                    format_args!("{ty} k={k} nt={nt} threads={threads}"),
                );
            }
        }
    }
}

#[test]
fn legacy_float_orders_hold_on_large_block_sums() {
    // Random weights and activations give block sums of a few hundred, where s · d_w and
    // d_w · d_a (f16 scales: 11-bit mantissas) are exact in f32, so the reference's order of
    // the two float multiplies cannot be told from another. Here every weight is at its
    // largest quant and the activations between 64 and 127 (|s| up to 32 · 127 · 127), with
    // random 11-bit scale mantissas: the orders differ, and the tile (nt = 8, 16) and side (nt = 1, 3)
    // kernels must keep the reference's. Control: Q4_0's tile and side kernels computing
    // (d_w · d_a) · s (Q5_0's order) instead of (s · d_w) · d_a passed every other gate here
    // and failed this one.
    let (k, m) = (1024, 48);
    // The largest positive quant (7, 15, 127: no power of two, so s keeps many significant
    // bits) against activations of 64..127 (several bits each).
    for (ty, block, fill) in [
        (GgmlType::Q4_0, 18, 0xffu8),
        (GgmlType::Q5_0, 22, 0xff),
        (GgmlType::Q8_0, 34, 0x7f),
    ] {
        let mut r = minfer_testkit::rng::Rng::splitmix64(17);
        let mut wbytes = vec![0u8; m * k / 32 * block];
        for blk in wbytes.chunks_exact_mut(block) {
            let d = 0.001 + 0.05 * (r.signed().abs());
            blk[..2].copy_from_slice(&quants::f32_to_f16(d).to_le_bytes());
            blk[2..].fill(fill);
        }
        for nt in [1usize, 3, 8, 16] {
            let x: Vec<f32> = (0..nt * k)
                .map(|i| (0.5 + 0.5 * ((i * 7919 % 997) as f32 / 997.0)) * (1 + i / k) as f32)
                .collect();
            // Their activation type is Q8_0.
            let want = reference::matmul(ty, k, m, &wbytes, &x);
            // Plain rows, and rows packed 16 at a time where this machine packs them.
            let packed = Layout::packed_for(ty)
                .filter(|_| simd::x16_kernel(ty).is_some())
                .map(|l| (l, pack_x16(l, &wbytes, k, m).unwrap()));
            let mut layouts = vec![(Layout::Rows, &wbytes[..])];
            layouts.extend(packed.as_ref().map(|(l, b)| (*l, &b[..])));
            for (layout, bytes) in layouts {
                let w = Weight {
                    ty,
                    k,
                    m,
                    bytes,
                    layout,
                };
                let mut got = vec![f32::NAN; nt * m];
                matmul(&w, &x, None, &mut got, 2).unwrap();
                assert_bits_eq(&got, &want, format_args!("{ty} {layout:?} nt={nt}"));
            }
        }
    }
}

#[test]
fn packed_matmul_is_exact_for_every_thread_count() {
    // Rows packed 16 at a time (`Layout::Q4kX16` and the others: what the backend makes on
    // AVX-512 VNNI and AVX2 machines, for the instruction set in use; `MINFER_CPU_ISA=avx2`
    // runs AVX2's, and `tests/packed_exact.rs` runs both in one `cargo test`): every token
    // count through the packed kernels, rows past the last group as plain rows; every
    // (row, token) against the scalar reference dot of the plain rows.
    for ty in [
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
    ] {
        let layout = Layout::packed_for(ty).unwrap();
        let Some(_) = simd::x16_kernel(ty) else {
            // Without the kernel a packed weight is refused, never computed another way.
            let plain = weights(ty, 256, 16, 3);
            let packed = pack_x16(layout, &plain, 256, 16).unwrap();
            let w = Weight {
                ty,
                k: 256,
                m: 16,
                bytes: &packed,
                layout,
            };
            let mut out = vec![0f32; 16];
            assert!(matmul(&w, &floats(256, 1), None, &mut out, 1).is_err());
            eprintln!("SKIP: no packed {ty} kernel on this instruction set (refusal checked)");
            continue;
        };
        // 43 rows: 2 groups and 11 plain rows; 264 rows of 2304: decode batches walk long
        // tasks in chunks; 16: one group; k = 1280: 5 super-blocks, every block lane and lane
        // 0 again.
        for (k, m) in [(1280, 43), (512, 200), (2304, 264), (1280, 16)] {
            let plain = weights(ty, k, m, 5);
            let packed = pack_x16(layout, &plain, k, m).unwrap();
            for nt in [1usize, 2, 3, 5, 8, 12, 19] {
                let x = floats(nt * k, 31 + nt as u64);
                let want = reference::matmul(ty, k, m, &plain, &x);
                let w = Weight {
                    ty,
                    k,
                    m,
                    bytes: &packed,
                    layout,
                };
                for threads in [1, 2, 3, 8] {
                    let mut got = vec![f32::NAN; nt * m];
                    matmul(&w, &x, None, &mut got, threads).unwrap();
                    assert_bits_eq(
                        &got,
                        &want,
                        format_args!("{ty} k={k} m={m} nt={nt} threads={threads}"),
                    );
                }
                // Control: the packed bytes read as plain rows give other results, so the
                // comparison above really ran on the packed layout.
                let as_rows = Weight {
                    layout: Layout::Rows,
                    ..w
                };
                let mut got = vec![f32::NAN; nt * m];
                matmul(&as_rows, &x, None, &mut got, 1).unwrap();
                assert!(bits(&got[..16]) != bits(&want[..16]));
            }
        }
    }
}

/// Weight rows of `ty` for `m` rows of `k`, with -128 planted in Q8_0 weights (legal in a
/// file; the AVX2 Q8_0 tile moves its sign, the AVX-512 one biases it).
fn weights(ty: GgmlType, k: usize, m: usize, seed: u64) -> Vec<u8> {
    let mut wbytes = random_blocks(ty, m * k / ty.block_size() as usize, seed);
    if ty == GgmlType::Q8_0 {
        for blk in wbytes.chunks_exact_mut(34).step_by(3) {
            blk[2] = 0x80;
            blk[20] = 0x80;
        }
    }
    wbytes
}

#[test]
fn tile_kernels_are_exact_on_every_isa() {
    // Every tile kernel of every instruction set this machine runs (the AVX2 tiles and, on
    // AVX-512 VNNI machines, the AVX-512 ones), called directly on 2 tiles of 8 tokens, each
    // row's blocks walked in one range and in uneven ranges (odd starts, ranges crossing the
    // 32-block chunks of the Q5_0 first pass), against the scalar reference dot.
    let types = [
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
    ];
    let (mut checked, mut pairs) = (0, 0);
    for isa in simd::available() {
        for ty in types {
            let ks: &[usize] = if ty.block_size() == 256 {
                &[256, 1280, 2304]
            } else {
                &[32, 96, 1440, 2400]
            };
            for &k in ks {
                let dot = simd::RowDot::on(isa, ty).unwrap();
                let wrb = ty.row_bytes(k as u64).unwrap() as usize;
                let at = vec_dot_type(ty);
                let arb = at.row_bytes(k as u64).unwrap() as usize;
                let Some(f) = dot.tile_for(k, wrb, arb) else {
                    continue;
                };
                let served = dot.tile_served_by().unwrap();
                if isa == Isa::Avx512Vnni && matches!(ty, GgmlType::Q4_1) {
                    assert_eq!(served, Isa::Avx2, "{ty}: no AVX-512 tile");
                } else {
                    assert_eq!(served, isa, "{ty} on {isa}");
                }
                let (m, nt) = (5, 2 * TILE);
                let wbytes = weights(ty, k, m, 21 + k as u64);
                let x = floats(nt * k, 31 + k as u64);
                let mut act = vec![0u8; nt * arb];
                for (xr, ar) in x.chunks_exact(k).zip(act.chunks_exact_mut(arb)) {
                    quants::quantize_row(at, xr, ar).unwrap();
                }
                let mut side = TileSide::default();
                assert!(side.reset(at, arb, nt));
                for (tile, mut s) in side.tiles_mut().enumerate() {
                    let rows = &act[tile * TILE * arb..(tile + 1) * TILE * arb];
                    assert!(TileSide::fill(at, rows, arb, &mut s));
                }
                let blocks = k / ty.block_size() as usize;
                let cuts = [0, 1, 7, 33, 34, 45].map(|c: usize| c.min(blocks));
                for tile in 0..nt / TILE {
                    let acts = &act[tile * TILE * arb..(tile + 1) * TILE * arb];
                    for o in 0..m {
                        let wr = &wbytes[o * wrb..(o + 1) * wrb];
                        let want: Vec<f32> = (0..TILE)
                            .map(|t| {
                                let a = &acts[t * arb..(t + 1) * arb];
                                quants::vec_dot(ty, k, wr, a).unwrap()
                            })
                            .collect();
                        // One range, then the cuts (the last range to the end).
                        let mut whole = TileAcc::default();
                        f(wr, acts, arb, side.tile(tile), 0..blocks, &mut whole);
                        let mut parts = TileAcc::default();
                        let mut starts: Vec<usize> = cuts.to_vec();
                        starts.push(blocks);
                        starts.dedup();
                        for r in starts.windows(2) {
                            f(wr, acts, arb, side.tile(tile), r[0]..r[1], &mut parts);
                        }
                        for (what, state) in [("one range", whole), ("ranges", parts)] {
                            let got = finish_tile(&state);
                            assert!(
                                bits(&got) == bits(&want),
                                "{isa} ({served} tile) {ty} k={k} row {o} tile {tile} ({what}): \
                                 got {got:?}, reference {want:?}"
                            );
                        }
                        checked += 1;
                    }
                }
                // The two-tile kernel (AVX-512 VNNI: Q5_0, Q8_0): both tiles in one call,
                // one range and the cuts, each tile against the reference.
                let Some(pair) = dot.tile_pair_for(k, wrb, arb) else {
                    continue;
                };
                let acts = [&act[..TILE * arb], &act[TILE * arb..2 * TILE * arb]];
                let sides = [side.tile(0), side.tile(1)];
                for o in 0..m {
                    let wr = &wbytes[o * wrb..(o + 1) * wrb];
                    let mut whole = [TileAcc::default(); 2];
                    pair(wr, acts, arb, sides, 0..blocks, &mut whole);
                    let mut parts = [TileAcc::default(); 2];
                    let mut starts: Vec<usize> = cuts.to_vec();
                    starts.push(blocks);
                    starts.dedup();
                    for r in starts.windows(2) {
                        pair(wr, acts, arb, sides, r[0]..r[1], &mut parts);
                    }
                    for tile in 0..2 {
                        let want: Vec<f32> = (0..TILE)
                            .map(|t| {
                                let a = &acts[tile][t * arb..(t + 1) * arb];
                                quants::vec_dot(ty, k, wr, a).unwrap()
                            })
                            .collect();
                        for (what, state) in [("one range", whole), ("ranges", parts)] {
                            let got = finish_tile(&state[tile]);
                            assert!(
                                bits(&got) == bits(&want),
                                "{isa} {ty} two-tile kernel k={k} row {o} tile {tile} ({what}): \
                                 got {got:?}, reference {want:?}"
                            );
                        }
                    }
                    pairs += 1;
                }
            }
        }
    }
    assert!(checked > 0 || !simd::available().contains(&Isa::Avx2));
    if simd::available().contains(&Isa::Avx512Vnni) {
        assert!(
            pairs > 0,
            "no two-tile kernel ran on an AVX-512 VNNI machine"
        );
    }
}

#[test]
fn f16_attention_is_exact_for_every_thread_count() {
    let (n_head, n_head_kv, hd, n_ctx, nt) = (6, 2, 64, 40, 5);
    let n_embd_kv = n_head_kv * hd;
    {
        let cache_type = GgmlType::F16;
        let cb = attn::cell_bytes(cache_type, n_embd_kv).unwrap();
        let kx = floats(n_ctx * n_embd_kv, 3);
        let vx = floats(n_ctx * n_embd_kv, 4);
        let cells: Vec<f32> = (0..n_ctx as u32).map(f32::from_bits).collect();
        let mut kb = vec![0u8; n_ctx * cb];
        let mut vb = vec![0u8; n_ctx * cb];
        attn::kv_store(cache_type, &kx, n_embd_kv, &cells, &mut kb).unwrap();
        attn::kv_store(cache_type, &vx, n_embd_kv, &cells, &mut vb).unwrap();
        // The kernel gets the regions as the backend holds them: f32 buffers (aligned).
        let kreg = to_f32_words(&kb);
        let vreg = to_f32_words(&vb);
        let q = floats(nt * n_head * hd, 5);
        // Token t sees cells [t, 30 + t); one token sees none.
        let mut span = Vec::new();
        for t in 0..nt as i32 {
            let (lo, hi) = if t == 2 { (7, 7) } else { (t, 30 + t) };
            span.push(f32::from_bits(lo as u32));
            span.push(f32::from_bits(hi as u32));
        }
        // Reference: dequantized heads from the stored bytes.
        let head = |reg: &[u8], c: usize, kvh: usize| -> Vec<f32> {
            let hb = attn::cell_bytes(cache_type, hd).unwrap();
            let off = c * cb + kvh * hb;
            let mut v = vec![0f32; hd];
            quants::dequantize_row(cache_type, &reg[off..off + hb], &mut v).unwrap();
            v
        };
        let scale = 0.125;
        let mut want = Vec::new();
        for t in 0..nt {
            let (lo, hi) = (
                span[2 * t].to_bits() as usize,
                span[2 * t + 1].to_bits() as usize,
            );
            for h in 0..n_head {
                let kvh = h / (n_head / n_head_kv);
                let keys: Vec<_> = (lo..hi).map(|c| head(&kb, c, kvh)).collect();
                let vals: Vec<_> = (lo..hi).map(|c| head(&vb, c, kvh)).collect();
                let qh = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
                {
                    // llama.cpp's flash-attention arithmetic (its own gate: tests/attn_f16.rs).
                    assert!(nt < attn_f16::GGML_FA_TILE_Q);
                    let f16 = |v: &Vec<f32>| v.iter().map(|&x| quants::f32_to_f16(x)).collect();
                    let k16: Vec<Vec<u16>> = keys.iter().map(f16).collect();
                    let v16: Vec<Vec<u16>> = vals.iter().map(f16).collect();
                    let mut o = vec![0f32; hd];
                    let n = hi - lo;
                    attn_f16::attend_head_ref(qh, scale, 0..n, |c| &k16[c], |c| &v16[c], &mut o);
                    want.extend(o);
                }
            }
        }
        let p = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale,
            cache_type,
            llamacpp: None,
        };
        for threads in [1, 2, 3, 8] {
            let mut got = vec![f32::NAN; nt * n_head * hd];
            let (kr, vr) = (f32_bytes(&kreg), f32_bytes(&vreg));
            attn::attention(
                &p,
                &q,
                &span,
                &kr[..kb.len()],
                &vr[..vb.len()],
                &mut got,
                threads,
            )
            .unwrap();
            assert_eq!(bits(&got), bits(&want), "{cache_type} threads={threads}");
        }
    }
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn to_f32_words(b: &[u8]) -> Vec<f32> {
    let mut padded = b.to_vec();
    padded.resize(b.len().div_ceil(4) * 4, 0);
    padded
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

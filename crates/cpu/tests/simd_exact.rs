//! Gate: every SIMD kernel of `minfer_cpu::simd` is bit-identical (`f32::to_bits`, raw bytes)
//! to the scalar reference in `minfer_gguf::quants` (`quantize_act_row` for activations), on
//! every instruction set this machine has.
//!
//! Controls (mutations tried while writing the kernels; each made these tests fail):
//! - Q4_K kernel with the float part reassociated, `(f16(d) * (ad * isum)) - ...`:
//!   both dot tests failed (Q4_K and Q5_K share that code).
//! - Q8_0 kernel skipping the last block (`chunks_exact` over `w.len() - 34`): both dot
//!   tests and the tail control below failed.
//! - Q8_0 weights through the sign trick instead of the widening dot: the adversarial test
//!   (`-128` bytes) failed; Q8_0 activation rounding with round-half-even instead of
//!   half-away: `quantize_act_is_byte_identical` failed (already on the random rows). Since
//!   activations follow llama.cpp's x86 rule (half-even, multiplier 127 / max), the reference
//!   rounding half away again (`.round()` in `quant_8bit_act`) fails it (avx2 Q8_0, the ties
//!   row). The multiplier 1 / d instead of 127 / max is NOT caught: the two differ by an ulp
//!   at most and flip a quant only next to a rounding midpoint, which these rows never hit.
//! - AVX-512 (run on a Sapphire Rapids host, `scripts/avx512-remote-check`): Q8_0 kernel's
//!   float part as (s * d_w) * d_a and Q6_K's as d_w * (d_a * isum): the random, 4-row,
//!   adversarial and tail-control tests failed (20, 11, 1 mismatches), and so did
//!   `simd_models.rs` (Q6_K rows) and `split_exact.rs` (Q6_K matmul). Q8_K activation rounding
//!   half-away instead of half-even passed the rows then tested (random data has no exact
//!   ties); the Q8_K ties row was added for it and fails that mutation (checked on AVX2 here;
//!   not yet re-run on AVX-512).
//! - The Q8_0 side kernel (`dot_q8_0_side`, sign trick with a fallback for activations that
//!   hold -128) without its fallback: the adversarial test failed (its side check); its
//!   blocks summed in the order 0, 2, 1, 3: `split_exact.rs` failed.
//! - The AVX-512 Q4_K side kernel (`avx512_q4k_side.rs`, called here with one row and with 5,
//!   a group of 4 and one more) adding its sub-block pairs of stored block sums in i16
//!   (wrapping) instead of i32: the adversarial test failed (its side check, 2026-12-06).
//! - NEON dot-product (`Isa::NeonDotprod`, under `qemu-aarch64-static -cpu max`): `sdot` with
//!   the activations' lane 0 broadcast (`{a:v}.4b[0]`) instead of the whole vector: the random,
//!   adversarial and tail-control tests failed (306 and 52 mismatches, all `neon-dotprod`).
//!
//! The tests below also check, on every run, that the comparison can fail at all: a dropped
//! tail block and a different block order (one running sum) both change the bits.

use minfer_cpu::simd::{self, Isa};
use minfer_gguf::quants::{self, random_blocks, vec_dot_type};
use minfer_gguf::GgmlType;
use minfer_testkit::rng::Rng;

/// The types the AVX2 table must serve (everything but Q8_1, which is not a weight type).
const AVX2_DOT_TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Iq4Nl,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::Iq4Xs,
];
const ACT_TYPES: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K];
/// The types with AVX-512 kernels of their own: every quantized type the demo models use
/// (Q4_K, Q5_0, Q6_K, Q8_0; Q4_1 for SmolLM2) and their close relatives. The rest of the
/// AVX2 list runs the AVX2 kernels on AVX-512 machines.
const AVX512_DOT_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Iq4Nl,
    GgmlType::Q4K,
    GgmlType::Q6K,
];
/// The types with a 4-activation-row AVX-512 kernel (prefill).
const AVX512_DOT4_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Iq4Nl,
];

/// Activations from the kit's splitmix64.
trait Floats {
    fn floats(&mut self, n: usize) -> Vec<f32>;
}

impl Floats for Rng {
    fn floats(&mut self, n: usize) -> Vec<f32> {
        // Vary the magnitude per 32 elements so blocks get different scales.
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let scale = [0.01f32, 1.0, 3.7, 250.0][(i / 32 + (self.next_u64() as usize & 1)) % 4];
            // Uniform in [-scale, scale).
            out.push(self.signed() * scale);
        }
        out
    }
}

/// Element counts to test for a type: 1 block up to several thousand elements, including
/// counts that leave tails for 8-block and 16-element unrolls.
fn lengths(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size() as usize;
    let blocks: &[usize] = match bs {
        1 => &[1, 2, 7, 8, 15, 16, 17, 31, 33, 100, 1000, 4096, 4099],
        32 => &[1, 2, 3, 5, 8, 9, 31, 64, 128, 130],
        _ => &[1, 2, 3, 5, 16, 17],
    };
    blocks.iter().map(|b| b * bs).collect()
}

fn act_bytes(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let at = vec_dot_type(ty);
    let mut act = vec![0u8; at.row_bytes(x.len() as u64).unwrap() as usize];
    quants::quantize_act_row(at, x, &mut act).unwrap();
    act
}

/// The SIMD instruction sets this machine has (the scalar one is the reference itself).
fn simd_isas() -> Vec<Isa> {
    let isas: Vec<Isa> = simd::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect();
    if isas.is_empty() {
        println!("SKIP: no SIMD instruction set on this machine");
    }
    isas
}

/// The difference between `vec_dot_on(isa, ..)` and the reference, if any, in words.
fn dot_mismatch(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    act: &[u8],
    what: &str,
) -> Option<String> {
    let want = quants::vec_dot(ty, n, w, act).unwrap();
    let got = simd::vec_dot_on(isa, ty, n, w, act).unwrap();
    (got.to_bits() != want.to_bits())
        .then(|| format!("{isa} {ty} n={n} ({what}): got {got:e}, reference {want:e}"))
}

/// The activation row's block facts as the side kernels read them (`simd::RowSideFn`),
/// computed here from the encoded bytes: Q8_0 (d as f32; Σ q), Q8_1 (d then s as f32; none),
/// Q8_K (d; none).
fn side_facts(at: GgmlType, act: &[u8]) -> (Vec<f32>, Vec<i32>) {
    let f16 = |b: &[u8], o: usize| quants::f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]));
    match at {
        GgmlType::Q8_0 => (
            act.chunks_exact(34).map(|b| f16(b, 0)).collect(),
            act.chunks_exact(34)
                .map(|b| b[2..34].iter().map(|&v| v as i8 as i32).sum())
                .collect(),
        ),
        GgmlType::Q8_1 => {
            let d = act.chunks_exact(36).map(|b| f16(b, 0));
            (
                d.chain(act.chunks_exact(36).map(|b| f16(b, 2))).collect(),
                vec![],
            )
        }
        GgmlType::Q8K => (
            act.chunks_exact(292)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            vec![],
        ),
        _ => (vec![], vec![]),
    }
}

/// The difference between the side kernel (activation block facts from [`side_facts`]) of
/// `ty` on `isa`, where one exists, and the reference, if any, in words: the row alone, and
/// [`SIDE_ROWS`] copies of it in one call (kernels that take rows in groups run a whole group
/// and the rows past it).
fn side_mismatch(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    act: &[u8],
    what: &str,
) -> Option<String> {
    let dot = simd::RowDot::on(isa, ty).unwrap();
    let f = dot.side_for(n, w.len(), act.len())?;
    let (d, sums) = side_facts(vec_dot_type(ty), act);
    let want = quants::vec_dot(ty, n, w, act).unwrap();
    let mut out = [f32::NAN];
    f(w, act, &d, &sums, &mut out);
    let mut outs = [f32::NAN; SIDE_ROWS];
    f(&w.repeat(SIDE_ROWS), act, &d, &sums, &mut outs);
    let bad = std::iter::once(&out[0])
        .chain(&outs)
        .find(|g| g.to_bits() != want.to_bits())?;
    Some(format!(
        "{isa} {ty} n={n} ({what}, side): got {bad:e}, reference {want:e}"
    ))
}

/// Rows per call in [`side_mismatch`]'s second call: a group of 4 and one more.
const SIDE_ROWS: usize = 5;

/// Fails listing every mismatch (the first few), so one run on a borrowed machine names all
/// failing kernels at once.
fn assert_none(mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "{} mismatches, first ones:\n{}",
        mismatches.len(),
        mismatches
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn avx2_serves_every_listed_type() {
    if !Isa::Avx2.is_available() {
        println!("SKIP: no AVX2+F16C on this machine");
        return;
    }
    for ty in AVX2_DOT_TYPES {
        assert_eq!(Isa::Avx2.dot_served_by(ty), Isa::Avx2, "{ty}");
    }
    for ty in ACT_TYPES {
        assert_eq!(Isa::Avx2.quant_served_by(ty), Isa::Avx2, "{ty}");
    }
    let best = if Isa::Avx512Vnni.is_available() {
        Isa::Avx512Vnni
    } else {
        Isa::Avx2
    };
    assert_eq!(simd::detected(), best);
    assert_side_kernels(Isa::Avx2);
}

/// The side kernels (decode) exist for Q4_1, Q5_0 and Q8_0 on `isa` (and Q4_K and Q4_0 on
/// AVX-512 VNNI) and for no other type, so the side half of the bit-identity tests runs for
/// each of them there.
fn assert_side_kernels(isa: Isa) {
    for ty in GgmlType::SUPPORTED {
        let want = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0)
            || (isa == Isa::Avx512Vnni && matches!(ty, GgmlType::Q4K | GgmlType::Q4_0));
        let n = 2 * ty.block_size() as usize;
        let side = simd::RowDot::on(isa, ty).ok().and_then(|d| {
            let act = vec_dot_type(ty).row_bytes(n as u64).unwrap() as usize;
            d.side_for(n, 2 * ty.type_size() as usize, act)
        });
        assert_eq!(side.is_some(), want, "{isa} {ty}");
    }
}

/// AVX-512 serves its own list, hands the rest of the AVX2 list to AVX2, and is chosen at run
/// time where present.
#[test]
fn avx512_serves_every_listed_type() {
    if !Isa::Avx512Vnni.is_available() {
        println!("SKIP: no AVX-512 F/BW/VL/VNNI on this machine");
        return;
    }
    for ty in AVX2_DOT_TYPES {
        let want = if AVX512_DOT_TYPES.contains(&ty) {
            Isa::Avx512Vnni
        } else {
            Isa::Avx2
        };
        assert_eq!(Isa::Avx512Vnni.dot_served_by(ty), want, "{ty}");
        let n = ty.block_size() as usize;
        assert_eq!(simd::RowDot::on(Isa::Avx512Vnni, ty).unwrap().isa(), want);
        let four = simd::RowDot::on(Isa::Avx512Vnni, ty).unwrap().kernel4_for(
            n,
            ty.type_size() as usize,
            vec_dot_type(ty).row_bytes(n as u64).unwrap() as usize,
        );
        assert_eq!(four.is_some(), AVX512_DOT4_TYPES.contains(&ty), "{ty}");
    }
    for ty in ACT_TYPES {
        assert_eq!(Isa::Avx512Vnni.quant_served_by(ty), Isa::Avx512Vnni, "{ty}");
    }
    assert_eq!(simd::detected(), Isa::Avx512Vnni);
    // Side kernels (decode): AVX-512's own for Q4_1, Q8_0, Q4_K and Q4_0, AVX2's for Q5_0.
    assert_side_kernels(Isa::Avx512Vnni);
}

/// NEON serves the AVX2 list but F16 (Rust's f16 vector conversions are not stable yet).
#[test]
fn neon_serves_every_listed_type() {
    if !Isa::Neon.is_available() {
        println!("SKIP: no NEON on this machine");
        return;
    }
    for ty in AVX2_DOT_TYPES {
        let want = if ty == GgmlType::F16 {
            Isa::Scalar
        } else {
            Isa::Neon
        };
        assert_eq!(Isa::Neon.dot_served_by(ty), want, "{ty}");
    }
    for ty in ACT_TYPES {
        assert_eq!(Isa::Neon.quant_served_by(ty), Isa::Neon, "{ty}");
    }
    let best = if Isa::NeonDotprod.is_available() {
        Isa::NeonDotprod
    } else {
        Isa::Neon
    };
    assert_eq!(simd::detected(), best);
}

/// NEON + dot-product serves NEON's integer types itself; float rows and quantizers run NEON's.
#[test]
fn neon_dotprod_serves_the_integer_types() {
    if !Isa::NeonDotprod.is_available() {
        println!("SKIP: no NEON dot-product extension on this machine");
        return;
    }
    for ty in AVX2_DOT_TYPES {
        let want = match ty {
            GgmlType::F16 => Isa::Scalar,
            GgmlType::F32 | GgmlType::Bf16 => Isa::Neon,
            _ => Isa::NeonDotprod,
        };
        assert_eq!(Isa::NeonDotprod.dot_served_by(ty), want, "{ty}");
    }
    for ty in ACT_TYPES {
        assert_eq!(Isa::NeonDotprod.quant_served_by(ty), Isa::Neon, "{ty}");
    }
    assert_eq!(simd::detected(), Isa::NeonDotprod);
}

/// Reference-quantized activations, random weights, every type and length.
#[test]
fn dot_is_bit_identical_to_the_reference() {
    let mut cases = 0;
    let mut bad = Vec::new();
    for isa in simd_isas() {
        for ty in GgmlType::SUPPORTED {
            for n in lengths(ty) {
                for seed in 0..3u64 {
                    let nb = n / ty.block_size() as usize;
                    let w = random_blocks(ty, nb, 1000 * seed + n as u64);
                    let x = Rng::splitmix64(seed * 7919 + n as u64).floats(n);
                    let act = act_bytes(ty, &x);
                    bad.extend(dot_mismatch(isa, ty, n, &w, &act, "random"));
                    bad.extend(side_mismatch(isa, ty, n, &w, &act, "random"));
                    cases += 1;
                }
            }
        }
    }
    assert_none(&bad);
    println!("{cases} dot cases bit-identical on {:?}", simd_isas());
}

/// The 4-activation-row kernels (prefill): each of the 4 results bit-identical to the
/// reference, on every type and instruction set that has one.
#[test]
fn dot4_is_bit_identical_to_the_reference() {
    let mut cases = 0;
    let mut bad = Vec::new();
    for isa in simd_isas() {
        for ty in GgmlType::SUPPORTED {
            let dot = simd::RowDot::on(isa, ty).unwrap();
            let at = vec_dot_type(ty);
            for n in lengths(ty) {
                let (wl, al) = (
                    ty.row_bytes(n as u64).unwrap() as usize,
                    at.row_bytes(n as u64).unwrap() as usize,
                );
                let Some(f4) = dot.kernel4_for(n, wl, al) else {
                    continue;
                };
                let w = random_blocks(ty, n / ty.block_size() as usize, 31 + n as u64);
                let acts: Vec<Vec<u8>> = (0..4u64)
                    .map(|r| act_bytes(ty, &Rng::splitmix64(r * 131 + n as u64).floats(n)))
                    .collect();
                let got = f4(&w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
                for (r, (g, act)) in got.iter().zip(&acts).enumerate() {
                    let want = quants::vec_dot(ty, n, &w, act).unwrap();
                    if g.to_bits() != want.to_bits() {
                        bad.push(format!(
                            "{isa} {ty} n={n} row {r} of 4: got {g:e}, reference {want:e}"
                        ));
                    }
                }
                cases += 1;
            }
        }
    }
    assert_none(&bad);
    println!("{cases} 4-row dot cases bit-identical");
}

/// Integer extremes the quantizers never produce: every quant byte random (so 8-bit quants
/// include -128 on both sides) and Q8_K block sums that do not match their quants. The kernels
/// promise exact integer sums for any bytes, so the result must still match bit for bit.
#[test]
fn dot_is_bit_identical_on_adversarial_bytes() {
    let mut rng = Rng::splitmix64(42);
    let mut cases = 0;
    let mut bad = Vec::new();
    for isa in simd_isas() {
        for ty in GgmlType::SUPPORTED {
            if ty.block_size() == 1 {
                continue; // float rows: random bytes would be NaN/inf patterns
            }
            for n in lengths(ty).into_iter().take(4) {
                let nb = n / ty.block_size() as usize;
                let mut w = random_blocks(ty, nb, 5 + n as u64);
                let at = vec_dot_type(ty);
                let mut act = random_blocks(at, n / at.block_size() as usize, 9 + n as u64);
                scramble_quants(ty, &mut w, &mut rng);
                scramble_quants(at, &mut act, &mut rng);
                bad.extend(dot_mismatch(isa, ty, n, &w, &act, "adversarial"));
                bad.extend(side_mismatch(isa, ty, n, &w, &act, "adversarial"));
                let dot = simd::RowDot::on(isa, ty).unwrap();
                if let Some(f4) = dot.kernel4_for(n, w.len(), act.len()) {
                    let want = quants::vec_dot(ty, n, &w, &act).unwrap();
                    for g in f4(&w, [&act, &act, &act, &act]) {
                        if g.to_bits() != want.to_bits() {
                            bad.push(format!(
                                "{isa} {ty} n={n} (adversarial, 4-row): {g:e} vs {want:e}"
                            ));
                        }
                    }
                }
                cases += 1;
            }
        }
    }
    assert_none(&bad);
    println!("{cases} adversarial dot cases bit-identical");
}

/// Overwrites the 8-bit quants (and Q8_K's block sums) of Q8_0/Q8_1/Q8_K blocks with random
/// bytes; the other types' quant bits are random already.
fn scramble_quants(ty: GgmlType, b: &mut [u8], rng: &mut Rng) {
    let (ts, range) = match ty {
        GgmlType::Q8_0 => (34, 2..34),
        GgmlType::Q8_1 => (36, 4..36),
        GgmlType::Q8K => (292, 4..292),
        _ => return,
    };
    for blk in b.chunks_exact_mut(ts) {
        for v in &mut blk[range.clone()] {
            *v = rng.next_u64() as u8;
        }
        blk[range.start] = 0x80; // at least one -128 per block
    }
}

/// Activation quantization: random rows plus hand-made edge blocks.
#[test]
fn quantize_act_is_byte_identical() {
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let mut rng = Rng::splitmix64(3);
    for n in [256usize, 512, 4096] {
        rows.push(rng.floats(n));
    }
    // Ties: amax = 127 gives d = 1 for Q8_0 and iscale = -1 for Q8_K (both half-even).
    let mut ties = vec![0.0f32; 256];
    for (i, v) in ties.iter_mut().enumerate() {
        *v = (i as f32 - 128.0) + 0.5;
    }
    for blk in ties.chunks_exact_mut(32) {
        blk[7] = -127.0;
    }
    rows.push(ties);
    let mut edge = vec![0.0f32; 256];
    edge[0] = -0.0; // all-zero first block (sign of zero kept in the reference)
    edge[32..64].fill(f32::NAN);
    edge[40] = 1.0;
    edge[64] = f32::INFINITY;
    edge[70] = -3.0;
    edge[96] = 1e-40; // subnormal block
    edge[97] = -1e-40;
    edge[128] = -5.0; // -amax before +amax: first one wins
    edge[129] = 5.0;
    edge[160..192].fill(2.5);
    rows.push(edge);
    // Q8_K ties: -127 first and largest gives iscale = 1 exactly, so every x.5 below is a tie
    // (half-even: 0.5 -> 0, 1.5 -> 2, -2.5 -> -2; half-away would round them all outwards).
    let mut k_ties: Vec<f32> = (0..256).map(|i| (i % 200) as f32 - 100.0 + 0.5).collect();
    k_ties[0] = -127.0;
    rows.push(k_ties);
    let mut cases = 0;
    let mut bad = Vec::new();
    for isa in simd_isas() {
        for ty in ACT_TYPES {
            for x in &rows {
                let len = ty.row_bytes(x.len() as u64).unwrap() as usize;
                let mut want = vec![0u8; len];
                let mut got = vec![0x55u8; len];
                quants::quantize_act_row(ty, x, &mut want).unwrap();
                simd::quantize_act_on(isa, ty, x, &mut got).unwrap();
                if let Some(first) = want.iter().zip(&got).position(|(a, b)| a != b) {
                    bad.push(format!(
                        "{isa} {ty} n={}: first differing byte {first}",
                        x.len()
                    ));
                }
                cases += 1;
            }
        }
    }
    assert_none(&bad);
    println!("{cases} quantization cases byte-identical");
}

/// Controls: the bit comparison is sensitive enough to see a dropped tail block and a
/// different block order (so agreement above is not an accident of coarse comparison). The
/// other order is one running sum over blocks, what a kernel ignoring the reference's four
/// block lanes would compute; over 8 rows it must differ at least once per type.
#[test]
fn controls_dropped_tail_and_reordered_blocks_change_bits() {
    let isa = simd::detected();
    for ty in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q4_1] {
        let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
        let at = vec_dot_type(ty);
        let ats = at.type_size() as usize;
        let nb = 17;
        let mut order_differs = 0;
        for seed in 0..8u64 {
            let w = random_blocks(ty, nb, 77 + seed);
            let act = act_bytes(ty, &Rng::splitmix64(78 + seed).floats(nb * bs));
            let full = simd::vec_dot_on(isa, ty, nb * bs, &w, &act).unwrap();
            let forward = quants::vec_dot(ty, nb * bs, &w, &act).unwrap();
            assert_eq!(full.to_bits(), forward.to_bits(), "{ty}");
            let short = (nb - 1) * bs;
            let dropped = quants::vec_dot(ty, short, &w[..(nb - 1) * ts], &act[..(nb - 1) * ats]);
            assert_ne!(full.to_bits(), dropped.unwrap().to_bits(), "{ty}: tail");
            let running = (0..nb)
                .map(|b| {
                    let (wb, ab) = (&w[b * ts..][..ts], &act[b * ats..][..ats]);
                    quants::vec_dot(ty, bs, wb, ab).unwrap()
                })
                .fold(0.0f32, |s, v| s + v);
            order_differs += usize::from(full.to_bits() != running.to_bits());
        }
        assert!(
            order_differs > 0,
            "{ty}: block order never changed the bits"
        );
        println!("{ty}: a running sum differs on {order_differs} of 8 rows");
    }
}

#[test]
fn errors_are_the_references_and_missing_isas_are_refused() {
    let err = simd::vec_dot(GgmlType::Q4K, 256, &[0; 144], &[0; 291]).unwrap_err();
    assert!(err.to_string().contains("292 bytes"), "{err}");
    let err = simd::vec_dot(GgmlType::Iq2Xxs, 256, &[0; 66], &[0; 292]).unwrap_err();
    assert!(err.to_string().contains("IQ2_XXS"), "{err}");
    // A type with no quantizer (Q4_K gained one for `minfer quantize`).
    let err = simd::quantize_act(GgmlType::Iq2Xxs, &[0.0; 256], &mut [0; 66]).unwrap_err();
    assert!(err.to_string().contains("IQ2_XXS"), "{err}");
    let err = simd::quantize_act(GgmlType::Q8_0, &[0.0; 31], &mut [0; 34]).unwrap_err();
    assert!(err.to_string().contains("31 elements"), "{err}");
    // The hoisted kernel checks lengths like the reference, on every instruction set.
    for isa in simd::available() {
        let dot = simd::RowDot::on(isa, GgmlType::Q4K).unwrap();
        let err = dot.dot(256, &[0; 144], &[0; 291]).unwrap_err();
        assert!(err.to_string().contains("292 bytes"), "{isa}: {err}");
        let err = dot.dot(255, &[0; 144], &[0; 292]).unwrap_err();
        assert!(err.to_string().contains("255 elements"), "{isa}: {err}");
        assert_eq!(dot.dot(0, &[], &[]).unwrap(), 0.0);
    }
    for isa in Isa::ALL {
        if !isa.is_available() {
            let err = simd::vec_dot_on(isa, GgmlType::Q8_0, 32, &[0; 34], &[0; 34]).unwrap_err();
            assert!(err.to_string().contains(isa.name()), "{err}");
        }
    }
}

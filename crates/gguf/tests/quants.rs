//! Gates for `minfer_gguf::quants` against gguf-py fixtures (scripts/make-quant-fixtures.py)
//! and, for the dot products, against an f64 dot of gguf-py-exact dequantizations.

use std::path::PathBuf;

use minfer_gguf::quants::{
    dequantize_row, f16_to_f32, quantize_row, random_blocks, vec_dot, vec_dot_type,
};
use minfer_gguf::GgmlType;
use minfer_testkit::rng::Rng;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quants")
}

fn read(rel: &str) -> Vec<u8> {
    let p = fixture_dir().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with scripts/make-quant-fixtures.py)",
            p.display()
        )
    })
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// FNV-1a 64 over bytes (the fixture script computes the same).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Entry {
    kind: String,
    ty: GgmlType,
    fields: Vec<(String, String)>,
}

impl Entry {
    fn get(&self, k: &str) -> &str {
        &self.fields.iter().find(|(key, _)| key == k).unwrap().1
    }
    fn num(&self, k: &str) -> usize {
        self.get(k).parse().unwrap()
    }
    fn hash(&self) -> u64 {
        u64::from_str_radix(self.get("fnv1a64"), 16).unwrap()
    }
}

fn manifest() -> Vec<Entry> {
    String::from_utf8(read("MANIFEST"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut parts = l.split_whitespace();
            let kind = parts.next().unwrap().to_string();
            let ty = GgmlType::from_name(parts.next().unwrap()).unwrap();
            let fields = parts
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_string(), v.to_string())
                })
                .collect();
            Entry { kind, ty, fields }
        })
        .collect()
}

fn dequant_all(ty: GgmlType, blocks: &[u8]) -> Vec<f32> {
    let (bs, ts) = ty.block_geometry();
    let mut out = vec![0.0f32; blocks.len() / ts as usize * bs as usize];
    dequantize_row(ty, blocks, &mut out).unwrap();
    out
}

/// First element whose bits differ, as (index, got, expected).
fn first_bit_mismatch(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
        .map(|i| (i, got[i], want[i]))
}

/// Gate: dequantization is bit-identical to gguf-py for every fixture type (1000 random blocks
/// each, 32768 values for F16/BF16). Controls: `dequant_gate_catches_*` below.
#[test]
fn dequantize_is_bit_identical_to_gguf_py() {
    let entries: Vec<Entry> = manifest()
        .into_iter()
        .filter(|e| e.kind == "dequant")
        .collect();
    assert_eq!(entries.len(), 14, "fixture types");
    for e in &entries {
        let name = e.ty.name();
        let blocks = read(&format!("dequant/{name}.blocks"));
        let bs = e.ty.block_size() as usize;
        assert_eq!(blocks.len(), e.num("blocks") * e.ty.type_size() as usize);
        let got = dequant_all(e.ty, &blocks);
        let head = f32s(&read(&format!("dequant/{name}.f32")));
        assert_eq!(head.len(), e.num("head_blocks") * bs);
        if let Some((i, g, w)) = first_bit_mismatch(&got, &head) {
            panic!(
                "{name}: block {} element {}: got {g:e} ({:#010x}), gguf-py {w:e} ({:#010x})",
                i / bs,
                i % bs,
                g.to_bits(),
                w.to_bits()
            );
        }
        assert_eq!(
            fnv1a64(&f32_bytes(&got)),
            e.hash(),
            "{name}: the first {} blocks match but a later one differs",
            e.num("head_blocks")
        );
    }
}

/// Control for the dequantization gate: arithmetic precision. In f32 every product here is
/// exact (an f16 mantissa times a few-bit integer) and only the final add/subtract rounds, so
/// the f32 orderings agree; what the gate must catch is lower precision, e.g. Q4_1's d*q + m
/// computed in f16 as a half2 GPU kernel would.
#[test]
fn dequant_gate_catches_half_precision_arithmetic() {
    use minfer_gguf::quants::f32_to_f16;
    let half = |v: f32| f16_to_f32(f32_to_f16(v));
    let blocks = read("dequant/Q4_1.blocks");
    let want = f32s(&read("dequant/Q4_1.f32"));
    let mut got = Vec::with_capacity(want.len());
    for b in blocks.chunks_exact(20) {
        let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let m = f16_to_f32(u16::from_le_bytes([b[2], b[3]]));
        for e in 0..32 {
            let byte = b[4 + e % 16];
            let q = if e < 16 { byte & 15 } else { byte >> 4 };
            got.push(half(half(d * q as f32) + m));
        }
    }
    assert!(first_bit_mismatch(&got, &want).is_some());
}

/// Control: Q4_K with the two nibbles of every quant byte swapped must not match gguf-py.
#[test]
fn dequant_gate_catches_a_flipped_nibble_order() {
    let mut blocks = read("dequant/Q4_K.blocks");
    let want = f32s(&read("dequant/Q4_K.f32"));
    for b in blocks.chunks_exact_mut(144) {
        for v in &mut b[16..] {
            *v = v.rotate_left(4);
        }
    }
    let got = dequant_all(GgmlType::Q4K, &blocks);
    assert!(first_bit_mismatch(&got[..want.len()], &want).is_some());
}

fn quant_input(ty: GgmlType) -> Vec<f32> {
    let mut x = f32s(&read("quant/input.f32"));
    if matches!(ty, GgmlType::F16 | GgmlType::Bf16) {
        x.extend(f32s(&read("quant/special.f32")));
    }
    x
}

/// Gate: quantization from f32 is byte-identical to gguf-py for every type gguf-py quantizes
/// (inputs include all-zero and all -0.0 blocks, one huge value, negative max, ± ties for the
/// max, rounding ties, constant blocks, tiny values; F16/BF16 also overflow, subnormals, ties).
#[test]
fn quantize_is_byte_identical_to_gguf_py() {
    let entries: Vec<Entry> = manifest()
        .into_iter()
        .filter(|e| e.kind == "quant")
        .collect();
    assert_eq!(entries.len(), 7, "fixture types");
    for e in &entries {
        let name = e.ty.name();
        let x = quant_input(e.ty);
        let want = read(&format!("quant/{name}.blocks"));
        assert_eq!(want.len(), e.num("bytes"));
        let mut got = vec![0u8; want.len()];
        quantize_row(e.ty, &x, &mut got).unwrap();
        let ts = e.ty.type_size() as usize;
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            let blk = i / ts;
            panic!(
                "{name}: block {blk} (input {:?}...) byte {}: got {:02x?}, gguf-py {:02x?}",
                &x[blk * e.ty.block_size() as usize..]
                    .iter()
                    .take(4)
                    .collect::<Vec<_>>(),
                i % ts,
                &got[blk * ts..][..ts],
                &want[blk * ts..][..ts]
            );
        }
        assert_eq!(fnv1a64(&got), e.hash(), "{name}");
    }
}

/// Control for the quantization gate: Q8_0 with round-half-to-even instead of gguf-py's
/// round-half-away-from-zero differs on the fixture's rounding-tie row.
#[test]
fn quant_gate_catches_ties_to_even() {
    let x = quant_input(GgmlType::Q8_0);
    let want = read("quant/Q8_0.blocks");
    let mut mismatch = false;
    for (xb, wb) in x.chunks_exact(32).zip(want.chunks_exact(34)) {
        let d = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        for (v, &w) in xb.iter().zip(&wb[2..]) {
            mismatch |= (v * id).round_ties_even() as i8 != w as i8;
        }
    }
    assert!(mismatch);
}

// ---- dot products ----

/// Named before measuring. Against an f64 dot of dequantize(w) and dequantize(act), vec_dot
/// differs by f32 rounding only: the per-block integer sums are exact, then each block
/// rounds a few times (d_w*d_a, times the sum, minus the min term) and the blocks add in f32,
/// so the error is below (n_blocks + 8) * eps_f32 * S, where S = Σ|w_i * a_i|. We allow 4x
/// that, because the intermediate terms (d*q and the min term of Q4_1/Q5_1/K-quants) can each
/// exceed |w_i|. Q8_1 adds one more cause: its `s` is d*sum(q) rounded to f16 (relative 2^-11,
/// absolute 2^-25 when subnormal), multiplied by the weight block's min m.
fn dot_tolerance(ty: GgmlType, w: &[u8], wd: &[f32], ad: &[f32], act: &[u8]) -> f64 {
    let n_blocks = w.len() / ty.type_size() as usize;
    let s: f64 = wd
        .iter()
        .zip(ad)
        .map(|(&w, &a)| (w as f64 * a as f64).abs())
        .sum();
    let mut tol = 4.0 * (n_blocks as f64 + 8.0) * f32::EPSILON as f64 * s;
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        let ts = ty.type_size() as usize;
        for (wb, ab) in w.chunks_exact(ts).zip(act.chunks_exact(36)) {
            let m = f16_to_f32(u16::from_le_bytes([wb[2], wb[3]])) as f64;
            let s = f16_to_f32(u16::from_le_bytes([ab[2], ab[3]])) as f64;
            tol += m.abs() * (s.abs() * 2f64.powi(-10) + 2f64.powi(-24));
        }
    }
    tol
}

/// Deterministic activations in [-1, 1).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::xorshift64(seed);
    (0..n).map(|_| rng.signed()).collect()
}

struct DotCase {
    ty: GgmlType,
    w: Vec<u8>,
    wd: Vec<f32>,
}

impl DotCase {
    fn new(ty: GgmlType, n: usize, seed: u64) -> DotCase {
        let n_blocks = n / ty.block_size() as usize;
        let w = random_blocks(ty, n_blocks, seed);
        let wd = dequant_all(ty, &w);
        DotCase { ty, w, wd }
    }

    fn encode(&self, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let at = vec_dot_type(self.ty);
        let mut act = vec![0u8; at.row_bytes(x.len() as u64).unwrap() as usize];
        quantize_row(at, x, &mut act).unwrap();
        let ad = dequant_all(at, &act);
        (act, ad)
    }

    /// (|vec_dot(w', act') - reference(w, x)|, tolerance) with optional mutated inputs.
    fn error(&self, w: &[u8], x_act: &[f32], x_ref: &[f32]) -> (f64, f64) {
        let n = self.wd.len();
        let (act, _) = self.encode(x_act);
        let (act_ref, ad_ref) = self.encode(x_ref);
        let got = vec_dot(self.ty, n, w, &act).unwrap() as f64;
        let want: f64 = self
            .wd
            .iter()
            .zip(&ad_ref)
            .map(|(&w, &a)| w as f64 * a as f64)
            .sum();
        let tol = dot_tolerance(self.ty, &self.w, &self.wd, &ad_ref, &act_ref);
        ((got - want).abs(), tol)
    }
}

const DOT_N: usize = 2048;
const DOT_ROWS: u64 = 16;

/// Gate: vec_dot within the named tolerance of the f64 reference, every supported type.
#[test]
fn vec_dot_matches_f64_dot_of_dequantized_rows() {
    let mut report = Vec::new();
    for ty in GgmlType::SUPPORTED {
        let mut worst = 0.0f64;
        for row in 0..DOT_ROWS {
            let case = DotCase::new(ty, DOT_N, 100 + row);
            let x = activations(DOT_N, 7 + row);
            let (err, tol) = case.error(&case.w, &x, &x);
            assert!(
                err <= tol,
                "{ty} row {row}: |error| {err:e} > tolerance {tol:e}"
            );
            worst = worst.max(err / tol);
        }
        report.push(format!("{ty}: worst error/tolerance {worst:.3}"));
    }
    println!("{}", report.join("\n"));
}

/// Control: activations paired with the wrong elements (the two 16-element halves of every
/// 32-element group swapped, the classic interleaving bug) must fail the gate for every type.
#[test]
fn vec_dot_gate_catches_swapped_halves() {
    for ty in GgmlType::SUPPORTED {
        let case = DotCase::new(ty, DOT_N, 3);
        let x = activations(DOT_N, 5);
        let mut swapped = x.clone();
        for g in swapped.chunks_exact_mut(32) {
            let (a, b) = g.split_at_mut(16);
            a.swap_with_slice(b);
        }
        let (err, tol) = case.error(&case.w, &swapped, &x);
        assert!(err > tol, "{ty}: mutation not caught ({err:e} <= {tol:e})");
    }
}

/// Control: a dot that reads the nibbles in the wrong order (simulated by swapping the nibbles
/// of every quant byte of the weights) must fail the gate.
#[test]
fn vec_dot_gate_catches_flipped_nibbles() {
    // (type, byte range of the packed nibbles inside a block)
    let nibble_types = [
        (GgmlType::Q4_0, 2..18),
        (GgmlType::Q4_1, 4..20),
        (GgmlType::Q5_0, 6..22),
        (GgmlType::Q5_1, 8..24),
        (GgmlType::Q4K, 16..144),
        (GgmlType::Q5K, 48..176),
        (GgmlType::Iq4Nl, 2..18),
        (GgmlType::Iq4Xs, 8..136),
    ];
    for (ty, range) in nibble_types {
        let case = DotCase::new(ty, DOT_N, 11);
        let x = activations(DOT_N, 13);
        let mut w = case.w.clone();
        for b in w.chunks_exact_mut(ty.type_size() as usize) {
            for v in &mut b[range.clone()] {
                *v = v.rotate_left(4);
            }
        }
        let (err, tol) = case.error(&w, &x, &x);
        assert!(err > tol, "{ty}: mutation not caught ({err:e} <= {tol:e})");
    }
}

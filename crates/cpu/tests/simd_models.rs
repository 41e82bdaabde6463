//! Gate on real weights: rows of every tensor of the cached demo models, dotted with
//! reference-quantized activations, must be bit-identical between every SIMD instruction set
//! and the scalar reference. Real files hold what random blocks may not (zero or subnormal
//! scales, -128 quants, extreme sub-block scales). Prints SKIP when the models are absent.
//!
//! Control: with the Q4_K kernel's float part reassociated (see simd_exact.rs), this test
//! failed (first on blk.11.ffn_down.weight of the demo model).

use minfer_cpu::simd::{self, Isa, RowDot};
use minfer_gguf::quants::{self, vec_dot_type};
use minfer_gguf::GgufModel;
use minfer_testkit::models;
use minfer_testkit::rng::Rng;

/// Deterministic activations in about [-2, 2).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::xorshift64(seed);
    (0..n).map(|_| 2.0 * rng.signed()).collect()
}

#[test]
fn real_model_rows_are_bit_identical() {
    let isas: Vec<Isa> = simd::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect();
    if isas.is_empty() {
        println!("SKIP: no SIMD instruction set on this machine");
        return;
    }
    let mut checked = 0;
    // Every mismatch is collected, so one run on a borrowed machine names all failing rows.
    let mut bad: Vec<String> = Vec::new();
    for name in [models::QWEN, models::SMOL] {
        let Some(path) = models::find(name) else {
            continue;
        };
        let model = GgufModel::open(&path).unwrap();
        for t in model.tensors() {
            let (info, data) = model.tensor_data(&t.info.name).unwrap();
            let (n, rows) = info.rows();
            let (n, rows) = (n as usize, rows as usize);
            let row_bytes = info.ty.row_bytes(n as u64).unwrap() as usize;
            let at = vec_dot_type(info.ty);
            let x = activations(n, rows as u64);
            let mut act = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
            quants::quantize_row(at, &x, &mut act).unwrap();
            // First, middle and last rows, plus a few in between.
            let picks = [0, 1, rows / 3, rows / 2, rows.saturating_sub(1)];
            for &r in picks.iter().filter(|&&r| r < rows) {
                let w = &data[r * row_bytes..][..row_bytes];
                let want = quants::vec_dot(info.ty, n, w, &act).unwrap();
                for &isa in &isas {
                    let got = RowDot::on(isa, info.ty).unwrap().dot(n, w, &act).unwrap();
                    if got.to_bits() != want.to_bits() {
                        bad.push(format!(
                            "{name} {} ({}) row {r} on {isa}: got {got:e}, reference {want:e}",
                            info.name, info.ty
                        ));
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {checked} rows differ, first ones:\n{}",
        bad.len(),
        bad.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
    println!("{checked} real rows bit-identical");
}

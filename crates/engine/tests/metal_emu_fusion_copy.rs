//! The fusion gate with every weight copied to the device (`MINFER_WEIGHT_COPY=1`): each
//! weight is then its own buffer, so every concatenation takes the copy path (the mapped
//! synthetic models lay q|k|v and gate|up back to back, so `metal_emu_fusion.rs` takes the
//! in-place path). Fused and unfused decode still give the same bits. One test per binary:
//! the variable is set before any backend exists and nothing else runs concurrently.

#![cfg(feature = "metal-emu")]

mod fusion_common;

use minfer_gguf::GgmlType;
use minfer_models::Arch;

#[test]
fn fused_and_unfused_decode_give_the_same_bits_with_copied_weights() {
    std::env::set_var("MINFER_WEIGHT_COPY", "1");
    let cases: Vec<_> = Arch::ALL
        .into_iter()
        .map(|a| (a, GgmlType::Q8_0, GgmlType::F32))
        .collect();
    fusion_common::fused_equals_unfused(&cases);
}

//! Every kernel gate of `minfer_metal::conformance` on the emulator, under the three
//! schedules (forward, reverse, seeded random): each must pass its reference check, and the
//! output bytes must be identical across schedules (a schedule-dependent result is a race).

use minfer_metal::conformance::{gate, gates};
use minfer_msl_emu::{EmuDevice, Schedule};

fn check(name: &str) {
    let f = gate::<EmuDevice>(name).unwrap_or_else(|| panic!("no gate named {name}"));
    let mut first: Option<Vec<u8>> = None;
    for s in Schedule::GATE_SET {
        let dev = EmuDevice::new(s);
        let o = f(&dev).unwrap_or_else(|msg| panic!("{name} under {s:?}: {msg}"));
        println!(
            "{name} {s:?}: max err {:.3e} (tolerance {:.1e})",
            o.max_err, o.tolerance
        );
        match &first {
            None => first = Some(o.output),
            Some(f0) => assert!(
                *f0 == o.output,
                "{name}: output under {s:?} differs from the forward schedule"
            ),
        }
    }
}

macro_rules! gate_tests {
    ($($name:ident),* $(,)?) => {
        $( #[test] fn $name() { check(stringify!($name)); } )*
        const LISTED: &[&str] = &[$(stringify!($name)),*];
    };
}

#[test]
fn every_gate_has_a_test() {
    let all: Vec<String> = gates::<EmuDevice>().into_iter().map(|(n, _)| n).collect();
    for n in &all {
        assert!(LISTED.contains(&n.as_str()), "gate {n} has no test here");
    }
    assert_eq!(all.len(), LISTED.len());
}

gate_tests!(
    add_is_exact,
    mul_is_exact,
    swiglu_matches_reference,
    rms_norm_matches_reference,
    rms_norm_256_matches_reference,
    qk_norm_matches_reference,
    rope_non_interleaved_matches_reference,
    rope_interleaved_matches_reference,
    rope_partial_rotation_copies_the_rest,
    store_kv_f32_is_exact,
    store_kv_f16_is_round_to_nearest_even,
    store_kv_q8_0_is_byte_identical_to_the_cpu_quantizer,
    store_kv_refuses_a_cell_past_the_region,
    copy_rows_moves_overlapping_rows_both_ways,
    attn_classic_f32_hd80_matches_reference,
    attn_classic_q8_0_kv_matches_reference,
    attn_classic_f16_hd64_matches_reference,
    flash_decode_f32_hd64_matches_reference,
    flash_decode_f32_hd128_matches_reference,
    flash_decode_f16_hd64_matches_reference,
    flash_decode_f16_hd128_matches_reference,
    flash_decode_matches_classic,
    flash_prefill_f32_hd64_matches_reference,
    flash_prefill_f32_hd128_matches_reference,
    flash_prefill_f16_hd64_matches_reference,
    flash_prefill_f16_hd128_matches_reference,
    flash_prefill_matches_the_reference_at_every_kv_tail,
    flash_prefill_tail_overlap_bug_is_caught,
    attention_refuses_a_position_past_the_region,
    rope_freq_scale_matches_the_cpu_formula,
    silu_matches_reference,
    add_rows_is_exact,
    kv_rope_shift_f32_matches_the_cpu,
    kv_rope_shift_f16_matches_the_cpu,
    kv_rope_shift_refuses_q8_0_and_bad_ranges,
    kv_rope_shift_no_op_changes_nothing,
    window_classic_f32_hd64_matches_reference,
    window_classic_f32_hd128_matches_reference,
    window_classic_f16_hd64_matches_reference,
    window_classic_f16_hd128_matches_reference,
    window_classic_f32_hd80_matches_reference,
    window_classic_q8_0_hd64_matches_reference,
    window_flash_f32_hd64_matches_reference,
    window_flash_f32_hd128_matches_reference,
    window_flash_f16_hd64_matches_reference,
    window_flash_f16_hd128_matches_reference,
    window_flash_matches_classic,
    window_flash_is_batch_invariant,
    window_classic_is_batch_invariant,
    window_kernel_choice_follows_the_dispatch_rules,
    window_split_f32_hd64_matches_reference,
    window_split_f32_hd128_matches_reference,
    window_split_f16_hd64_matches_reference,
    window_split_f16_hd128_matches_reference,
    window_prefill_flash_f32_hd64_matches_reference,
    window_prefill_flash_f32_hd128_matches_reference,
    window_prefill_flash_f16_hd64_matches_reference,
    window_prefill_flash_f16_hd128_matches_reference,
    window_three_pass_f32_hd64_matches_reference,
    window_three_pass_f32_hd128_matches_reference,
    window_three_pass_f16_hd64_matches_reference,
    window_three_pass_f16_hd128_matches_reference,
    window_split_is_batch_invariant,
    window_prefill_flash_is_batch_invariant,
    window_three_pass_is_batch_invariant,
    window_prefill_flash_matches_the_reference_at_every_kv_tail,
    window_prefill_flash_tail_overlap_bug_is_caught,
    launches_ignore_index_buffer_tails_past_the_logical_length,
    launches_refuse_a_short_scratch,
    window_attention_at_other_head_shapes,
    window_attention_of_empty_windows_is_zero,
    window_attention_refuses_a_run_past_the_region,
    matmul_tier_follows_the_row_class,
    matmul_rows_are_bitwise_equal_within_their_class,
    matmul_refuses_a_type_without_kernels,
    get_rows_f32_matches_dequantize_row,
    get_rows_f16_matches_dequantize_row,
    get_rows_bf16_matches_dequantize_row,
    get_rows_q4_0_matches_dequantize_row,
    get_rows_q4_1_matches_dequantize_row,
    get_rows_q5_0_matches_dequantize_row,
    get_rows_q5_1_matches_dequantize_row,
    get_rows_q8_0_matches_dequantize_row,
    get_rows_q8_1_matches_dequantize_row,
    get_rows_q2_k_matches_dequantize_row,
    get_rows_q3_k_matches_dequantize_row,
    get_rows_q4_k_matches_dequantize_row,
    get_rows_q5_k_matches_dequantize_row,
    get_rows_q6_k_matches_dequantize_row,
    get_rows_q8_k_matches_dequantize_row,
    get_rows_iq4_nl_matches_dequantize_row,
    get_rows_iq4_xs_matches_dequantize_row,
    mv_f32_matches_reference,
    mv_f16_matches_reference,
    mv_bf16_matches_reference,
    mv_q4_0_matches_reference,
    mv_q4_1_matches_reference,
    mv_q5_0_matches_reference,
    mv_q5_1_matches_reference,
    mv_q8_0_matches_reference,
    mv_q8_1_matches_reference,
    mv_q2_k_matches_reference,
    mv_q3_k_matches_reference,
    mv_q4_k_matches_reference,
    mv_q5_k_matches_reference,
    mv_q6_k_matches_reference,
    mv_q8_k_matches_reference,
    mv_iq4_nl_matches_reference,
    mv_iq4_xs_matches_reference,
    mv_multi_f32_matches_reference,
    mv_multi_f16_matches_reference,
    mv_multi_bf16_matches_reference,
    mv_multi_q4_0_matches_reference,
    mv_multi_q4_1_matches_reference,
    mv_multi_q5_0_matches_reference,
    mv_multi_q5_1_matches_reference,
    mv_multi_q8_0_matches_reference,
    mv_multi_q8_1_matches_reference,
    mv_multi_q2_k_matches_reference,
    mv_multi_q3_k_matches_reference,
    mv_multi_q4_k_matches_reference,
    mv_multi_q5_k_matches_reference,
    mv_multi_q6_k_matches_reference,
    mv_multi_q8_k_matches_reference,
    mv_multi_iq4_nl_matches_reference,
    mv_multi_iq4_xs_matches_reference,
    mm_f32_matches_reference,
    mm_f16_matches_reference,
    mm_bf16_matches_reference,
    mm_q4_0_matches_reference,
    mm_q4_1_matches_reference,
    mm_q5_0_matches_reference,
    mm_q5_1_matches_reference,
    mm_q8_0_matches_reference,
    mm_q8_1_matches_reference,
    mm_q2_k_matches_reference,
    mm_q3_k_matches_reference,
    mm_q4_k_matches_reference,
    mm_q5_k_matches_reference,
    mm_q6_k_matches_reference,
    mm_q8_k_matches_reference,
    mm_iq4_nl_matches_reference,
    mm_iq4_xs_matches_reference,
);

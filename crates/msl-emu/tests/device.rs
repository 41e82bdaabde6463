//! Device-level behaviour of the emulator that the kernel gates do not cover: zero-copy
//! weights at per-weight offsets, queried limits driving launch decisions, submit errors.

use minfer_gguf::quants::{dequantize_row, random_blocks};
use minfer_gguf::GgmlType;
use minfer_metal::launch::{self, MatmulTier};
use minfer_metal::{Device, Error, Limits, WeightRegistry};
use minfer_msl_emu::{EmuDevice, Schedule, EMU_LIMITS};

fn f32s(dev: &EmuDevice, b: &<EmuDevice as Device>::Buffer, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    dev.read_bytes(b, 0, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn weights_are_read_in_place_from_a_wrapped_mapping_at_their_offsets() {
    let dev = EmuDevice::new(Schedule::Forward);
    let (k, rows) = (64usize, 4usize);
    let a = random_blocks(GgmlType::Q8_0, rows * k / 32, 1);
    let b = random_blocks(GgmlType::Q8_0, rows * k / 32, 2);
    // a page-aligned anonymous mapping standing in for a GGUF part: a at 4096, b after it
    let mut map = memmap2::MmapMut::map_anon(16384).unwrap();
    map[4096..4096 + a.len()].copy_from_slice(&a);
    map[4096 + a.len()..4096 + a.len() + b.len()].copy_from_slice(&b);
    let mut reg = WeightRegistry::<EmuDevice>::default();
    // SAFETY: `map` outlives the registry and the submit below.
    let part = unsafe { reg.register_part(&dev, "part0", map.as_mut_ptr(), map.len()) }.unwrap();
    reg.register_weight(&dev, "a", part, 4096, a.len() as u64)
        .unwrap();
    reg.register_weight(&dev, "b", part, 4096 + a.len() as u64, b.len() as u64)
        .unwrap();
    assert_eq!(reg.weights_bytes(), (a.len() + b.len()) as u64);
    let ids = dev
        .buffer_from(
            &[3i32, 0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let out = dev.new_buffer(2 * k * 4).unwrap();
    let (buf, off) = reg.weight_buf("b").unwrap();
    launch::launch_get_rows(&dev, GgmlType::Q8_0, buf, off, &ids, &out, k, rows, 2).unwrap();
    dev.submit().unwrap();
    let got = f32s(&dev, &out, 2 * k);
    let rb = b.len() / rows;
    let mut want = vec![0f32; k];
    dequantize_row(GgmlType::Q8_0, &b[3 * rb..4 * rb], &mut want).unwrap();
    assert_eq!(&got[..k], &want[..], "row 3 of weight b");
    // control: the same rows of weight a differ (the offset is what selects b)
    let mut wrong = vec![0f32; k];
    dequantize_row(GgmlType::Q8_0, &a[3 * rb..4 * rb], &mut wrong).unwrap();
    assert_ne!(&got[..k], &wrong[..]);
    // a weight past its part and an unaligned part are refused
    assert!(reg.register_weight(&dev, "c", part, 16000, 1000).is_err());
    // SAFETY: refused before any use.
    let unaligned = unsafe { reg.register_part(&dev, "bad", map.as_mut_ptr().add(8), 64) };
    assert!(matches!(unaligned, Err(Error::Unaligned { .. })));
}

#[test]
fn a_smaller_threadgroup_memory_limit_keeps_the_gemm_off() {
    let small = Limits {
        max_threadgroup_memory: 4096,
        ..EMU_LIMITS
    };
    let dev = EmuDevice::new(Schedule::Forward).with_limits(small);
    let (k, n, nt) = (32, 72, 16);
    let w = dev.new_buffer(n * k * 4).unwrap();
    let x = dev.new_buffer(nt * k * 4).unwrap();
    let out = dev.new_buffer(n * nt * 4).unwrap();
    // the explicit GEMM asks for 8 KiB: refused against the queried 4 KiB
    let err = launch::launch_mm(&dev, GgmlType::F32, &w, 0, &x, &out, k, n, nt).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Limit {
                requested: 8192,
                limit: 4096,
                ..
            }
        ),
        "{err}"
    );
    // the tier choice sees the limit and takes the multi-row kernel instead
    let tier = launch::launch_matmul(&dev, GgmlType::F32, &w, 0, &x, &out, k, n, nt).unwrap();
    assert_eq!(tier, MatmulTier::Multi);
    // control: with the full limit the same shape takes the GEMM
    let full = EmuDevice::new(Schedule::Forward);
    let tier = launch::launch_matmul(&full, GgmlType::F32, &w, 0, &x, &out, k, n, nt).unwrap();
    assert_eq!(tier, MatmulTier::Gemm);
}

#[test]
fn threads_over_the_queried_limit_are_refused_before_dispatch() {
    let dev = EmuDevice::new(Schedule::Forward).with_limits(Limits {
        max_threads_per_threadgroup: 128,
        ..EMU_LIMITS
    });
    let x = dev.new_buffer(4096 * 4).unwrap();
    let w = dev.new_buffer(4096 * 4).unwrap();
    // rms_norm sizes its threadgroup to the limit; the 256-thread variant cannot shrink
    launch::launch_rms_norm(&dev, &x, &w, &x, 4096, 1, 1e-6).unwrap();
    let err = launch::launch_rms_norm_256(&dev, &x, &w, &x, 4096, 1, 1e-6).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Limit {
                requested: 256,
                limit: 128,
                ..
            }
        ),
        "{err}"
    );
}

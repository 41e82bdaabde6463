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
    // prompt rows' tier choice sees the limit (a property of the device, never of the
    // forward) and takes the multi-row kernel instead
    let prompt = minfer_graph::RowClass::Prompt;
    let tier =
        launch::launch_matmul(&dev, prompt, GgmlType::F32, &w, 0, &x, &out, k, n, nt).unwrap();
    assert_eq!(tier, MatmulTier::Multi);
    // control: with the full limit the same rows take the GEMM
    let full = EmuDevice::new(Schedule::Forward);
    let tier =
        launch::launch_matmul(&full, prompt, GgmlType::F32, &w, 0, &x, &out, k, n, nt).unwrap();
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

/// Runs a fixed set of multi-threadgroup dispatches (GEMM with edge tiles, the multi-row
/// matmul, flash prefill with a tail block, RMSNorm) and returns their output bytes.
fn multi_threadgroup_outputs(dev: &EmuDevice) -> Vec<Vec<u8>> {
    use minfer_metal::launch::{AttnShape, KvType};
    let floats = |n: usize, seed: u32| -> Vec<u8> {
        (0..n as u32)
            .flat_map(|i| {
                let h = (i ^ seed).wrapping_mul(0x9E37_79B9).rotate_left(13);
                ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5).to_le_bytes()
            })
            .collect()
    };
    let read = |b: &<EmuDevice as Device>::Buffer, n: usize| {
        let mut v = vec![0u8; n];
        dev.read_bytes(b, 0, &mut v).unwrap();
        v
    };
    let mut outs = Vec::new();
    // GEMM: 200 rows (a partial 64-row tile) x 40 tokens (a partial token tile)
    let (k, n, nt) = (256, 200, 40);
    let w = dev
        .buffer_from(&random_blocks(GgmlType::Q8_0, n * k / 32, 5))
        .unwrap();
    let x = dev.buffer_from(&floats(k * nt, 1)).unwrap();
    let out = dev.new_buffer(n * nt * 4).unwrap();
    launch::launch_mm(dev, GgmlType::Q8_0, &w, 0, &x, &out, k, n, nt).unwrap();
    dev.submit().unwrap();
    outs.push(read(&out, n * nt * 4));
    // multi-row matmul of a K-quant: 150 threadgroups
    let (k, n, nt) = (512, 300, 3);
    let w = dev
        .buffer_from(&random_blocks(GgmlType::Q4K, n * k / 256, 6))
        .unwrap();
    let x = dev.buffer_from(&floats(k * nt, 2)).unwrap();
    let out = dev.new_buffer(n * nt * 4).unwrap();
    launch::launch_mv_multi(dev, GgmlType::Q4K, &w, 0, &x, &out, k, n, nt).unwrap();
    dev.submit().unwrap();
    outs.push(read(&out, n * nt * 4));
    // flash prefill over 70 tokens (one full 64-row block and a tail)
    let s = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_tokens: 70,
        n_ctx: 70,
        kv: KvType::F32,
    };
    let q = dev.buffer_from(&floats(70 * 4 * 64, 3)).unwrap();
    let kb = dev.buffer_from(&floats(70 * 2 * 64, 4)).unwrap();
    let vb = dev.buffer_from(&floats(70 * 2 * 64, 5)).unwrap();
    let pos: Vec<u8> = (0..70i32).flat_map(|p| p.to_le_bytes()).collect();
    let pb = dev.buffer_from(&pos).unwrap();
    let out = dev.new_buffer(70 * 4 * 64 * 4).unwrap();
    let scratch = dev
        .new_buffer(launch::flash_prefill_scratch_bytes(&s))
        .unwrap();
    launch::launch_flash_prefill(dev, &s, &q, &kb, &vb, &pb, &scratch, &out).unwrap();
    dev.submit().unwrap();
    outs.push(read(&out, 70 * 4 * 64 * 4));
    // RMSNorm of 24 rows
    let x = dev.buffer_from(&floats(896 * 24, 7)).unwrap();
    let g = dev.buffer_from(&floats(896, 8)).unwrap();
    let out = dev.new_buffer(896 * 24 * 4).unwrap();
    launch::launch_rms_norm(dev, &x, &g, &out, 896, 24, 1e-6).unwrap();
    dev.submit().unwrap();
    outs.push(read(&out, 896 * 24 * 4));
    outs
}

#[test]
fn every_threadgroup_computes_the_same_bytes_whatever_the_worker_count() {
    for s in Schedule::GATE_SET {
        let one = EmuDevice::new(s).with_workers(1);
        assert_eq!(one.workers(), 1);
        let want = multi_threadgroup_outputs(&one);
        for workers in [2, 4, 7] {
            let dev = EmuDevice::new(s).with_workers(workers);
            assert_eq!(dev.workers(), workers);
            let got = multi_threadgroup_outputs(&dev);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w,
                    "dispatch {i} under {s:?}: {workers} workers differ from 1"
                );
            }
        }
    }
}

fn detector_error(dev: &EmuDevice, kernel: &str, grid: u32, threads: u32) -> (String, Vec<String>) {
    use minfer_metal::{Arg, Dispatch};
    let out = dev.new_buffer(threads as usize * 4).unwrap();
    let p = dev.pipeline(kernel).unwrap();
    dev.dispatch(
        &p,
        &Dispatch {
            label: "many threadgroups",
            grid: [grid, 1, 1],
            threadgroup: [threads, 1, 1],
            args: &[Arg::Buffer(&out, 0)],
            threadgroup_memory: &[],
        },
    )
    .unwrap();
    match dev.submit() {
        Err(Error::Submit { reason, labels }) => (reason, labels),
        other => panic!("expected a submit error from {kernel}, got {other:?}"),
    }
}

#[test]
fn divergence_is_reported_for_the_first_threadgroup_in_order_with_many_workers() {
    for s in Schedule::GATE_SET {
        let (want, _) = detector_error(
            &EmuDevice::new(s).with_workers(1),
            "broken_early_return",
            97,
            64,
        );
        let dev = EmuDevice::new(s).with_workers(4);
        let (reason, labels) = detector_error(&dev, "broken_early_return", 97, 64);
        assert!(reason.contains("barrier divergence"), "{reason}");
        assert!(
            reason.contains("tests/broken/detectors.metal:13"),
            "{reason}"
        );
        assert_eq!(reason, want, "under {s:?}");
        assert!(
            labels.iter().any(|l| l.contains("broken_early_return")),
            "{labels:?}"
        );
        match s {
            Schedule::Forward => assert!(reason.contains("threadgroup (0,0,0)"), "{reason}"),
            Schedule::Reverse => assert!(reason.contains("threadgroup (96,0,0)"), "{reason}"),
            Schedule::Random(_) => {}
        }
        let (reason, _) = detector_error(&dev, "broken_simd_divergence", 97, 32);
        assert!(
            reason.contains("simdgroup divergence")
                && reason.contains("simd_sum at tests/broken/detectors.metal:33"),
            "{reason}"
        );
        // the pool is still usable after a failed dispatch
        assert_eq!(multi_threadgroup_outputs(&dev).len(), 4);
    }
}

#[test]
fn the_submit_bound_stops_a_dispatch_running_on_many_workers() {
    let dev = EmuDevice::new(Schedule::Forward)
        .with_workers(3)
        .with_submit_timeout(std::time::Duration::from_millis(200));
    let t = std::time::Instant::now();
    let (reason, _) = detector_error(&dev, "broken_endless_loop", 16, 32);
    assert!(
        reason.contains("no completion within the submit bound"),
        "{reason}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn devices_on_several_threads_share_the_pool_and_keep_their_bytes() {
    let want = multi_threadgroup_outputs(&EmuDevice::new(Schedule::Forward).with_workers(1));
    std::thread::scope(|scope| {
        let runs: Vec<_> = [
            Schedule::Forward,
            Schedule::Reverse,
            Schedule::Random(9),
            Schedule::Forward,
        ]
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            scope.spawn(move || {
                let dev = EmuDevice::new(s).with_workers(2 + i);
                (0..2)
                    .map(|_| multi_threadgroup_outputs(&dev))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
        for r in runs {
            for got in r.join().unwrap() {
                assert!(
                    got == want,
                    "a concurrent run differs from the sequential one"
                );
            }
        }
    });
}

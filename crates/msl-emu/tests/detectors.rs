//! Negative tests: each detector of the emulator fires on a deliberately broken kernel
//! (tests/broken/detectors.metal), and stays quiet on the fixed twin (the control).

use minfer_metal::{Arg, Device, Dispatch, Error};
use minfer_msl_emu::{EmuDevice, Schedule};

fn run(dev: &EmuDevice, kernel: &str, threads: u32) -> Result<Vec<f32>, Error> {
    let out = dev.new_buffer(threads as usize * 4)?;
    let p = dev.pipeline(kernel)?;
    dev.dispatch(
        &p,
        &Dispatch {
            label: "detector",
            grid: [1, 1, 1],
            threadgroup: [threads, 1, 1],
            args: &[Arg::Buffer(&out, 0)],
            threadgroup_memory: &[],
        },
    )?;
    dev.submit()?;
    let mut bytes = vec![0u8; threads as usize * 4];
    dev.read_bytes(&out, 0, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn submit_error(r: Result<Vec<f32>, Error>) -> (String, Vec<String>) {
    match r {
        Err(Error::Submit { reason, labels }) => (reason, labels),
        other => panic!("expected a submit error, got {other:?}"),
    }
}

#[test]
fn an_early_return_past_a_barrier_is_barrier_divergence_with_its_line() {
    for s in Schedule::GATE_SET {
        let dev = EmuDevice::new(s);
        let (reason, labels) = submit_error(run(&dev, "broken_early_return", 64));
        assert!(reason.contains("barrier divergence"), "{reason}");
        assert!(reason.contains("returned"), "{reason}");
        assert!(
            reason.contains("tests/broken/detectors.metal:13"),
            "{reason}"
        );
        assert!(
            labels.iter().any(|l| l.contains("broken_early_return")),
            "{labels:?}"
        );
        // control: the fixed kernel runs and computes the reversal
        let out = run(&dev, "fixed_early_return", 64).unwrap();
        assert_eq!(out[0], 31.0);
        assert_eq!(out[31], 0.0);
    }
}

#[test]
fn lanes_at_different_collectives_are_simdgroup_divergence() {
    let dev = EmuDevice::new(Schedule::Forward);
    let (reason, _) = submit_error(run(&dev, "broken_simd_divergence", 32));
    assert!(reason.contains("simdgroup divergence"), "{reason}");
    assert!(
        reason.contains("simd_sum at tests/broken/detectors.metal:33"),
        "{reason}"
    );
    assert!(
        reason.contains("simd_max at tests/broken/detectors.metal:35"),
        "{reason}"
    );
    let out = run(&dev, "fixed_simd_divergence", 32).unwrap();
    assert_eq!(out[0], (0..32).sum::<u32>() as f32);
    assert_eq!(out[20], 31.0);
}

#[test]
fn threads_at_two_barrier_sites_are_barrier_divergence() {
    let dev = EmuDevice::new(Schedule::Reverse);
    let (reason, _) = submit_error(run(&dev, "broken_split_barrier", 64));
    assert!(reason.contains("barrier divergence"), "{reason}");
    assert!(
        reason.contains("detectors.metal:56") && reason.contains("detectors.metal:58"),
        "{reason}"
    );
}

#[test]
fn a_missing_barrier_changes_the_output_across_schedules() {
    let outs: Vec<Vec<u32>> = Schedule::GATE_SET
        .iter()
        .map(|&s| {
            run(&EmuDevice::new(s), "broken_missing_barrier", 64)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect();
    assert!(
        outs[0] != outs[1] || outs[0] != outs[2],
        "the race went unseen"
    );
    // poison shows up as NaN in at least one schedule
    assert!(outs.iter().flatten().any(|&b| f32::from_bits(b).is_nan()));
    // control: with the barrier every schedule gives the same, correct bytes
    let fixed: Vec<Vec<f32>> = Schedule::GATE_SET
        .iter()
        .map(|&s| run(&EmuDevice::new(s), "fixed_missing_barrier", 64).unwrap())
        .collect();
    assert_eq!(fixed[0], fixed[1]);
    assert_eq!(fixed[0], fixed[2]);
    assert_eq!(fixed[0][63], 1.0);
}

#[test]
fn a_shuffle_past_the_last_lane_is_poison() {
    let out = run(
        &EmuDevice::new(Schedule::Forward),
        "probe_shuffle_down_past_end",
        32,
    )
    .unwrap();
    assert_eq!(out[0], 4.0);
    assert_eq!(out[27], 31.0);
    assert!(out[28].is_nan() && out[31].is_nan(), "{out:?}");
}

#[test]
fn static_threadgroup_memory_over_the_limit_is_refused() {
    let dev = EmuDevice::new(Schedule::Forward);
    let (reason, _) = submit_error(run(&dev, "broken_threadgroup_overflow", 32));
    assert!(
        reason.contains("threadgroup memory") && reason.contains("limit 32768"),
        "{reason}"
    );
}

#[test]
fn an_unknown_kernel_and_a_missing_binding_are_errors() {
    let dev = EmuDevice::new(Schedule::Forward);
    assert!(matches!(
        dev.pipeline("no_such_kernel"),
        Err(Error::UnknownKernel { .. })
    ));
    let p = dev.pipeline("fixed_early_return").unwrap();
    dev.dispatch(
        &p,
        &Dispatch {
            label: "unbound",
            grid: [1, 1, 1],
            threadgroup: [32, 1, 1],
            args: &[],
            threadgroup_memory: &[],
        },
    )
    .unwrap();
    let err = dev.submit().unwrap_err().to_string();
    assert!(err.contains("binds buffer(0)"), "{err}");
}

#[test]
fn every_kernel_source_is_compiled_into_the_emulator() {
    let have = EmuDevice::kernel_names();
    for k in minfer_metal::source::kernel_names() {
        assert!(have.contains(&k), "{k} missing from the emulator library");
    }
}

#[test]
fn a_kernel_past_the_submit_bound_is_stopped_with_its_label() {
    let dev = EmuDevice::new(Schedule::Forward)
        .with_submit_timeout(std::time::Duration::from_millis(200));
    let (reason, labels) = submit_error(run(&dev, "broken_endless_loop", 32));
    assert!(
        reason.contains("no completion within the submit bound"),
        "{reason}"
    );
    assert!(
        labels.iter().any(|l| l.contains("broken_endless_loop")),
        "{labels:?}"
    );
    // control: a finishing kernel under the same bound completes
    assert!(run(&dev, "fixed_early_return", 64).is_ok());
}

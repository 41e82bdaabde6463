//! The real device's span clock (a trace's per-node times, docs/TRACE.md) on the GPU, run by
//! scripts/mac-gate. Prints `SKIP` where no Metal device exists.
//!
//! A span is timed only when it held work (compute or blit encoders, summed), in command
//! order, only after its submit completed, each once; work outside a span is nobody's. The
//! times are the GPU's: a span's are within the submit's host wall time, and one that moves
//! 192 MB takes at least 100 µs (no Apple GPU moves 1.92 TB/s), so a tick rate wrong by
//! either bound fails.

use std::time::Instant;

use minfer_metal::launch::launch_add;
use minfer_metal::Device;
use minfer_metal_objc::MetalDevice;

#[test]
fn the_gpu_times_each_span_that_ran_work_and_nothing_else() {
    let dev = match MetalDevice::shared() {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP: {e}");
            return;
        }
    };
    let n = 16 << 20;
    let buf = || dev.new_buffer(n * 4).unwrap();
    let (a, b, c) = (buf(), buf(), buf());
    if dev.span_clock().is_none() {
        // No timestamp counters at stage boundaries: the reason is given and no span is kept.
        let why = dev
            .span_clock_unavailable()
            .expect("a reason for no span clock");
        println!("no span clock on {}: {why}", dev.name());
        dev.begin_span(1).unwrap();
        launch_add(dev, &a, &b, &c, n).unwrap();
        dev.end_span().unwrap();
        dev.submit().unwrap();
        assert!(dev.take_spans().is_empty());
        return;
    }
    dev.begin_span(7).unwrap();
    dev.end_span().unwrap();
    // Compute, a blit, compute: one span of three encoders.
    dev.begin_span(8).unwrap();
    launch_add(dev, &a, &b, &c, n).unwrap();
    dev.copy_rows(&c, &a, 4096, 0, 1, 16).unwrap();
    launch_add(dev, &a, &b, &c, n).unwrap();
    dev.end_span().unwrap();
    // Work outside any span is nobody's.
    launch_add(dev, &a, &b, &c, n).unwrap();
    dev.begin_span(9).unwrap();
    launch_add(dev, &a, &b, &c, n).unwrap();
    dev.end_span().unwrap();
    assert!(dev.take_spans().is_empty(), "nothing ran before the submit");
    let t0 = Instant::now();
    dev.submit().unwrap();
    let wall = t0.elapsed().as_nanos() as u64;
    let spans = dev.take_spans();
    println!("spans {spans:?} in a {wall} ns submit");
    assert_eq!(spans.iter().map(|s| s.0).collect::<Vec<_>>(), [8, 9]);
    let sum: u64 = spans.iter().map(|s| s.1).sum();
    assert!(sum <= wall, "span times {sum} ns > the submit's {wall} ns");
    assert!(spans[1].1 >= 100_000, "a 192 MB add in {} ns", spans[1].1);
    assert!(spans[0].1 > spans[1].1, "two adds took less than one");
    assert!(dev.take_spans().is_empty(), "a take empties");
    // Disarmed (no span begun): nothing is timed.
    launch_add(dev, &a, &b, &c, n).unwrap();
    dev.submit().unwrap();
    assert!(dev.take_spans().is_empty(), "no span, no time");
}

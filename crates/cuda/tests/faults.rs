//! A kernel fault is an error, not a hang or a panic: a launch that writes through a bad
//! pointer surfaces at the next synchronisation as a typed error naming the failure, and stays
//! an error afterwards (the context is lost). Control: the same launch with good pointers
//! first, in the same process, succeeds with the right values. Each test runs in a process of
//! its own (`scripts/gpu-gate` runs tests one by one): a fault ends the process's context.
//! SKIP (pass) where no CUDA device exists.

#![cfg(feature = "cuda")]

use minfer_cuda::device::{Arg, Gpu};

#[test]
fn a_faulting_kernel_is_an_error_at_the_next_sync() {
    if let Err(why) = minfer_cuda::available() {
        println!("SKIP: no CUDA device ({why})");
        return;
    }
    let mut g = Gpu::new().unwrap();
    let n = 1usize << 16;
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let (da, db, dout) = (
        g.alloc(n * 4).unwrap(),
        g.alloc(n * 4).unwrap(),
        g.alloc(n * 4).unwrap(),
    );
    g.upload(da, &bytes(&a)).unwrap();
    g.upload(db, &bytes(&b)).unwrap();
    let grid = ((n / 256) as u32, 1, 1);
    let add = |g: &mut Gpu, out: u64| {
        let args = [
            Arg::U64(da),
            Arg::U64(db),
            Arg::U64(out),
            Arg::U64(n as u64),
        ];
        g.launch("mf_add", grid, 256, &args)
    };
    // Control: good pointers.
    add(&mut g, dout).unwrap();
    g.sync().unwrap();
    let mut out = vec![0u8; n * 4];
    g.download(dout, &mut out).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(got.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32));
    // The output pointer in the first page: an illegal address on every device.
    add(&mut g, 0x100).unwrap();
    let first = g.sync();
    println!("after the fault: {first:?}");
    let e = first.expect_err("a kernel writing through a bad pointer must fail the sync");
    assert!(
        e.contains("ILLEGAL_ADDRESS") || e.contains("failed"),
        "the error names the failure: {e}"
    );
    let again = g.sync();
    println!("the next sync: {again:?}");
    assert!(again.is_err(), "the lost context stays an error");
}

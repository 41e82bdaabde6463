//! Device memory (issue 32): every allocation is checked against the budget before it is
//! made, and large host-to-device writes go through the page-locked staging, queued.
//! Controls: the same request under no budget is made; the staged bytes read back equal
//! what was written, for copies of one piece, several pieces, and two in a row left queued.
//! SKIP (pass) where no CUDA device exists.

#![cfg(feature = "cuda")]

use minfer_cuda::device::Gpu;

const MIB: usize = 1 << 20;

#[test]
fn an_allocation_past_the_budget_is_refused_with_the_figures() {
    if let Err(why) = minfer_cuda::available() {
        println!("SKIP: no CUDA device ({why})");
        return;
    }
    let mut g = Gpu::new().unwrap();
    let base = g.allocated();
    g.set_budget(Some(base + 8 * MIB));
    g.alloc(4 * MIB).expect("under the budget");
    assert_eq!(g.allocated(), base + 4 * MIB);
    let e = g
        .alloc(6 * MIB)
        .expect_err("4 + 6 MiB is past a budget of 8");
    println!("{e}");
    assert!(
        e.contains("budget") && e.contains("6.00 MiB asked") && e.contains("MiB allocated"),
        "the refusal names the figures: {e}"
    );
    // Nothing is charged for a refusal.
    assert_eq!(g.allocated(), base + 4 * MIB);
    g.alloc(4 * MIB).expect("exactly the budget");
    // Control: without a budget the same request is made.
    g.set_budget(None);
    g.alloc(6 * MIB).expect("no budget");
    assert_eq!(g.allocated(), base + 14 * MIB);
}

#[test]
fn pinned_uploads_arrive_whole_and_in_order() {
    if let Err(why) = minfer_cuda::available() {
        println!("SKIP: no CUDA device ({why})");
        return;
    }
    let mut g = Gpu::new().unwrap();
    // One piece (under 16 MiB), several pieces (40 MiB), and two left queued back to back
    // into the same destination: the second's bytes must be what is read.
    let pattern = |n: usize, seed: u32| -> Vec<u8> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    };
    for (n, seed) in [(3 * MIB, 1), (40 * MIB + 12345, 2)] {
        let data = pattern(n, seed);
        let p = g.alloc(n).unwrap();
        g.upload_pinned(p, &data).unwrap();
        let mut back = vec![0u8; n];
        g.download(p, &mut back).unwrap();
        assert!(back == data, "{n} bytes read back differ");
    }
    let (a, b) = (pattern(20 * MIB, 3), pattern(20 * MIB, 4));
    let (pa, pb) = (g.alloc(a.len()).unwrap(), g.alloc(b.len()).unwrap());
    g.upload_pinned(pa, &a).unwrap();
    g.upload_pinned(pb, &b).unwrap();
    g.upload_pinned(pa, &b).unwrap();
    let mut back = vec![0u8; a.len()];
    g.download(pa, &mut back).unwrap();
    assert!(back == b, "the last write to a buffer is what it holds");
    g.download(pb, &mut back).unwrap();
    assert!(back == b);
    // Control: the first pattern differs from the second (the check above can fail).
    assert!(a != b);
}

//! A prompt's attention: `tokens` query rows, row t attending to cells `0..=t` of an f16 KV
//! cache (one layer's call of a prefill), for every layer of a model shape, through
//! `ops::attn::attention` (the kernel and thread pool a forward uses) and, beside it, the
//! row-by-row kernel (`attn_f16::attend_group_on`, a task per (row, KV head), what the call
//! ran before the tiled kernel), interleaved pass by pass.
//!
//! `cargo bench -p minfer-cpu --bench prefill_attention -- [threads] [tokens] [shape] [passes]`
//! (defaults: 2 threads, 512 tokens, `demo` (Qwen2.5-0.5B: 24 layers, 14 heads, 2 KV heads
//! of 64), 9 passes; `7b`: 28 layers, 28 heads, 4 KV heads of 128). Prints each way's median
//! ms of a forward's attention over the passes. Not a test: nothing is asserted (the gates
//! are tests/attn_f16.rs).

use std::time::Instant;

use minfer_cpu::llamacpp_x86::attn_f16::attend_group_on;
use minfer_cpu::ops::attn::{attention, AttnParams};
use minfer_cpu::threads::{par_tasks, SharedOut};
use minfer_gguf::quants::f32_to_f16;
use minfer_gguf::GgmlType;
use minfer_testkit::rng::Rng;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let threads: usize = arg(0, "2").parse().expect("threads");
    let tokens: usize = arg(1, "512").parse().expect("tokens");
    let shape = arg(2, "demo");
    let passes: usize = arg(3, "9").parse().expect("passes");
    let (layers, n_head, n_head_kv, hd) = match shape.as_str() {
        "demo" => (24, 14, 2, 64),
        "7b" => (28, 28, 4, 128),
        s => panic!("shape {s}: want demo or 7b"),
    };
    let p = AttnParams {
        n_head,
        n_head_kv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        cache_type: GgmlType::F16,
        llamacpp: None,
    };
    let mut rng = Rng::xorshift64_raw(0x5eed);
    let row = n_head_kv * hd;
    let region = |rng: &mut Rng| -> Vec<u16> {
        (0..tokens * row)
            .map(|_| f32_to_f16(rng.signed()))
            .collect()
    };
    let kv: Vec<(Vec<u16>, Vec<u16>)> = (0..layers)
        .map(|_| (region(&mut rng), region(&mut rng)))
        .collect();
    let bytes = |x: &[u16]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let kvb: Vec<(Vec<u8>, Vec<u8>)> = kv.iter().map(|(k, v)| (bytes(k), bytes(v))).collect();
    let q: Vec<f32> = (0..tokens * n_head * hd)
        .map(|_| rng.signed() * 2.0)
        .collect();
    let window: Vec<f32> = (0..tokens)
        .flat_map(|t| [f32::from_bits(0), f32::from_bits(t as u32 + 1)])
        .collect();
    let mut out = vec![0f32; tokens * n_head * hd];
    let mut rows_out = vec![0f32; tokens * n_head * hd];
    let group = n_head / n_head_kv;
    let isa = minfer_cpu::simd::detected();
    let (mut tiled, mut by_row) = (Vec::new(), Vec::new());
    for _ in 0..passes {
        let t = Instant::now();
        for (k, v) in &kvb {
            attention(&p, &q, &window, k, v, &mut out, threads).expect("attention");
        }
        tiled.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        for (k, v) in &kv {
            let outp = SharedOut::new(&mut rows_out);
            par_tasks(tokens * n_head_kv, threads, |task| {
                let (tok, g) = (task / n_head_kv, task % n_head_kv);
                let first = (tok * n_head + g * group) * hd;
                // SAFETY: tasks own disjoint slices: their group's heads of their row.
                let o = unsafe { outp.part(first, group * hd) };
                let at = |c: usize| (c * row + g * hd)..(c * row + g * hd + hd);
                attend_group_on(
                    isa,
                    &q[first..][..group * hd],
                    hd,
                    p.scale,
                    0..tok + 1,
                    |c| &k[at(c)],
                    |c| &v[at(c)],
                    o,
                );
            });
        }
        by_row.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let same = out
        .iter()
        .zip(&rows_out)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    for (name, ms) in [
        ("attention (tiled)", &mut tiled),
        ("row by row", &mut by_row),
    ] {
        ms.sort_by(f64::total_cmp);
        println!(
            "{name:>18} {shape} {tokens} tokens threads {threads} ({isa}): {:.2} ms a forward \
             (median of {passes}; min {:.2}, max {:.2})",
            ms[passes / 2],
            ms[0],
            ms[passes - 1]
        );
    }
    println!("same bits: {same}");
}

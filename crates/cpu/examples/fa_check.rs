//! Checks `llamacpp_x86::attn_f16` bit for bit against llama.cpp's flash attention: reads the tensors
//! `scripts/peer-logprobs` dumps for a prompt step (`Qcur-L`, `Kcur-L`, `Vcur-L` in f32, the
//! output `kqv_out-L`), stores K/V as f16 as llama.cpp's cache does, attends causally (token t
//! sees cells 0..=t, scale 1/sqrt(head_dim)) and counts differing output bits.
//!
//! `cargo run --release -p minfer-cpu --example fa_check -- DUMP_DIR LAYER`
use minfer_cpu::llamacpp_x86::attn_f16::attend_head_ref;
use minfer_gguf::quants::f32_to_f16;

fn rd(p: &str) -> (Vec<i64>, Vec<f32>) {
    let b = std::fs::read(p).unwrap();
    let ne: Vec<i64> = (0..4)
        .map(|i| i64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap()))
        .collect();
    let v = b[32..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (ne, v)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (dir, l) = (&a[1], &a[2]);
    let (qn, q) = rd(&format!("{dir}/Qcur-{l}.bin"));
    let (kn, k) = rd(&format!("{dir}/Kcur-{l}.bin"));
    let (_, v) = rd(&format!("{dir}/Vcur-{l}.bin"));
    let (on, o) = rd(&format!("{dir}/kqv_out-{l}.bin"));
    let (hd, nh, nt) = (qn[0] as usize, qn[1] as usize, qn[2] as usize);
    let nkv = kn[1] as usize;
    println!("q {qn:?} k {kn:?} out {on:?}");
    let k16: Vec<u16> = k.iter().map(|&x| f32_to_f16(x)).collect();
    let v16: Vec<u16> = v.iter().map(|&x| f32_to_f16(x)).collect();
    let scale = 1.0 / (hd as f32).sqrt();
    let (mut diff, mut maxd) = (0, 0f32);
    for t in 0..nt {
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let qh = &q[(t * nh + h) * hd..][..hd];
            let mut out = vec![0f32; hd];
            let at = |c: usize| (c * nkv + kvh) * hd..(c * nkv + kvh + 1) * hd;
            attend_head_ref(
                qh,
                scale,
                0..t + 1,
                |c| &k16[at(c)],
                |c| &v16[at(c)],
                &mut out,
            );
            let want = &o[(t * nh + h) * hd..][..hd];
            for (x, y) in out.iter().zip(want) {
                if x.to_bits() != y.to_bits() {
                    diff += 1;
                    maxd = maxd.max((x - y).abs());
                }
            }
        }
    }
    println!("{diff} of {} values differ, max |d| {maxd:e}", nt * nh * hd);
}

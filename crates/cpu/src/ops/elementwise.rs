//! Elementwise ops.

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
}

pub fn silu_into(a: &[f32], out: &mut [f32]) {
    for (o, x) in out.iter_mut().zip(a) {
        *o = silu(*x);
    }
}

/// `silu(gate) * up`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(*g) * u;
    }
}

/// Elements per task of [`swiglu_threads`] (a multiple of 8).
const SWIGLU_TASK: usize = 16 * 1024;

/// [`swiglu`]'s bits over `threads` threads in tasks of [`SWIGLU_TASK`] elements, each eight
/// at a time where the instruction set in use has a vector form of the C library's `expf`
/// (`llamacpp_x86::libm_expf::swiglu_lanes`). A prompt's FFN runs it on every token's
/// 4864 (demo model) elements: one scalar `expf` call each, on one thread, was 3-4 % of the
/// demo's AVX2 pp512 at one thread (docs/PERFORMANCE.md, session 26). Panics unless the
/// three slices have the same length.
pub fn swiglu_threads(gate: &[f32], up: &[f32], out: &mut [f32], threads: usize) {
    assert!(gate.len() == out.len() && up.len() == out.len());
    let isa = crate::simd::detected();
    let shared = crate::threads::SharedOut::new(out);
    let n = shared.len();
    crate::threads::par_tasks(n.div_ceil(SWIGLU_TASK), threads, |i| {
        let r = i * SWIGLU_TASK..((i + 1) * SWIGLU_TASK).min(n);
        // SAFETY: the tasks' ranges are disjoint, each inside the output.
        let o = unsafe { shared.part(r.start, r.len()) };
        let (g, u) = (&gate[r.clone()], &up[r]);
        #[cfg(target_arch = "x86_64")]
        if crate::llamacpp_x86::libm_expf::swiglu_lanes(isa, g, u, o) {
            return;
        }
        let _ = isa;
        swiglu(g, u, o);
    });
}

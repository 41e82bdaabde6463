use super::{encode, need_len, read_i32s, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::AttnParams;

/// Element type of a KV region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    /// Packed Q8_0 rows ([`super::q8_0_row_bytes`] per row): the classic kernel reads them;
    /// the flash kernels refuse them by name.
    Q8_0,
}

impl KvType {
    fn suffix(self, op: &'static str) -> Result<&'static str> {
        match self {
            KvType::F32 => Ok("f32"),
            KvType::F16 => Ok("f16"),
            KvType::Q8_0 if op == "attn_classic" => Ok("q8_0"),
            KvType::Q8_0 => Err(Error::UnsupportedType {
                op,
                ty: "q8_0 KV (the flash kernels read f32/f16 regions; use the classic kernel)"
                    .into(),
            }),
        }
    }
    /// Bytes of one KV row of `elems` elements.
    pub(crate) fn row_bytes(self, elems: usize) -> usize {
        match self {
            KvType::F32 => elems * 4,
            KvType::F16 => elems * 2,
            KvType::Q8_0 => super::q8_0_row_bytes(elems),
        }
    }
    fn elem_bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 | KvType::Q8_0 => 2,
        }
    }
}

/// Shape of one causal attention: q/out `[n_tokens, n_head * head_dim]` f32, K/V regions
/// `[n_ctx, n_head_kv * head_dim]`, token t attends region rows `0..=positions[t]`.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_tokens: usize,
    pub n_ctx: usize,
    pub kv: KvType,
}

/// Decode chunking: one chunk per 32 KV rows, at most 16; returns (chunks, rows per chunk).
pub fn decode_chunks(n_kv: usize) -> (usize, usize) {
    let chunks = n_kv.div_ceil(32).clamp(1, 16);
    (chunks, n_kv.div_ceil(chunks))
}

struct Checked {
    p: AttnParams,
    n_kv: usize,
}

#[allow(clippy::too_many_arguments)]
fn check<D: Device>(
    dev: &D,
    op: &'static str,
    s: &AttnShape,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    positions: &D::Buffer,
    out: &D::Buffer,
) -> Result<Checked> {
    let shape = |reason: String| Error::Shape { op, reason };
    if s.n_head == 0 || s.n_head_kv == 0 || !s.n_head.is_multiple_of(s.n_head_kv) {
        return Err(shape(format!(
            "n_head {} must be a non-zero multiple of n_head_kv {}",
            s.n_head, s.n_head_kv
        )));
    }
    if s.n_tokens == 0 {
        return Err(shape("no query tokens".into()));
    }
    let q_bytes = (s.n_tokens * s.n_head * s.head_dim) as u64 * 4;
    need_len(dev, op, "q", q, 0, q_bytes)?;
    need_len(dev, op, "out", out, 0, q_bytes)?;
    let kv_stride = s.n_head_kv * s.head_dim;
    if s.kv == KvType::Q8_0 && !kv_stride.is_multiple_of(32) {
        return Err(shape(format!(
            "q8_0 KV rows need a multiple of 32 elements, got {kv_stride}"
        )));
    }
    let region = (s.n_ctx * s.kv.row_bytes(kv_stride)) as u64;
    need_len(dev, op, "k region", k, 0, region)?;
    need_len(dev, op, "v region", v, 0, region)?;
    let pos = read_i32s(dev, positions, s.n_tokens)?;
    let mut n_kv = 0usize;
    for (t, &p) in pos.iter().enumerate() {
        if p < 0 || p as usize >= s.n_ctx {
            return Err(shape(format!(
                "token {t} at position {p}, region has n_ctx {}",
                s.n_ctx
            )));
        }
        n_kv = n_kv.max(p as usize + 1);
    }
    Ok(Checked {
        n_kv,
        p: AttnParams {
            n_head: to_u32(op, "n_head", s.n_head)?,
            n_head_kv: to_u32(op, "n_head_kv", s.n_head_kv)?,
            head_dim: to_u32(op, "head_dim", s.head_dim)?,
            n_tokens: to_u32(op, "n_tokens", s.n_tokens)?,
            kv_stride: to_u32(op, "kv_stride", kv_stride)?,
            n_kv: to_u32(op, "n_kv", n_kv)?,
            n_chunks: 0,
            chunk_len: 0,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            tail_pos0: 0,
            n_full_blocks: 0,
            has_tail: 0,
            kv_row_bytes: to_u32(op, "kv row bytes", s.kv.row_bytes(kv_stride))?,
        },
    })
}

/// The classic kernel: any head dim up to 512, the correctness fallback.
#[allow(clippy::too_many_arguments)]
pub fn launch_attn_classic<D: Device>(
    dev: &D,
    s: &AttnShape,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    positions: &D::Buffer,
    out: &D::Buffer,
) -> Result<()> {
    const OP: &str = "attn_classic";
    let c = check(dev, OP, s, q, k, v, positions, out)?;
    if s.head_dim == 0 || s.head_dim > 512 {
        return Err(Error::Shape {
            op: OP,
            reason: format!("head_dim {} outside 1..=512", s.head_dim),
        });
    }
    encode(
        dev,
        &format!("kernel_attn_classic_{}", s.kv.suffix(OP)?),
        [c.p.n_head, c.p.n_tokens, 1],
        [128, 1, 1],
        &[
            Arg::Buffer(q, 0),
            Arg::Buffer(k, 0),
            Arg::Buffer(v, 0),
            Arg::Buffer(positions, 0),
            Arg::Buffer(out, 0),
            Arg::Bytes(as_bytes(&c.p)),
        ],
        &[],
    )
}

fn fast_hd(op: &'static str, hd: usize) -> Result<()> {
    if hd != 64 && hd != 128 {
        return Err(Error::Shape {
            op,
            reason: format!("flash kernels exist for head dim 64 and 128, got {hd}"),
        });
    }
    Ok(())
}

/// Scratch bytes [`launch_flash_decode`] needs for `s`: the chunk partials of the most
/// chunks [`decode_chunks`] gives (16), whatever the position.
pub fn flash_decode_scratch_bytes(s: &AttnShape) -> usize {
    s.n_head * 16 * (s.head_dim + 2) * 4
}

/// Flash decode (one token, head dim 64/128): chunk partials into the caller's `scratch`
/// (at least [`flash_decode_scratch_bytes`]), then the combine kernel.
#[allow(clippy::too_many_arguments)]
pub fn launch_flash_decode<D: Device>(
    dev: &D,
    s: &AttnShape,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    positions: &D::Buffer,
    scratch: &D::Buffer,
    out: &D::Buffer,
) -> Result<()> {
    const OP: &str = "flash_decode";
    fast_hd(OP, s.head_dim)?;
    if s.n_tokens != 1 {
        return Err(Error::Shape {
            op: OP,
            reason: format!("decode takes one token, got {}", s.n_tokens),
        });
    }
    let mut c = check(dev, OP, s, q, k, v, positions, out)?;
    let (chunks, chunk_len) = decode_chunks(c.n_kv);
    c.p.n_chunks = chunks as u32;
    c.p.chunk_len = chunk_len as u32;
    let need = s.n_head * chunks * (s.head_dim + 2) * 4;
    need_len(dev, OP, "scratch", scratch, 0, need as u64)?;
    encode(
        dev,
        &format!("kernel_flash_decode_{}_hd{}", s.kv.suffix(OP)?, s.head_dim),
        [c.p.n_head, c.p.n_chunks, 1],
        [128, 1, 1],
        &[
            Arg::Buffer(q, 0),
            Arg::Buffer(k, 0),
            Arg::Buffer(v, 0),
            Arg::Buffer(positions, 0),
            Arg::Buffer(scratch, 0),
            Arg::Bytes(as_bytes(&c.p)),
        ],
        &[],
    )?;
    encode(
        dev,
        "kernel_attn_combine_f32",
        [c.p.n_head, 1, 1],
        [128, 1, 1],
        &[
            Arg::Buffer(scratch, 0),
            Arg::Buffer(out, 0),
            Arg::Bytes(as_bytes(&c.p)),
        ],
        &[],
    )
}

/// Scratch bytes [`launch_flash_prefill`] needs for `s`: the K and V tail pads of 64 rows.
pub fn flash_prefill_scratch_bytes(s: &AttnShape) -> usize {
    2 * 64 * s.n_head_kv * s.head_dim * s.kv.elem_bytes()
}

/// Scratch bytes [`launch_attention`] needs for `s` (the family it picks).
pub fn attention_scratch_bytes(s: &AttnShape) -> usize {
    match (s.head_dim, s.n_tokens) {
        _ if s.kv == KvType::Q8_0 => 0,
        (64 | 128, 1) => flash_decode_scratch_bytes(s),
        (64 | 128, _) => flash_prefill_scratch_bytes(s),
        _ => 0,
    }
}

/// Flash prefill (head dim 64/128) with the partial-tail pad taken from the first row after
/// the last full block, held in the caller's `scratch` (at least
/// [`flash_prefill_scratch_bytes`]).
#[allow(clippy::too_many_arguments)]
pub fn launch_flash_prefill<D: Device>(
    dev: &D,
    s: &AttnShape,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    positions: &D::Buffer,
    scratch: &D::Buffer,
    out: &D::Buffer,
) -> Result<()> {
    launch_flash_prefill_with_tail_origin(dev, s, q, k, v, positions, scratch, out, None)
}

/// [`launch_flash_prefill`] with the tail block's first row overridden. Only for the tail
/// gate's control arm: `Some(n_kv - 64)` reproduces the recorded double-counted-overlap bug.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn launch_flash_prefill_with_tail_origin<D: Device>(
    dev: &D,
    s: &AttnShape,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    positions: &D::Buffer,
    scratch: &D::Buffer,
    out: &D::Buffer,
    tail_origin: Option<usize>,
) -> Result<()> {
    const OP: &str = "flash_prefill";
    fast_hd(OP, s.head_dim)?;
    let mut c = check(dev, OP, s, q, k, v, positions, out)?;
    let suffix = s.kv.suffix(OP)?;
    let full = c.n_kv / 64;
    let has_tail = c.n_kv % 64 != 0;
    c.p.n_full_blocks = full as u32;
    c.p.has_tail = has_tail as u32;
    c.p.tail_pos0 = to_u32(OP, "tail origin", tail_origin.unwrap_or(full * 64))?;
    let kv_stride = s.n_head_kv * s.head_dim;
    let pad_half = (64 * kv_stride * s.kv.elem_bytes()) as u64;
    need_len(dev, OP, "scratch", scratch, 0, 2 * pad_half)?;
    let pad = scratch;
    if has_tail {
        encode(
            dev,
            &format!("kernel_kv_tail_pad_{suffix}"),
            [64, 1, 1],
            [128, 1, 1],
            &[
                Arg::Buffer(k, 0),
                Arg::Buffer(v, 0),
                Arg::Buffer(pad, 0),
                Arg::Buffer(pad, pad_half),
                Arg::Bytes(as_bytes(&c.p)),
            ],
            &[],
        )?;
    }
    encode(
        dev,
        &format!("kernel_flash_prefill_{suffix}_hd{}", s.head_dim),
        [
            to_u32(OP, "query tiles", s.n_tokens.div_ceil(8))?,
            c.p.n_head,
            1,
        ],
        [128, 1, 1],
        &[
            Arg::Buffer(q, 0),
            Arg::Buffer(k, 0),
            Arg::Buffer(v, 0),
            Arg::Buffer(pad, 0),
            Arg::Buffer(pad, pad_half),
            Arg::Buffer(positions, 0),
            Arg::Buffer(out, 0),
            Arg::Bytes(as_bytes(&c.p)),
        ],
        &[],
    )
}

/// The design's dispatch: head dim 64/128 take flash decode (one token) or flash prefill;
/// any other head dim, and a packed q8_0 region, take the classic kernel. `scratch` holds at
/// least [`attention_scratch_bytes`].
#[allow(clippy::too_many_arguments)]
pub fn launch_attention<D: Device>(
    dev: &D,
    s: &AttnShape,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    positions: &D::Buffer,
    scratch: &D::Buffer,
    out: &D::Buffer,
) -> Result<()> {
    match (s.head_dim, s.n_tokens) {
        _ if s.kv == KvType::Q8_0 => launch_attn_classic(dev, s, q, k, v, positions, out),
        (64 | 128, 1) => launch_flash_decode(dev, s, q, k, v, positions, scratch, out),
        (64 | 128, _) => launch_flash_prefill(dev, s, q, k, v, positions, scratch, out),
        _ => launch_attn_classic(dev, s, q, k, v, positions, out),
    }
}

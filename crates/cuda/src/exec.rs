//! One node to launches: buffers resolved from the pool and the resident weights, shapes
//! and indices checked on the host, then the op's kernel launched on the engine's stream.

use minfer_gguf::GgmlType;
use minfer_graph::{BufId, ExecArgs, KvKind, Node, Op, RopeStyle, RowClass, WindowLayout};

use crate::backend::{theta_scale, type_code, CudaBackend, Scratch};
use crate::device::{Arg, DResult};
use crate::matvec::{mv1_fits, mv1_walk, Mv1Family, MV1_KERNELS};

/// Window rows per attention chunk (kernels/attn.cu `MF_ATTN_CHUNK`, `MF_GQA_CHUNK`).
const ATTN_CHUNK: usize = 256;
const GQA_CHUNK: usize = 64;

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub(crate) fn blocks(n: usize, per: usize) -> (u32, u32, u32) {
    (n.div_ceil(per).max(1) as u32, 1, 1)
}

/// Threads for a row of `nch` 32-element chunks: whole warps, at most 128.
pub(crate) fn row_threads(nch: usize) -> u32 {
    (nch.div_ceil(32) * 32).clamp(32, 128) as u32
}

impl CudaBackend {
    pub(crate) fn src_buf(&self, args: &ExecArgs, i: usize) -> DResult<(BufId, u64, usize)> {
        let id = args
            .srcs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| format!("src {i} has no buffer"))?;
        let (p, l) = self.buf(id).map_err(|e| format!("src {i}: {e}"))?;
        Ok((id, p, l))
    }

    pub(crate) fn src(&self, args: &ExecArgs, i: usize, need: usize) -> DResult<u64> {
        let (_, p, l) = self.src_buf(args, i)?;
        if l < need {
            return Err(format!("src {i} holds {l} bytes, the node reads {need}"));
        }
        Ok(p)
    }

    pub(crate) fn out(&self, node: &Node, args: &ExecArgs) -> DResult<u64> {
        let id = args.out.ok_or("no output buffer")?;
        let (p, l) = self.buf(id)?;
        if l < node.n_bytes() {
            return Err(format!(
                "output buffer holds {l} bytes, node needs {}",
                node.n_bytes()
            ));
        }
        Ok(p)
    }

    /// The i32 ids in src `i` (`n` of them), each checked against `bound`.
    pub(crate) fn checked_ids(
        &self,
        args: &ExecArgs,
        i: usize,
        n: usize,
        bound: usize,
        what: &str,
    ) -> DResult<u64> {
        let (id, p, l) = self.src_buf(args, i)?;
        if l < n * 4 {
            return Err(format!("{what}: src {i} holds {l} bytes for {n} ids"));
        }
        let ids = i32s(&self.host_view(id, n * 4)?);
        if let Some((t, v)) = ids
            .iter()
            .enumerate()
            .find(|(_, &v)| v < 0 || v as usize >= bound)
        {
            return Err(format!("{what} {v} of row {t} outside 0..{bound}"));
        }
        Ok(p)
    }

    pub(crate) fn region(&self, args: &ExecArgs, kind: KvKind) -> DResult<(u64, usize)> {
        let pair = args.kv.ok_or("the layer has no KV regions")?;
        self.buf(match kind {
            KvKind::K => pair.k,
            KvKind::V => pair.v,
        })
    }

    pub(crate) fn encode(&mut self, node: &Node, args: &ExecArgs) -> DResult<()> {
        let w = args.weights;
        let [ne0, ne1] = node.shape;
        let n = node.n_elems();
        let g = &self.gpu;
        match &node.op {
            Op::Input(_) => Ok(()),
            Op::KvCopy { .. } | Op::KvRopeShift { .. } => self.encode_cell_op(node, args),
            Op::GetRows { weight } => {
                let m = self.matrix(w, *weight)?;
                if m.ne0 != ne0 {
                    return Err(format!("table rows of {} for a node of {ne0}", m.ne0));
                }
                let ids = self.checked_ids(args, 0, ne1, m.ne1, "row id")?;
                let out = self.out(node, args)?;
                let ty = type_code(m.ty).ok_or("weight type")?;
                self.gpu.launch(
                    "mf_get_rows",
                    (ne1 as u32, 1, 1),
                    row_threads(ne0.div_ceil(32)),
                    &[
                        Arg::I32(ty),
                        Arg::U64(m.ptr),
                        Arg::U64(m.row_bytes as u64),
                        Arg::U64(ids),
                        Arg::U64(out),
                        Arg::I32(ne0 as i32),
                    ],
                )
            }
            Op::SelectRows => {
                let (_, x, xl) = self.src_buf(args, 0)?;
                let rows = xl / (ne0 * 4).max(1);
                let ids = self.checked_ids(args, 1, ne1, rows, "row id")?;
                let out = self.out(node, args)?;
                g.launch(
                    "mf_get_rows",
                    (ne1 as u32, 1, 1),
                    row_threads(ne0.div_ceil(32)),
                    &[
                        Arg::I32(0),
                        Arg::U64(x),
                        Arg::U64((ne0 * 4) as u64),
                        Arg::U64(ids),
                        Arg::U64(out),
                        Arg::I32(ne0 as i32),
                    ],
                )
            }
            Op::MatMul { weight, bias } => {
                let m = self.matrix(w, *weight)?;
                if m.ne1 != ne0 {
                    return Err(format!("weight of {} outputs for a node of {ne0}", m.ne1));
                }
                let (xid, x, xl) = self.src_buf(args, 0)?;
                if xl < m.ne0 * ne1 * 4 {
                    return Err(format!(
                        "src 0 holds {xl} bytes, the node reads {}",
                        m.ne0 * ne1 * 4
                    ));
                }
                let out = self.out(node, args)?;
                let b = match bias {
                    Some(b) => self.vector(w, *b, ne0)?,
                    None => 0,
                };
                // Each run of one row class on its class's kernels (prompt.rs).
                for (r0, n, class) in self.row_runs(ne1)? {
                    let xr = x + (r0 * m.ne0 * 4) as u64;
                    let or = out + (r0 * ne0 * 4) as u64;
                    match (class, self.prompt_gemm(&m)) {
                        (RowClass::Prompt, Some(ty)) => {
                            self.encode_gemm(ty, &m, (xid, r0, xr), n, or, b)?
                        }
                        _ => self.encode_matmul_rows(&m, (xid, r0, xr), n, or, b)?,
                    }
                }
                Ok(())
            }
            Op::RmsNorm { eps, weight, group } => {
                if *group == 0 || !ne0.is_multiple_of(*group) {
                    return Err(format!("groups of {group} over rows of {ne0}"));
                }
                let x = self.src(args, 0, n * 4)?;
                let out = self.out(node, args)?;
                let gain = self.vector(w, *weight, *group)?;
                g.launch(
                    "mf_rms_norm",
                    ((n / group) as u32, 1, 1),
                    (group.div_ceil(32) * 32).clamp(32, 256) as u32,
                    &[
                        Arg::U64(x),
                        Arg::U64(gain),
                        Arg::U64(out),
                        Arg::I32(*group as i32),
                        Arg::F32(*eps),
                    ],
                )
            }
            Op::Rope {
                style,
                n_head,
                head_dim,
                freq_base,
                freq_scale,
            } => {
                if n_head * head_dim != ne0 {
                    return Err(format!("{n_head} heads of {head_dim} over rows of {ne0}"));
                }
                let x = self.src(args, 0, n * 4)?;
                let pos = self.src(args, 1, ne1 * 4)?;
                let out = self.out(node, args)?;
                let total = ne1 * n_head * (head_dim / 2);
                g.launch(
                    "mf_rope",
                    blocks(total, 256),
                    256,
                    &[
                        Arg::U64(x),
                        Arg::U64(pos),
                        Arg::U64(out),
                        Arg::I32(*n_head as i32),
                        Arg::I32(*head_dim as i32),
                        Arg::I32(ne1 as i32),
                        Arg::F32(theta_scale(*freq_base, *head_dim)),
                        Arg::F32(*freq_scale),
                        Arg::I32((*style == RopeStyle::Neox) as i32),
                    ],
                )
            }
            Op::Add | Op::Mul | Op::SwiGLU => {
                let a = self.src(args, 0, n * 4)?;
                let b = self.src(args, 1, n * 4)?;
                let out = self.out(node, args)?;
                let k = match node.op {
                    Op::Add => "mf_add",
                    Op::Mul => "mf_mul",
                    _ => "mf_swiglu",
                };
                g.launch(
                    k,
                    blocks(n, 256),
                    256,
                    &[Arg::U64(a), Arg::U64(b), Arg::U64(out), Arg::U64(n as u64)],
                )
            }
            Op::Silu => {
                let x = self.src(args, 0, n * 4)?;
                let out = self.out(node, args)?;
                g.launch(
                    "mf_silu",
                    blocks(n, 256),
                    256,
                    &[Arg::U64(x), Arg::U64(out), Arg::U64(n as u64)],
                )
            }
            Op::KvStore {
                kind, cache_type, ..
            } => {
                let ty = kv_code(*cache_type)?;
                let row_bytes = cell_bytes(*cache_type, ne0)?;
                let (region, rlen) = self.region(args, *kind)?;
                let n_cells = rlen / row_bytes;
                let x = self.src(args, 0, n * 4)?;
                let cells = self.checked_ids(args, 1, ne1, n_cells, "KV cell")?;
                let total = if ty == 2 { ne1 * (ne0 / 32) } else { n };
                self.gpu.launch(
                    "mf_kv_store",
                    blocks(total, 256),
                    256,
                    &[
                        Arg::I32(ty),
                        Arg::U64(x),
                        Arg::U64(cells),
                        Arg::U64(region),
                        Arg::U64(row_bytes as u64),
                        Arg::I32(ne0 as i32),
                        Arg::I32(ne1 as i32),
                    ],
                )
            }
            Op::Attention {
                n_head,
                n_head_kv,
                head_dim,
                scale,
                cache_type,
                window,
                ..
            } => {
                if n_head * head_dim != ne0 {
                    return Err(format!("{n_head} heads of {head_dim} over rows of {ne0}"));
                }
                kv_code(*cache_type)?;
                let row_bytes = cell_bytes(*cache_type, n_head_kv * head_dim)?;
                let (k, klen) = self.region(args, KvKind::K)?;
                let (v, _) = self.region(args, KvKind::V)?;
                let n_cells = klen / row_bytes;
                let width = window.width();
                let q = self.src(args, 0, n * 4)?;
                let (wid, win, wl) = self.src_buf(args, 1)?;
                if wl < ne1 * width * 4 {
                    return Err(format!("window input of {wl} bytes for {ne1} queries"));
                }
                // Each run's windows are checked by its class's encoder (once per row).
                let windows = self.windows_for(*window, wid, ne1 * width)?;
                let out = self.out(node, args)?;
                let fa = self.prompt_fa(*cache_type, *head_dim);
                let shape = (*n_head, *n_head_kv, *head_dim, width, *scale);
                for (r0, nq, class) in self.row_runs(ne1)? {
                    match (class, fa) {
                        (RowClass::Prompt, Some(kernel)) => self.encode_prompt_attention(
                            kernel,
                            (q, k, v, win, out),
                            &windows,
                            (row_bytes, n_cells),
                            shape,
                            r0,
                            nq,
                        )?,
                        _ => {
                            let qs = (ne0 * 4 * r0) as u64;
                            let ws = (width * 4 * r0) as u64;
                            let rows = &windows[r0 * width..(r0 + nq) * width];
                            let max_len = check_windows(rows, width, n_cells, r0)?;
                            self.encode_attention_rows(
                                *cache_type,
                                (q + qs, k, v, win + ws, out + qs),
                                (row_bytes, n_cells, max_len),
                                shape,
                                nq,
                            )?
                        }
                    }
                }
                Ok(())
            }
            Op::MatMulAdd { weight, bias } => {
                let m = self.matrix(w, *weight)?;
                let ty = type_code(m.ty).filter(|_| self.mmvq_kernel(m.ty).is_some());
                let (Some(_), true, 1) = (ty, mv1_fits(m.ne0), ne1) else {
                    return Err(format!(
                        "a one-token int8 projection plus residual, got {} x {} of {} for {ne0} x {ne1}",
                        m.ne1, m.ne0, m.ty
                    ));
                };
                if m.ne1 != ne0 {
                    return Err(format!("weight of {} outputs for a node of {ne0}", m.ne1));
                }
                let (xid, x, xl) = self.src_buf(args, 0)?;
                if xl < m.ne0 * 4 {
                    return Err(format!(
                        "src 0 holds {xl} bytes, the node reads {}",
                        m.ne0 * 4
                    ));
                }
                let res = self.src(args, 1, ne0 * 4)?;
                let out = self.out(node, args)?;
                let b = match bias {
                    Some(b) => self.vector(w, *b, ne0)?,
                    None => 0,
                };
                self.launch_mv1(&m, (xid, 0, x), out, b, res)
            }
            Op::FfnGateUp { gate, up, in_norm } => {
                let (mg, mu) = (self.matrix(w, *gate)?, self.matrix(w, *up)?);
                if ne1 != 1 || mg.ne1 != ne0 || mu.ne1 != ne0 || mg.ne0 != mu.ne0 {
                    return Err(format!(
                        "gate {}x{} and up {}x{} for a node of {ne0}x{ne1}",
                        mg.ne1, mg.ne0, mu.ne1, mu.ne0
                    ));
                }
                if !mv1_fits(mg.ne0) {
                    return Err(format!(
                        "fused gate/up rows of {}, not whole 32-blocks",
                        mg.ne0
                    ));
                }
                let (tg, tu) = match (self.mmvq_kernel(mg.ty), self.mmvq_kernel(mu.ty)) {
                    (Some(_), Some(_)) => (
                        type_code(mg.ty).ok_or("gate type")?,
                        type_code(mu.ty).ok_or("up type")?,
                    ),
                    _ => return Err(format!("fused gate/up over {} and {}", mg.ty, mu.ty)),
                };
                let (xid, x, xl) = self.src_buf(args, 0)?;
                if xl < mg.ne0 * 4 {
                    return Err(format!(
                        "src 0 holds {xl} bytes, the node reads {}",
                        mg.ne0 * 4
                    ));
                }
                let norm = match in_norm {
                    Some(n) => Some((self.vector(w, n.weight, mg.ne0)?, n.eps)),
                    None => None,
                };
                let out = self.out(node, args)?;
                let (gx, xa, shared) = self.mv1_input((xid, 0, x), mg.ne0, norm)?;
                let walk = mv1_walk(&[&mg, &mu], self.mv1_pipe);
                let kernel = MV1_KERNELS[Mv1Family::GateUp as usize][walk][gx as usize];
                let grid = self.mv1_grid(kernel, ne0, self.mv1_warps, shared)?;
                let mut a = vec![
                    Arg::I32(tg),
                    Arg::U64(mg.ptr),
                    Arg::U64(mg.row_bytes as u64),
                    Arg::I32(tu),
                    Arg::U64(mu.ptr),
                    Arg::U64(mu.row_bytes as u64),
                ];
                a.extend(xa);
                a.extend([Arg::U64(out), Arg::I32(mg.ne0 as i32), Arg::I32(ne0 as i32)]);
                self.gpu
                    .launch_shared(kernel, (grid, 1, 1), 32 * self.mv1_warps as u32, shared, &a)
            }
            Op::QkvRopeStore(f) => self.encode_qkv(node, f, args),
        }
    }
}

impl CudaBackend {
    /// The first `n` window values of the forward: the typed ones the engine handed over
    /// with the forward ([`minfer_graph::Executor::set_windows`]), or, for a backend driven
    /// node by node (no forward named them), the window input's host copy. A forward's
    /// windows of another layout or too few are an error, never the bytes instead.
    fn windows_for(
        &self,
        layout: WindowLayout,
        input: BufId,
        n: usize,
    ) -> DResult<std::sync::Arc<[i32]>> {
        match &self.windows {
            Some(w) if w.layout != layout => Err(format!(
                "the forward's windows are {:?}, the node reads {layout:?}",
                w.layout
            )),
            Some(w) if w.values.len() < n => Err(format!(
                "the forward names {} window values, the node reads {n}",
                w.values.len()
            )),
            Some(w) => Ok(w.values.clone()),
            None => Ok(i32s(&self.host_view(input, n * 4)?).into()),
        }
    }

    /// `nq` query rows of an attention node on the generation rows' kernels (pointers at
    /// their first row).
    fn encode_attention_rows(
        &mut self,
        cache_type: GgmlType,
        (q, k, v, win, out): (u64, u64, u64, u64, u64),
        (row_bytes, n_cells, max_len): (usize, usize, usize),
        (n_head, n_head_kv, head_dim, width, scale): (usize, usize, usize, usize, f32),
        nq: usize,
    ) -> DResult<()> {
        let ty = kv_code(cache_type)?;
        let common = [
            Arg::I32(ty),
            Arg::U64(q),
            Arg::U64(k),
            Arg::U64(v),
            Arg::U64(win),
        ];
        let shape = [
            Arg::U64(row_bytes as u64),
            Arg::I32(n_head as i32),
            Arg::I32(n_head_kv as i32),
            Arg::I32(head_dim as i32),
            Arg::I32(width as i32),
            Arg::F32(scale),
        ];
        if self.attn_single {
            let a: Vec<Arg> = common
                .into_iter()
                .chain([Arg::U64(out)])
                .chain(shape)
                .collect();
            return self
                .gpu
                .launch("mf_attn_window", (n_head as u32, nq as u32, 1), 128, &a);
        }
        let group = n_head / n_head_kv;
        if let Some(choice) = self.attn_warp(cache_type, head_dim, group, nq) {
            return self.attn_warp_launch(
                choice, q, k, v, win, out, row_bytes, n_head, n_head_kv, head_dim, width, scale,
                nq, n_cells, max_len,
            );
        }
        // Chunks over the region's cells for small batches (a fixed grid for a
        // fixed plan: graph replay), over the longest window for prefill (less
        // scratch); the chunks past a window's end are empty and skipped, so the
        // grid never changes a query's bits.
        let gqa = head_dim <= 128 && group <= 16;
        let chunk = if gqa { GQA_CHUNK } else { ATTN_CHUNK };
        let span = if nq <= 16 { n_cells } else { max_len };
        let n_split = span.div_ceil(chunk).max(1);
        let part_bytes = nq * n_head * n_split * (head_dim + 2) * 4;
        let part = self.scratch(Scratch::AttnPart, part_bytes)?;
        let a: Vec<Arg> = common
            .into_iter()
            .chain([Arg::U64(part)])
            .chain(shape)
            .chain([Arg::I32(n_split as i32)])
            .collect();
        if gqa {
            // The group's heads shared out over blocks of `attn_heads` (the same bits,
            // kernels/attn.cu): a decode step's few chunks fill more multiprocessors
            // (`MINFER_CUDA_Q8_DECODE=1` until gated on a device; else the whole group).
            let gb = if self.q8_decode {
                self.attn_heads.min(group)
            } else {
                group
            };
            let floats = gb * head_dim + 32 * (head_dim + 1) + 32 * head_dim + gb * 32;
            let mut a = a;
            a.push(Arg::I32(gb as i32));
            self.gpu.launch_shared(
                "mf_attn_gqa",
                (
                    (n_head_kv * group.div_ceil(gb)) as u32,
                    nq as u32,
                    n_split as u32,
                ),
                128,
                ((floats + 48 + 32) * 4) as u32,
                &a,
            )?;
        } else {
            self.gpu.launch(
                "mf_attn_split",
                (n_head as u32, nq as u32, n_split as u32),
                128,
                &a,
            )?;
        }
        self.gpu.launch_shared(
            "mf_attn_combine",
            (n_head as u32, nq as u32, 1),
            (head_dim).next_multiple_of(32).min(256) as u32,
            (n_split * 16) as u32,
            &[
                Arg::U64(part),
                Arg::U64(out),
                Arg::I32(n_head as i32),
                Arg::I32(head_dim as i32),
                Arg::I32(n_split as i32),
            ],
        )
    }
}

pub(crate) fn kv_code(ty: GgmlType) -> DResult<i32> {
    match ty {
        GgmlType::F32 => Ok(0),
        GgmlType::F16 => Ok(1),
        GgmlType::Q8_0 => Ok(2),
        other => Err(format!("no CUDA kernels for a {other} KV cache")),
    }
}

pub(crate) fn cell_bytes(ty: GgmlType, n_embd_kv: usize) -> DResult<usize> {
    ty.row_bytes(n_embd_kv as u64)
        .map(|b| b as usize)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("a KV row of {n_embd_kv} is not whole {ty} blocks"))
}

/// Every query's window (rows of `width` i32s, the first being query `first`) lies inside
/// the region's `n_cells` cells; returns the longest window's length.
pub(crate) fn check_windows(
    w: &[i32],
    width: usize,
    n_cells: usize,
    first: usize,
) -> DResult<usize> {
    let mut longest = 0usize;
    for (t, row) in (first..).zip(w.chunks_exact(width)) {
        if width == 2 {
            let (lo, hi) = (row[0], row[1]);
            if lo < 0 || hi < lo || hi as usize > n_cells {
                return Err(format!(
                    "query {t}: window [{lo}, {hi}) outside 0..{n_cells} cells"
                ));
            }
            longest = longest.max((hi - lo) as usize);
        } else {
            let mut len = 0usize;
            for r in row.chunks_exact(2) {
                let (c, l) = (r[0], r[1]);
                if l < 0 || (l > 0 && (c < 0 || c as usize + l as usize > n_cells)) {
                    return Err(format!(
                        "query {t}: run ({c}, {l}) outside 0..{n_cells} cells"
                    ));
                }
                len += l as usize;
            }
            longest = longest.max(len);
        }
    }
    Ok(longest)
}

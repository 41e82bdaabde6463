//! Streamed blocks (layer offload, ADR 0014): a graph of prompt rows on a plan that leaves
//! blocks on the CPU runs those blocks' nodes here, all but their KV stores and attention
//! ([`minfer_graph::Graph::streamed_blocks`]). The weights of such a split, which this
//! backend does not hold, are copied into the stream arena before its nodes run (matrices
//! as stored, straight from the model's page-locked mapping where the driver allows;
//! vectors as f32, as `prepare_weights` holds them) and found there by `matrix` and `vector`
//! until the next split. A split reads each of its weights from the same offset every
//! forward, so its recorded graph replays.

use std::sync::atomic::Ordering;

use minfer_gguf::quants;
use minfer_graph::{ExecArgs, Node, WeightId, WeightRef};

use crate::backend::{matrix_refusal, CudaBackend, Matrix, Resident};
use crate::device::DResult;
use crate::prompt::STREAMED;
use crate::scratch::Scratch;

const ALIGN: usize = 256;

impl CudaBackend {
    /// `Memory::prepare_streamed`: page-locks, per mapped part, the span from the first to
    /// the last byte of the weights this backend will stream (a CPU block's weights lie
    /// together in the file), so their copies are DMA from the mapping; the blocks the
    /// device holds and the embedding stay pageable.
    pub(crate) fn lock_streamed(
        &mut self,
        ws: &dyn minfer_graph::WeightSource,
        ids: &[WeightId],
    ) -> DResult<()> {
        let started = std::time::Instant::now();
        // Per part: (its mapping, the lowest and highest address of a streamed weight).
        let mut spans: Vec<(usize, &[u8], usize, usize)> = Vec::new();
        for &id in ids {
            let (Some(w), Some((part, mapping))) = (ws.weight(id), ws.part(id)) else {
                continue;
            };
            let (a, b) = (
                w.bytes.as_ptr() as usize,
                w.bytes.as_ptr() as usize + w.bytes.len(),
            );
            match spans.iter_mut().find(|s| s.0 == part) {
                Some(s) => (s.2, s.3) = (s.2.min(a), s.3.max(b)),
                None => spans.push((part, mapping, a, b)),
            }
        }
        let mut locked = 0usize;
        for (_, mapping, a, b) in spans {
            let base = mapping.as_ptr() as usize;
            if self.gpu.lock_host(&mapping[a - base..b - base])? {
                locked += b - a;
            }
        }
        if locked > 0 {
            tracing::info!(
                "{}: {:.1} MiB of the model's mapping page-locked for streamed blocks in {:.2} s",
                minfer_graph::Identity::name(self),
                locked as f64 / (1u64 << 20) as f64,
                started.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    /// Copies in the weights of `nodes` this backend does not hold (none: nothing happens).
    pub(crate) fn stream_split_weights(
        &mut self,
        nodes: &[&Node],
        args: &[ExecArgs],
    ) -> DResult<()> {
        self.streamed.clear();
        let Some(ws) = args.first().map(|a| a.weights) else {
            return Ok(());
        };
        let mut want: Vec<WeightId> = Vec::new();
        for id in nodes.iter().flat_map(|n| n.op.weights()) {
            let held = self.weights.get(id.index()).copied().flatten().is_some();
            if !held && !want.contains(&id) {
                want.push(id);
            }
        }
        if want.is_empty() {
            return Ok(());
        }
        // The vectors first, as f32 in one host buffer (one copy); then each matrix.
        let mut host: Vec<u8> = Vec::new();
        let mut vectors: Vec<(WeightId, usize, usize)> = Vec::new();
        let mut matrices: Vec<(WeightId, WeightRef<'_>, usize, usize)> = Vec::new();
        for &id in &want {
            let name = ws.name(id);
            let w = ws
                .weight(id)
                .ok_or_else(|| format!("weight {name} is not in the model"))?;
            if w.ne1 == 1 {
                let mut v = vec![0f32; w.ne0];
                quants::dequantize_row(w.ty, w.bytes, &mut v)
                    .map_err(|e| format!("weight {name}: {e}"))?;
                vectors.push((id, host.len(), w.ne0));
                host.extend(v.iter().flat_map(|x| x.to_le_bytes()));
                host.resize(host.len().next_multiple_of(ALIGN), 0);
            } else {
                if let Some(why) = matrix_refusal(w.ty, w.ne0) {
                    return Err(format!("weight {name}: {why}"));
                }
                let row_bytes = w.ty.row_bytes(w.ne0 as u64).unwrap_or(0) as usize;
                let need = row_bytes * w.ne1;
                if w.bytes.len() < need {
                    return Err(format!(
                        "weight {name} of {} bytes, its rows need {need}",
                        w.bytes.len()
                    ));
                }
                matrices.push((id, w, row_bytes, need));
            }
        }
        let mut at = host.len();
        let offsets: Vec<usize> = matrices
            .iter()
            .map(|m| {
                let o = at;
                at += m.3.next_multiple_of(ALIGN);
                o
            })
            .collect();
        let base = self.scratch(Scratch::StreamArena, at.max(ALIGN))?;
        self.gpu.upload(base, &host)?;
        for (id, off, len) in vectors {
            let ptr = base + off as u64;
            self.streamed
                .insert(id.index(), Resident::Vector { ptr, len });
        }
        for ((id, w, row_bytes, need), off) in matrices.into_iter().zip(offsets) {
            let ptr = base + off as u64;
            self.timed_copy("copy streamed weights", |g| {
                g.upload_mapped(ptr, &w.bytes[..need])
            })?;
            let m = Matrix {
                ty: w.ty,
                ne0: w.ne0,
                ne1: w.ne1,
                ptr,
                row_bytes,
            };
            self.streamed.insert(id.index(), Resident::Matrix(m));
            STREAMED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

//! Capture staging for traces (seed §4.1, §4.8): while armed, each node's dispatches are
//! followed, in the same command buffer, by a blit (`Device::copy_rows`) of its output into
//! a staging buffer of exactly the output's length. A later node of the split may reuse the
//! node's buffer (liveness recycling inside a plan), so reading the buffer after the submit
//! would give that node's values; the blit runs in stream order, before any later dispatch.
//! After the submit the staging buffers are read back and returned to a free list keyed by
//! byte length (exact-length reuse: once warm, a step allocates no staging buffer). KV
//! stores have no output and are never staged (a whole region per layer would dominate).
//! Staging in flight is bounded ([`STAGING_CEILING`]): past it the pending commands are
//! submitted mid-split and read back, so a long prefill does not stage a whole forward.

use std::collections::HashMap;

use minfer_graph::{capture, CaptureLog, ExecArgs, Node, NodeId};

use super::MetalBackend;
use crate::device::Device;
use crate::error::{Error, Result};

/// Bytes of staging in flight after which an armed backend submits mid-split.
pub const STAGING_CEILING: usize = 128 << 20;

pub(crate) struct Staging<D: Device> {
    log: CaptureLog,
    /// Free staging buffers by exact byte length.
    free: HashMap<usize, Vec<D::Buffer>>,
    /// Blits encoded into the pending command buffer: (node, staging buffer, bytes).
    inflight: Vec<(NodeId, D::Buffer, usize)>,
    /// Staging buffers made so far (the warm-reuse gate reads it).
    made: usize,
    /// Bytes staged in `inflight`, and the bound that triggers a mid-split submit.
    inflight_bytes: usize,
    ceiling: usize,
}

impl<D: Device> Default for Staging<D> {
    fn default() -> Self {
        Staging {
            log: CaptureLog::default(),
            free: HashMap::new(),
            inflight: Vec::new(),
            made: 0,
            inflight_bytes: 0,
            ceiling: STAGING_CEILING,
        }
    }
}

impl<D: Device> Staging<D> {
    pub fn armed(&self) -> bool {
        self.log.armed()
    }

    /// Arms or disarms; disarming drops what was not taken (the staging buffers stay for
    /// the next time, as pool buffers do).
    pub fn arm(&mut self, on: bool) {
        self.log.arm(on);
    }

    /// Reads back the staging of the blits that the completed submit ran and frees them
    /// for reuse; after a failed submit (`ok == false`) the values are dropped.
    pub fn submitted(&mut self, dev: &D, ok: bool) -> Result<()> {
        let mut first_err = None;
        self.inflight_bytes = 0;
        for (node, buf, bytes) in std::mem::take(&mut self.inflight) {
            if ok && first_err.is_none() {
                let mut raw = vec![0u8; bytes];
                match dev.read_bytes(&buf, 0, &mut raw) {
                    Ok(()) => {
                        let v = raw
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect();
                        self.log.push(node, v);
                    }
                    Err(e) => first_err = Some(e),
                }
            }
            self.free.entry(bytes).or_default().push(buf);
        }
        first_err.map_or(Ok(()), Err)
    }

    pub fn take(&mut self) -> Vec<(NodeId, Vec<f32>)> {
        self.log.take()
    }

    /// Records a node's time (armed only).
    pub fn record_time(&mut self, id: NodeId, ns: u64) {
        self.log.record_time(id, ns);
    }

    pub fn take_times(&mut self) -> Vec<(NodeId, u64)> {
        self.log.take_times()
    }

    /// A staging buffer of exactly `bytes`: a free one, else a new one.
    fn buffer(&mut self, dev: &D, bytes: usize) -> Result<D::Buffer> {
        if let Some(b) = self.free.get_mut(&bytes).and_then(|v| v.pop()) {
            return Ok(b);
        }
        self.made += 1;
        dev.new_buffer(bytes.max(4))
    }
}

impl<D: Device> MetalBackend<D>
where
    D::Buffer: Clone,
{
    /// Encodes the blit staging `node`'s output, after its dispatches (armed only).
    pub(super) fn stage_capture(&mut self, node: &Node, args: &ExecArgs) -> Result<()> {
        let Some(out) = args.out.filter(|_| capture::captured(node)) else {
            return Ok(());
        };
        let bytes = node.n_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let src = self.pool.get(out.0).cloned().ok_or_else(|| Error::Shape {
            op: "capture",
            reason: format!("output buffer {} does not exist", out.0),
        })?;
        let dst = self.capture.buffer(&self.dev, bytes)?;
        let r = self.dev.copy_rows(&src, &dst, bytes as u64, 0, 0, 1);
        if let Err(e) = r {
            self.capture.free.entry(bytes).or_default().push(dst);
            return Err(e);
        }
        self.capture.inflight.push((node.id, dst, bytes));
        self.capture.inflight_bytes += bytes;
        if self.capture.inflight_bytes >= self.capture.ceiling {
            // Run what is encoded (this node's blit included) and read the staging back.
            self.pending = true;
            self.submit().map_err(|e| Error::Submit {
                reason: format!("staging flush: {e}"),
                labels: Vec::new(),
            })?;
        }
        Ok(())
    }

    /// The same backend with another staging bound (tests of the mid-split flush).
    pub fn with_staging_ceiling(mut self, bytes: usize) -> Self {
        self.capture.ceiling = bytes;
        self
    }

    /// Staging buffers made since the backend was made (constant across steps once warm).
    pub fn staging_buffers_made(&self) -> usize {
        self.capture.made
    }
}

//! Op offload on the CPU's side (layer offload, ADR 0014): in a split the scheduler runs with
//! the plan's device as helper, a block's matmul sends each run of prompt rows to the helper
//! and keeps its generation rows on the CPU's kernels.

use crate::ops::{matmul, KernelError};
use crate::{llamacpp_x86, CpuBackend};
use minfer_graph::{Backend, RowClass, RowClasses, WeightRef};

impl CpuBackend {
    /// Op offload (ADR 0014): a block's matmul whose prompt rows the helper multiplies (each
    /// run of prompt rows one call, the bias added here) while its generation rows run on
    /// this backend's kernels; rows without classes are generation rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_helped(
        &self,
        w: &WeightRef<'_>,
        mw: &matmul::Weight<'_>,
        x: &[f32],
        b: Option<&[f32]>,
        out: &mut [f32],
        n: usize,
        helper: &mut dyn Backend,
    ) -> std::result::Result<(), KernelError> {
        let (k, m) = (w.ne0, w.ne1);
        let runs = if self.rows.tokens.is_empty() {
            vec![(0, n, RowClass::Generation)]
        } else {
            let classes = self.rows.of(n).ok_or_else(|| {
                KernelError(format!(
                    "row classes for {} token rows and {} output rows, the node has {n}",
                    self.rows.tokens.len(),
                    self.rows.outputs.len()
                ))
            })?;
            RowClasses::runs(classes)
        };
        for (r0, len, class) in runs {
            let (xs, ys) = (&x[r0 * k..(r0 + len) * k], &mut out[r0 * m..(r0 + len) * m]);
            match class {
                RowClass::Prompt => {
                    helper
                        .stream_matmul(w, xs, len, ys)
                        .map_err(|e| KernelError(e.to_string()))?;
                    if let Some(b) = b {
                        for row in ys.chunks_exact_mut(m) {
                            for (y, &bi) in row.iter_mut().zip(b) {
                                *y += bi;
                            }
                        }
                    }
                }
                RowClass::Generation => match self.numerics.llamacpp() {
                    Some(simd) => llamacpp_x86::matmul(simd, mw, xs, b, ys, self.threads)?,
                    None => matmul::matmul(mw, xs, b, ys, self.threads)?,
                },
            }
        }
        Ok(())
    }
}

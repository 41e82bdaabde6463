//! How many KV cells the arena gets (issue 29, ADR 0002 §Capacity):
//!
//! - [`KvSize::Tokens`]: `n_ctx` as given (`-c N`, or the command's default);
//! - [`KvSize::Memory`]: as many cells as `--kv-mem SIZE` holds, whatever the backend;
//! - [`KvSize::FreeMemory`] (`serve` with neither flag, when CUDA takes part): as many as
//!   the device's free memory after the weights holds, less [`KV_RESERVE`] for activations,
//!   the pool, cuBLASLt's workspace and CUDA graphs, when the device holds every block (the
//!   engine asks whichever device backend runs the model: the tests use the emulator's
//!   `MINFER_EMU_MEM`). Where it cannot be sized so (no device holds every block, or the
//!   free-memory query failed)
//!   the engine takes the fallback `n_ctx` and the plan says why, the device's error
//!   included: a failed query is never read as a zero budget.
//!
//! The free-memory mode takes no less than the configured context (the command's default,
//! which the offload planner charges per block with [`KV_RESERVE`] beside the blocks, so a
//! plan that places every block leaves it room); less is refused with the figures.
//! Both sized modes cap the context at the model's training context (llama.cpp's `-c 0`: one
//! arena the sequences share, each able to reach the training context) and refuse a budget
//! below the smallest context asked for, naming the MiB figures. Not the training context ×
//! the sequences: the arena's size is the generation-row attention's grid on CUDA (its
//! chunks cover the region's cells, so replayed graphs keep one shape), and cells past what
//! one sequence may use would cost every decode step while the server is mostly idle.

use crate::offload::size_text;

/// Device memory the free-memory sizing leaves beside the KV: the graph cache's activation
/// buffers at most ([`crate::config::GRAPH_CACHE_BYTES`], 512 MiB) and a 1 GiB margin for the
/// pool's slack, cuBLASLt's workspace, CUDA graphs and the driver (llama.cpp's `--fit`
/// leaves 1 GiB per device by default too).
pub const KV_RESERVE: u64 = crate::config::GRAPH_CACHE_BYTES as u64 + (1 << 30);

/// How the arena's size is chosen ([`crate::EngineConfig::kv_size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvSize {
    /// `n_ctx` as configured.
    #[default]
    Tokens,
    /// As many cells as `bytes` of KV hold (`--kv-mem`), at least `min_ctx`.
    Memory { bytes: u64, min_ctx: usize },
    /// As many as the device's free memory after the weights holds, less [`KV_RESERVE`]
    /// (the CLI asks for it on `serve` when CUDA takes part).
    FreeMemory { min_ctx: usize },
}

/// A context that fits a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    pub n_ctx: usize,
    /// The budget held more than `max` and the context was cut to it.
    pub capped: bool,
}

/// A budget too small for the smallest context asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct TooSmall {
    pub budget: u64,
    pub per_cell: u64,
    pub min_ctx: usize,
}

impl std::fmt::Display for TooSmall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        write!(
            f,
            "{:.1} MiB of KV holds {} tokens ({:.3} MiB a cell, one cell kept as scratch); \
             at least {} are needed ({:.1} MiB)",
            mib(self.budget),
            (self.budget / self.per_cell.max(1)).saturating_sub(1),
            mib(self.per_cell),
            self.min_ctx,
            mib(self.per_cell * (self.min_ctx as u64 + 1))
        )
    }
}

/// The context `budget` bytes of KV hold at `per_cell` bytes a cell (K and V of every layer
/// the budget covers), one cell kept for the scratch cell padding rows use, cut to `max`;
/// below `min` a refusal with the figures.
pub fn fit(budget: u64, per_cell: u64, min: usize, max: usize) -> Result<Fit, TooSmall> {
    let cells = budget / per_cell.max(1);
    let n_ctx = usize::try_from(cells.saturating_sub(1)).unwrap_or(usize::MAX);
    let too_small = TooSmall {
        budget,
        per_cell,
        min_ctx: min,
    };
    if n_ctx < min.max(1) {
        return Err(too_small);
    }
    Ok(Fit {
        n_ctx: n_ctx.min(max.max(min)),
        capped: n_ctx > max.max(min),
    })
}

/// What the engine took: the startup line's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct KvPlan {
    pub n_ctx: usize,
    /// KV bytes of the cells (every layer, the scratch cell included).
    pub bytes: u64,
    pub cache_type: minfer_gguf::GgmlType,
    /// Where the size came from, in words (with the free memory and reserve when measured).
    pub source: String,
    /// Why a sized mode fell back to the default context (None: it did not).
    pub fallback: Option<String>,
    /// The cap, when it cut the context.
    pub capped: Option<String>,
}

impl KvPlan {
    /// `kv: 212992 tokens (212993 cells, f16, 24.4 GiB): sized from …`.
    pub fn line(&self) -> String {
        let mut s = format!(
            "kv: {} tokens ({} cells, {}, {}): {}",
            self.n_ctx,
            self.n_ctx + 1,
            self.cache_type.name().to_ascii_lowercase(),
            size_text(self.bytes),
            self.source
        );
        if let Some(c) = &self.capped {
            s.push_str(&format!("; capped at {c}"));
        }
        if let Some(f) = &self.fallback {
            s.push_str(&format!(" (not sized from device memory: {f})"));
        }
        s
    }
}

/// The free-memory sizing's budget: what is free less the reserve.
pub fn free_budget(free: u64) -> u64 {
    free.saturating_sub(KV_RESERVE)
}

/// The device the free-memory mode asks: its name and its free-memory query, or why there is
/// none to ask.
pub type Device<'a> = Result<(&'a str, &'a dyn Fn() -> Result<u64, String>), String>;

/// `n_ctx` under `size` with the KV at `per_cell` bytes a cell (every layer), the training
/// context `train_ctx`, `fallback` the configured context, and the device's free memory as
/// `free` reports it (asked only in the free-memory mode, and only when `device` names the
/// device that holds every block; otherwise why not).
pub fn decide(
    size: KvSize,
    fallback: usize,
    per_cell: u64,
    cache_type: minfer_gguf::GgmlType,
    train_ctx: usize,
    device: Device<'_>,
) -> Result<KvPlan, String> {
    let plan = |n_ctx: usize, source: String| KvPlan {
        n_ctx,
        bytes: per_cell * (n_ctx as u64 + 1),
        cache_type,
        source,
        fallback: None,
        capped: None,
    };
    let sized = |budget: u64, min_ctx: usize, source: String, what: String| {
        let f =
            fit(budget, per_cell, min_ctx, train_ctx.max(1)).map_err(|e| format!("{what}: {e}"))?;
        let mut p = plan(f.n_ctx, source);
        if f.capped {
            p.capped = Some(format!("the model's training context {train_ctx}"));
        }
        Ok(p)
    };
    match size {
        KvSize::Tokens => Ok(plan(fallback, "-c (the context asked for)".into())),
        KvSize::Memory { bytes, min_ctx } => sized(
            bytes,
            min_ctx,
            format!("--kv-mem {}", size_text(bytes)),
            format!("--kv-mem {}", size_text(bytes)),
        ),
        KvSize::FreeMemory { min_ctx } => {
            let why = match device {
                Err(why) => why,
                Ok((name, query)) => match query() {
                    Ok(free) => {
                        let source = format!(
                            "sized from {}'s {} free after the weights, less a {} reserve",
                            name,
                            size_text(free),
                            size_text(KV_RESERVE)
                        );
                        let what = format!(
                            "{name} has {:.1} MiB free after the weights, less the {:.1} MiB \
                             reserve for activations and the pool; give -c N or --kv-mem SIZE",
                            free as f64 / (1u64 << 20) as f64,
                            KV_RESERVE as f64 / (1u64 << 20) as f64
                        );
                        // No less than the default context (llama.cpp's `--fit` stops
                        // shrinking at its `-fitc` 4096 too): the offload plan charged its KV.
                        let min = min_ctx.max(fallback.min(train_ctx.max(1)));
                        return sized(free_budget(free), min, source, what);
                    }
                    Err(e) => format!("{name}'s free-memory query failed: {e}"),
                },
            };
            let mut p = plan(fallback, format!("the default context {fallback}"));
            p.fallback = Some(why);
            Ok(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::GgmlType;

    /// A budget of exactly k + 1 cells (k tokens and the scratch cell) gives k; one byte less
    /// gives k − 1 (the control: the arithmetic is at the edge, not rounded past it).
    #[test]
    fn a_budget_of_k_cells_fits_k() {
        let per = 24_576;
        assert_eq!(
            fit(per * 1001, per, 32, 1 << 20),
            Ok(Fit {
                n_ctx: 1000,
                capped: false
            })
        );
        assert_eq!(fit(per * 1001 - 1, per, 32, 1 << 20).unwrap().n_ctx, 999);
        // The cap cuts it and says so; the control: at the cap exactly it is not "capped".
        assert_eq!(
            fit(per * 1001, per, 32, 512),
            Ok(Fit {
                n_ctx: 512,
                capped: true
            })
        );
        assert!(!fit(per * 513, per, 32, 512).unwrap().capped);
    }

    /// Too small for the minimum: a refusal naming the MiB figures; the control: one cell
    /// more is taken.
    #[test]
    fn too_small_a_budget_is_refused_with_the_figures() {
        let per = 1 << 20;
        let e = fit(per * 32, per, 32, 4096).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("32.0 MiB of KV holds 31 tokens"), "{text}");
        assert!(text.contains("at least 32 are needed (33.0 MiB)"), "{text}");
        assert_eq!(fit(per * 33, per, 32, 4096).unwrap().n_ctx, 32);
    }

    fn free(b: u64) -> impl Fn() -> Result<u64, String> {
        move || Ok(b)
    }

    /// Free memory after the weights less the reserve, at the per-cell bytes, capped at the
    /// training context; the controls: a device that is not there, or whose query
    /// fails, falls back to the default context with the reason (never a zero budget).
    #[test]
    fn free_memory_sizes_the_context_or_falls_back_with_the_reason() {
        let size = KvSize::FreeMemory { min_ctx: 32 };
        let per = 1 << 16; // 64 KiB a cell
        let q = free(KV_RESERVE + per * 8193);
        let p = decide(size, 4096, per, GgmlType::F16, 32768, Ok(("cuda", &q))).unwrap();
        assert_eq!(
            (p.n_ctx, p.capped.clone(), p.fallback.clone()),
            (8192, None, None)
        );
        assert!(
            p.line()
                .contains("kv: 8192 tokens (8193 cells, f16, 512.1 MiB)"),
            "{}",
            p.line()
        );
        assert!(p.line().contains("reserve"), "{}", p.line());
        // Capped: more memory than the training context needs.
        let q = free(KV_RESERVE + per * 1_000_000);
        let p = decide(size, 4096, per, GgmlType::F16, 2048, Ok(("cuda", &q))).unwrap();
        assert_eq!(p.n_ctx, 2048);
        assert!(
            p.line()
                .contains("capped at the model's training context 2048"),
            "{}",
            p.line()
        );
        // Too little left after the weights: refused with the figures.
        let q = free(KV_RESERVE + per * 10);
        let e = decide(size, 4096, per, GgmlType::F16, 2048, Ok(("cuda", &q))).unwrap_err();
        assert!(
            e.contains("cuda has") && e.contains("MiB free after the weights"),
            "{e}"
        );
        assert!(e.contains("at least 2048 are needed"), "{e}");
        // No less than the default context: 1000 tokens' room is refused, 4096's taken.
        let q = free(KV_RESERVE + per * 1001);
        let e = decide(size, 4096, per, GgmlType::F16, 32768, Ok(("cuda", &q))).unwrap_err();
        assert!(
            e.contains("holds 1000 tokens") && e.contains("at least 4096"),
            "{e}"
        );
        let q = free(KV_RESERVE + per * 4097);
        let p = decide(size, 4096, per, GgmlType::F16, 32768, Ok(("cuda", &q))).unwrap();
        assert_eq!(p.n_ctx, 4096);
        // Controls: a failed query and no device fall back to the default, saying why.
        let failing = || Err::<u64, String>("CUDA_ERROR_UNKNOWN".into());
        let p = decide(size, 4096, per, GgmlType::F16, 2048, Ok(("cuda", &failing))).unwrap();
        assert_eq!(p.n_ctx, 4096);
        assert!(p.line().contains("CUDA_ERROR_UNKNOWN"), "{}", p.line());
        let p = decide(
            size,
            4096,
            per,
            GgmlType::F16,
            2048,
            Err("no CUDA device".into()),
        )
        .unwrap();
        assert_eq!(p.n_ctx, 4096);
        assert!(p.line().contains("no CUDA device"), "{}", p.line());
    }

    /// `--kv-mem` sizes on any backend; `-c` is taken as given (the control: the same
    /// figures under Tokens keep the fallback).
    #[test]
    fn kv_mem_sizes_and_tokens_keep_the_context() {
        let per = 4096;
        let none: Device<'_> = Err("cpu".into());
        let p = decide(
            KvSize::Memory {
                bytes: per * 101,
                min_ctx: 1,
            },
            4096,
            per,
            GgmlType::F32,
            1 << 20,
            none.clone(),
        )
        .unwrap();
        assert_eq!(p.n_ctx, 100);
        let p = decide(KvSize::Tokens, 4096, per, GgmlType::F32, 1 << 20, none).unwrap();
        assert_eq!(p.n_ctx, 4096);
    }
}

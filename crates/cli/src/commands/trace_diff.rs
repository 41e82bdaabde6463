//! `minfer trace-diff A B [--tol T] [--json]`: the first node where two traces (docs/TRACE.md)
//! differ beyond the tolerance (`minfer_engine::trace_diff`). Exit 0 when they agree, 1 when
//! they differ or their graphs do not correspond, 2 on a usage or format error.

use super::{Quiet, UsageError};
use clap::Args as ClapArgs;
use minfer_engine::trace_diff::{self, Outcome};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The first trace (written by `--trace FILE` or MINFER_TRACE).
    pub a: PathBuf,
    /// The second trace.
    pub b: PathBuf,
    /// Largest difference allowed, as a fraction of each node's scale (its largest |min| or
    /// |max| in either trace). NaN / Inf counts and chosen tokens compare exactly.
    #[arg(long, default_value_t = 1e-3)]
    pub tol: f64,
    /// Print one JSON object ({"status": "agree" | "differ" | "mismatch", ...}).
    #[arg(long)]
    pub json: bool,
}

fn load(p: &Path, which: &str) -> anyhow::Result<Value> {
    let s = std::fs::read_to_string(p)
        .map_err(|e| UsageError(format!("{which} {}: cannot read it: {e}", p.display())))?;
    serde_json::from_str(&s)
        .map_err(|e| UsageError(format!("{which} {}: not JSON: {e}", p.display())).into())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if !(a.tol.is_finite() && a.tol >= 0.0) {
        crate::usage!("--tol {}: needs a finite value >= 0", a.tol);
    }
    let (da, db) = (load(&a.a, "A")?, load(&a.b, "B")?);
    let out = trace_diff::diff(&da, &db, a.tol).map_err(|e| UsageError(e.0))?;
    if a.json {
        println!("{}", out.to_json(a.tol));
    } else {
        match &out {
            Outcome::Agree { phases, nodes } => println!(
                "the traces agree within {}: {phases} phases, {nodes} nodes",
                a.tol
            ),
            Outcome::Differ(d) => {
                println!("first difference: {}", d.at.describe());
                println!("  {}: A {}  B {}", d.field, d.a, d.b);
                println!(
                    "  |A - B| / scale = {:.3e} > tol {} (scale {:.6e})",
                    d.err, a.tol, d.scale
                );
            }
            Outcome::Mismatch { what, at, other } => {
                println!("the graphs do not correspond: {what}");
                if let Some(p) = at {
                    println!("  A: {}", p.describe());
                }
                if let Some(o) = other {
                    println!("  B: {o}");
                }
            }
        }
    }
    match out {
        Outcome::Agree { .. } => Ok(()),
        _ => Err(Quiet(1).into()),
    }
}

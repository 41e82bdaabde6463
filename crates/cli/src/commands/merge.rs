//! `minfer merge FIRST_PART OUT`: join a split model into one file. The split keys are
//! dropped, so a model split by `minfer split` (or llama-gguf-split) comes back byte for byte.

use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_gguf::split;
use minfer_gguf::GgufModel;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Any part of the split model (all parts are found by name).
    pub input: PathBuf,
    /// The merged file (must not exist unless --force).
    pub output: PathBuf,
    #[command(flatten)]
    pub force: super::output::ForceArg,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let model = GgufModel::open(&args.input)
        .with_context(|| format!("cannot open {}", args.input.display()))?;
    let inputs: Vec<PathBuf> = model.parts().iter().map(|p| p.path().into()).collect();
    // An existing output (allowed by --force) is replaced by the crash-safe rename, not
    // removed first: an interrupted merge must leave the old file whole.
    super::output::check_outputs(
        std::slice::from_ref(&args.output),
        &inputs,
        args.force.force,
    )?;
    let total: u64 = model.tensors().iter().map(|t| t.info.n_bytes).sum();
    let bar = super::split::bytes_bar(total, "merge");
    split::merge_replacing(&model, &args.output, &mut |n| bar.inc(n))
        .with_context(|| format!("cannot merge into {}", args.output.display()))?;
    bar.finish_and_clear();
    println!(
        "wrote {} ({} parts, {} tensors)",
        args.output.display(),
        model.parts().len(),
        model.tensors().len()
    );
    eprintln!("merged in {:.2} s", t0.elapsed().as_secs_f64());
    Ok(())
}

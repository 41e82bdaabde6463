//! `minfer rm NAME`: remove a model from the cache (a name as `minfer list` prints it).

use clap::Args as ClapArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// hf:OWNER/REPO (the whole repository), hf:OWNER/REPO:QUANT or :FILE.gguf, a known
    /// model's name, or a file name in the models directory.
    pub name: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = minfer_hub::models_dir().ok_or(minfer_hub::FetchError::NoModelsDir)?;
    for p in minfer_hub::cache::remove(&dir, &args.name)? {
        println!("removed {}", p.display());
    }
    Ok(())
}

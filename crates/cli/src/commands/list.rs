//! `minfer list`: the models in the cache, with the name to pass as `-m`.

use clap::Args as ClapArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// One JSON object per model instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = minfer_hub::models_dir().ok_or(minfer_hub::FetchError::NoModelsDir)?;
    let models = minfer_hub::cache::list(&dir)?;
    if args.json {
        for m in &models {
            let j = serde_json::json!({
                "name": m.name,
                "bytes": m.bytes,
                "files": m.files,
                "partial": m.partial,
            });
            println!("{j}");
        }
        return Ok(());
    }
    println!("models directory: {}", dir.display());
    for m in &models {
        let parts = if m.files.len() > 1 {
            format!("  ({} parts)", m.files.len())
        } else {
            String::new()
        };
        let state = if m.partial {
            "  (unfinished download: pull again to resume)"
        } else {
            ""
        };
        println!("{:>9.1} MB  {}{parts}{state}", m.bytes as f64 / 1e6, m.name);
    }
    if models.is_empty() {
        println!("(empty: `minfer pull NAME` fetches a model)");
    }
    Ok(())
}

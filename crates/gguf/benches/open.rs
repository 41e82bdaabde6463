//! Open-time benchmark: `GgufModel::open` on the demo model (map + parse the header +
//! build the tensor index), 20 runs after one warm-up, min/median/max in milliseconds.
//! The page cache is warm after the warm-up, so this measures parsing, not the disk.
//!
//! Run: `cargo bench -p minfer-gguf --bench open` (model from `$MINFER_MODELS` or
//! `~/.cache/minfer/models`; pass another path as the first argument). The gate:
//! median under 50 ms for the 491 MB qwen2.5-coder-0.5b Q4_K_M file.

use minfer_gguf::{parse_header, GgufFile, GgufModel};
use minfer_testkit::models;
use std::path::PathBuf;
use std::time::Instant;

const RUNS: usize = 20;

fn model_path() -> Option<PathBuf> {
    if let Some(p) = std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        return Some(p.into());
    }
    models::qwen()
}

fn report(what: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    println!(
        "{what:<28} min {:7.2} ms   median {:7.2} ms   max {:7.2} ms   ({} runs)",
        ms[0],
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms.len()
    );
}

fn time<T>(f: impl Fn() -> T) -> Vec<f64> {
    drop(f()); // warm-up: page cache, allocator
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            let r = f();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            drop(r);
            ms
        })
        .collect()
}

fn main() {
    let Some(path) = model_path() else { return };
    let file = GgufFile::open(&path).expect("model opens");
    let h = file.header();
    let n_strings: usize = h
        .metadata
        .iter()
        .filter_map(|(_, v)| v.as_array())
        .filter(|a| a.elem_type() == minfer_gguf::ValueType::String)
        .map(|a| a.len())
        .sum();
    println!(
        "{}: {} bytes, header {} bytes, {} keys ({} strings in arrays), {} tensors",
        path.display(),
        file.file_len(),
        h.data_offset,
        h.metadata.len(),
        n_strings,
        h.tensors.len()
    );
    report(
        "GgufModel::open",
        time(|| GgufModel::open(&path).expect("model opens")),
    );
    let bytes = file.mapping();
    report(
        "parse_header (mapped)",
        time(|| parse_header(bytes, bytes.len() as u64).expect("header parses")),
    );
}

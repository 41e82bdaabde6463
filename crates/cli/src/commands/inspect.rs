//! `minfer inspect FILE`: metadata, tensor table and per-type totals of a GGUF model.

use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_gguf::{Array, GgufModel, Value};
use serde_json::{json, Map};
use std::io::Write;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The GGUF file (any part of a split model opens all parts).
    pub file: PathBuf,
    /// Emit one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// How many items of each metadata array to show (0: only the length and type).
    #[arg(long, default_value_t = 4)]
    pub array_items: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::args::not_a_directory(&args.file, "inspect")?;
    let t0 = std::time::Instant::now();
    let path = super::args::model_file(&args.file)?;
    let model =
        GgufModel::open(&path).with_context(|| format!("cannot open {}", args.file.display()))?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &to_json(&model, args.array_items))?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &model, args.array_items)?;
    }
    eprintln!("opened in {open_ms:.2} ms");
    Ok(())
}

fn array_json(a: &Array, n: usize) -> serde_json::Value {
    let first: Vec<serde_json::Value> = (0..a.len().min(n))
        .map(|i| match a {
            Array::String(v) => json!(v[i]),
            Array::F32(v) => json!(v[i]),
            Array::F64(v) => json!(v[i]),
            Array::Bool(v) => json!(v[i]),
            _ => a
                .item_to_string(i)
                .parse::<i128>()
                .map(|x| json!(x))
                .unwrap_or_else(|_| json!(a.item_to_string(i))),
        })
        .collect();
    json!({"type": "array", "elem_type": a.elem_type().name(), "len": a.len(), "first": first})
}

fn value_json(v: &Value, n: usize) -> serde_json::Value {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a, n),
    }
}

fn to_json(model: &GgufModel, n: usize) -> serde_json::Value {
    let mut md = Map::new();
    for (k, v) in model.metadata().iter() {
        md.insert(k.to_string(), value_json(v, n));
    }
    let tensors: Vec<_> = model
        .tensors()
        .iter()
        .map(|t| {
            json!({"name": t.info.name, "type": t.info.ty.name(), "shape": t.info.dims,
                   "bytes": t.info.n_bytes, "offset": model.parts()[t.part].tensor_file_offset(&t.info),
                   "part": t.part})
        })
        .collect();
    let totals: Vec<_> = model
        .bytes_per_type()
        .iter()
        .map(|(ty, b, c)| json!({"type": ty.name(), "tensors": c, "bytes": b}))
        .collect();
    let parts: Vec<_> = model
        .parts()
        .iter()
        .map(|p| json!({"path": p.path(), "version": p.header().version, "bytes": p.file_len()}))
        .collect();
    json!({"parts": parts, "metadata": md, "tensors": tensors, "totals": totals})
}

fn write_text(out: &mut impl Write, model: &GgufModel, n: usize) -> std::io::Result<()> {
    for p in model.parts() {
        writeln!(
            out,
            "file: {} (GGUF v{}, {} bytes, data at {})",
            p.path().display(),
            p.header().version,
            p.file_len(),
            p.header().data_offset
        )?;
    }
    writeln!(out, "\nmetadata ({} keys):", model.metadata().len())?;
    for (k, v) in model.metadata().iter() {
        match v {
            Value::Array(a) => {
                let items: Vec<String> = (0..a.len().min(n)).map(|i| a.item_to_string(i)).collect();
                let more = match (a.len() > n, items.is_empty()) {
                    (false, _) => "",
                    (true, true) => "…",
                    (true, false) => ", …",
                };
                writeln!(
                    out,
                    "  {k} = [{} × {}] [{}{more}]",
                    a.len(),
                    a.elem_type().name(),
                    items.join(", ")
                )?
            }
            Value::String(s) if s.len() > 120 || s.contains('\n') => {
                let head: String = s.chars().take(60).collect();
                writeln!(out, "  {k} = {head:?}… ({} bytes)", s.len())?
            }
            _ => writeln!(out, "  {k} = {v}")?,
        }
    }
    writeln!(out, "\ntensors ({}):", model.tensors().len())?;
    writeln!(
        out,
        "  {:<40} {:<6} {:<22} {:>12} {:>12}",
        "name", "type", "shape", "bytes", "offset"
    )?;
    for t in model.tensors() {
        let shape = format!("{:?}", t.info.dims);
        let off = model.parts()[t.part].tensor_file_offset(&t.info);
        writeln!(
            out,
            "  {:<40} {:<6} {:<22} {:>12} {:>12}",
            t.info.name,
            t.info.ty.name(),
            shape,
            t.info.n_bytes,
            off
        )?;
    }
    writeln!(out, "\ntotals per type:")?;
    let mut all = 0;
    for (ty, b, c) in model.bytes_per_type() {
        all += b;
        writeln!(out, "  {:<6} {:>5} tensors {:>14} bytes", ty.name(), c, b)?;
    }
    writeln!(
        out,
        "  {:<6} {:>5} tensors {:>14} bytes",
        "all",
        model.tensors().len(),
        all
    )
}

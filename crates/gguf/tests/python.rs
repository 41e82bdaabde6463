//! Cross-check with the reference implementation, gguf-py (the `gguf` package llama.cpp ships):
//! its reader must see in our files exactly what our reader sees, and our reader must read
//! back exactly what its writer was asked to write. Both sides are rendered to the JSON form
//! of scripts/gguf-py-dump.py (floats as IEEE bit patterns) and compared whole.
//!
//! Control: reading i16 values big-endian in header.rs makes both tests fail, naming the key
//! (`v.i16`: -14385 vs -12345; `py.i16`: 128 vs -32768).

mod common;

use common::*;
use minfer_gguf::{parse_header, Array, GgmlType, GgufWriter, Header, Value};
use serde_json::{json, Value as Json};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `$MINFER_PYTHON`, else the project venv; None (the test prints SKIP) when neither exists.
fn python() -> Option<PathBuf> {
    let p = std::env::var_os("MINFER_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .or_else(|| {
            let p = PathBuf::from("/root/.cache/minfer/venv/bin/python");
            p.exists().then_some(p)
        });
    if p.is_none() {
        eprintln!("SKIP: no Python with gguf (set MINFER_PYTHON or run scripts/venv)");
    }
    p
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// Runs a script and parses its JSON stdout; any failure fails the test loudly.
fn run_json(py: &Path, name: &str, file: &Path) -> Json {
    let out = Command::new(py)
        .arg(script(name))
        .arg(file)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("script prints JSON")
}

fn value_json(v: &Value) -> Json {
    let t = v.value_type() as u32;
    match v {
        Value::U8(x) => json!({"t": t, "v": x}),
        Value::I8(x) => json!({"t": t, "v": x}),
        Value::U16(x) => json!({"t": t, "v": x}),
        Value::I16(x) => json!({"t": t, "v": x}),
        Value::U32(x) => json!({"t": t, "v": x}),
        Value::I32(x) => json!({"t": t, "v": x}),
        Value::U64(x) => json!({"t": t, "v": x}),
        Value::I64(x) => json!({"t": t, "v": x}),
        Value::F32(x) => json!({"t": t, "v": format!("f32:{:08x}", x.to_bits())}),
        Value::F64(x) => json!({"t": t, "v": format!("f64:{:016x}", x.to_bits())}),
        Value::Bool(x) => json!({"t": t, "v": x}),
        Value::String(s) => json!({"t": t, "v": s}),
        Value::Array(a) => array_json(a),
    }
}

fn array_json(a: &Array) -> Json {
    fn each<T: Clone>(v: &[T], f: impl Fn(T) -> Value) -> Vec<Json> {
        v.iter().map(|x| value_json(&f(x.clone()))).collect()
    }
    let items = match a {
        Array::U8(v) => each(v, Value::U8),
        Array::I8(v) => each(v, Value::I8),
        Array::U16(v) => each(v, Value::U16),
        Array::I16(v) => each(v, Value::I16),
        Array::U32(v) => each(v, Value::U32),
        Array::I32(v) => each(v, Value::I32),
        Array::U64(v) => each(v, Value::U64),
        Array::I64(v) => each(v, Value::I64),
        Array::F32(v) => each(v, Value::F32),
        Array::F64(v) => each(v, Value::F64),
        Array::Bool(v) => each(v, Value::Bool),
        Array::String(v) => v
            .iter()
            .map(|s| value_json(&Value::String(s.into())))
            .collect(),
        Array::Nested(v) => v.iter().map(array_json).collect(),
    };
    json!({"t": 9, "et": a.elem_type() as u32, "v": items})
}

/// Our reader's view of `bytes` in the dump's JSON form.
fn our_json(bytes: &[u8]) -> Json {
    let h: Header = parse_header(bytes, bytes.len() as u64).expect("our reader parses it");
    let kv: Vec<Json> = h
        .metadata
        .iter()
        .map(|(k, v)| json!({"key": k, "value": value_json(v)}))
        .collect();
    let tensors: Vec<Json> = h
        .tensors
        .iter()
        .map(|t| {
            let start = (h.data_offset + t.offset) as usize;
            let data = &bytes[start..start + t.n_bytes as usize];
            json!({
                "name": t.name,
                "dims": t.dims,
                "type": t.ty.id(),
                "offset": t.offset,
                "n_bytes": t.n_bytes,
                "sha256": format!("{:x}", Sha256::digest(data)),
            })
        })
        .collect();
    json!({
        "version": h.version,
        "alignment": h.alignment,
        "data_offset": h.data_offset,
        "kv": kv,
        "tensors": tensors,
    })
}

/// Compares key by key and tensor by tensor first, so a failure names what differs.
fn assert_same(ours: &Json, theirs: &Json, fields: &[&str]) {
    for section in ["kv", "tensors"] {
        let (a, b) = (
            ours[section].as_array().unwrap(),
            theirs[section].as_array().unwrap(),
        );
        for (x, y) in a.iter().zip(b) {
            let x: serde_json::Map<_, _> = fields
                .iter()
                .filter_map(|f| x.get(*f).map(|v| (f.to_string(), v.clone())))
                .collect();
            let y: serde_json::Map<_, _> = fields
                .iter()
                .filter_map(|f| y.get(*f).map(|v| (f.to_string(), v.clone())))
                .collect();
            assert_eq!(x, y, "{section} entry differs");
        }
        assert_eq!(a.len(), b.len(), "{section} count differs");
    }
    for top in ["version", "alignment", "data_offset"] {
        if theirs.get(top).is_some() {
            assert_eq!(ours[top], theirs[top], "{top} differs");
        }
    }
}

const ALL_FIELDS: &[&str] = &[
    "key", "value", "name", "dims", "type", "offset", "n_bytes", "sha256",
];

fn every_value_type_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("general.alignment", Value::U32(128))
        .set("v.u8", Value::U8(0xAB))
        .set("v.i8", Value::I8(-100))
        .set("v.u16", Value::U16(0xBEEF))
        .set("v.i16", Value::I16(-12345))
        .set("v.u32", Value::U32(0xDEAD_BEEF))
        .set("v.i32", Value::I32(i32::MIN))
        .set("v.f32", Value::F32(-0.1))
        .set("v.bool.t", Value::Bool(true))
        .set("v.bool.f", Value::Bool(false))
        .set(
            "v.string",
            Value::String("ünïcödé ✓ 漢字 🦀 \u{0} tab\t".into()),
        )
        .set("v.string.empty", Value::String(String::new()))
        .set("v.u64", Value::U64(u64::MAX))
        .set("v.i64", Value::I64(i64::MIN + 1))
        .set("v.f64", Value::F64(std::f64::consts::PI))
        .set("a.u8", Value::Array(Array::U8(vec![0, 1, 255])))
        .set("a.i8", Value::Array(Array::I8(vec![-128, 127])))
        .set("a.u16", Value::Array(Array::U16(vec![1, 65535])))
        .set("a.i16", Value::Array(Array::I16(vec![-1])))
        .set("a.u32", Value::Array(Array::U32(vec![7; 5])))
        .set("a.i32", Value::Array(Array::I32(vec![-7, 7])))
        .set(
            "a.f32",
            Value::Array(Array::F32(vec![1e-45, -3.5, f32::MAX])),
        )
        .set("a.bool", Value::Array(Array::Bool(vec![true, false, true])))
        .set(
            "a.string",
            Value::Array(Array::String(vec!["", "é", "日本"].into())),
        )
        .set("a.u64", Value::Array(Array::U64(vec![u64::MAX, 0])))
        .set("a.i64", Value::Array(Array::I64(vec![i64::MIN])))
        .set("a.f64", Value::Array(Array::F64(vec![-0.0, 1e300])))
        .set("a.empty.f32", Value::Array(Array::F32(vec![])))
        .set(
            "a.empty.string",
            Value::Array(Array::String(Vec::<&str>::new().into())),
        )
        .set(
            "a.nested",
            Value::Array(Array::Nested(vec![
                Array::Nested(vec![Array::String(vec!["deep"].into()), Array::U8(vec![])]),
                Array::Nested(vec![]),
            ])),
        )
        .set(
            "a.nested.empty",
            Value::Array(Array::Nested(vec![Array::I32(vec![]), Array::I32(vec![1])])),
        );
    w.add_tensor("t.f32", &[3, 5], GgmlType::F32, pattern(60, 1))
        .unwrap();
    w.add_tensor("t.f16", &[7], GgmlType::F16, pattern(14, 2))
        .unwrap();
    w.add_tensor("t.q4_k", &[256, 2], GgmlType::Q4K, pattern(288, 3))
        .unwrap();
    w.add_tensor("t.q8_0", &[32, 1, 1, 3], GgmlType::Q8_0, pattern(102, 4))
        .unwrap();
    w.add_tensor("t.bf16", &[2, 2], GgmlType::Bf16, pattern(8, 5))
        .unwrap();
    w.to_bytes()
}

#[test]
fn python_reads_our_file_as_we_do() {
    let Some(py) = python() else { return };
    let bytes = every_value_type_file();
    let dir = tmp_dir("py-ours");
    let path = dir.join("ours.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let theirs = run_json(&py, "gguf-py-dump.py", &path);
    let ours = our_json(&bytes);
    assert_same(&ours, &theirs, ALL_FIELDS);
    assert_eq!(ours, theirs);
    // The alignment was honoured by both readers.
    assert_eq!(theirs["alignment"], 128);
    assert_eq!(theirs["data_offset"].as_u64().unwrap() % 128, 0);
    for t in theirs["tensors"].as_array().unwrap() {
        assert_eq!(t["offset"].as_u64().unwrap() % 128, 0, "{t}");
    }
}

#[test]
fn we_read_a_python_written_file_as_written() {
    let Some(py) = python() else { return };
    let dir = tmp_dir("py-theirs");
    let path = dir.join("theirs.gguf");
    let intended = run_json(&py, "gguf-py-write.py", &path);
    let bytes = std::fs::read(&path).unwrap();
    let ours = our_json(&bytes);
    // What its writer was asked to write (offsets are the writer's to choose)...
    assert_same(
        &ours,
        &intended,
        &["key", "value", "name", "dims", "type", "n_bytes", "sha256"],
    );
    // ...and where its reader finds everything, offsets included.
    let dumped = run_json(&py, "gguf-py-dump.py", &path);
    assert_eq!(ours, dumped);
}

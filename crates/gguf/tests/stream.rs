//! The streaming writer lays files out byte for byte like `GgufWriter::to_bytes` at any
//! alignment, and refuses plans that are not whole blocks by name.

use minfer_gguf::{write_streaming, Array, GgmlType, GgufWriter, TensorPlan, Value};
use std::path::PathBuf;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-gguf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn writer(align: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("t.u64", Value::U64(7))
        .set("t.arr", Value::Array(Array::String(vec!["a", "bc"].into())));
    if let Some(a) = align {
        w.set("general.alignment", Value::U32(a));
    }
    w.add_tensor("a", &[4, 2], GgmlType::F32, (0..32).collect())
        .unwrap();
    w.add_tensor("b", &[32], GgmlType::Q8_0, vec![1u8; 34])
        .unwrap();
    w.add_tensor("c", &[3], GgmlType::F16, vec![9u8; 6])
        .unwrap();
    w
}

fn plan(w: &GgufWriter) -> Vec<TensorPlan> {
    w.tensors
        .iter()
        .map(|t| TensorPlan {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .collect()
}

#[test]
fn streaming_write_matches_in_memory_bytes_at_default_and_64_alignment() {
    let dir = temp_dir("stream");
    for align in [None, Some(64)] {
        let w = writer(align);
        let path = dir.join("s.gguf");
        let r: minfer_gguf::Result<()> =
            write_streaming(&w.metadata, &plan(&w), &path, |i, out| {
                out.write_all(&w.tensors[i].data).unwrap();
                Ok(())
            });
        r.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), w.to_bytes(), "{align:?}");
        assert!(!minfer_gguf::partial_path(&path).exists());
        minfer_gguf::GgufModel::open(&path).unwrap();
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_plan_that_is_not_whole_blocks_is_refused_by_name() {
    let p = TensorPlan {
        name: "odd".into(),
        dims: vec![33, 2],
        ty: GgmlType::Q8_0,
    };
    let err = p.n_bytes().unwrap_err().to_string();
    assert!(err.contains("odd") && err.contains("Q8_0"), "{err}");
    let ok = TensorPlan {
        dims: vec![64, 2],
        ..p
    };
    assert_eq!(ok.n_bytes().unwrap(), 2 * 2 * 34);
}

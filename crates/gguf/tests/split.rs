//! Split models: `GgufWriter::write_split` output opens as one model whose tensor index is
//! the unsplit file's, from any part's path; broken split sets are refused by name.

mod common;

use common::*;
use minfer_gguf::{Error, GgmlType, GgufModel, GgufWriter, Value};
use std::path::PathBuf;

/// Seven tensors of mixed types and sizes, alignment 64.
fn model_writer() -> GgufWriter {
    let mut w = small_writer();
    w.set("general.alignment", Value::U32(64));
    w.add_tensor(
        "blk.0.ffn_up.weight",
        &[256, 2],
        GgmlType::Q4K,
        pattern(288, 4),
    )
    .unwrap();
    w.add_tensor(
        "blk.0.ffn_down.weight",
        &[64, 3],
        GgmlType::Q4_0,
        pattern(108, 5),
    )
    .unwrap();
    w.add_tensor(
        "blk.0.attn_norm.weight",
        &[16],
        GgmlType::F32,
        pattern(64, 6),
    )
    .unwrap();
    w.add_tensor("output.weight", &[256, 1], GgmlType::Q6K, pattern(210, 7))
        .unwrap();
    w
}

fn write_unsplit(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("whole.gguf");
    model_writer().write_to(&p).unwrap();
    p
}

/// Names, types, dims and bytes of every tensor, in index order.
fn index(m: &GgufModel) -> Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> {
    m.tensors()
        .iter()
        .map(|t| {
            let (info, bytes) = m.tensor_data(&t.info.name).unwrap();
            (
                info.name.clone(),
                info.ty,
                info.dims.clone(),
                bytes.to_vec(),
            )
        })
        .collect()
}

#[test]
fn split_set_opens_as_the_unsplit_model_from_any_part() {
    let dir = tmp_dir("split-any-part");
    let whole = GgufModel::open(write_unsplit(&dir)).unwrap();
    for n in [1u32, 2, 3, 7] {
        let sub = dir.join(format!("n{n}"));
        std::fs::create_dir_all(&sub).unwrap();
        let paths = model_writer().write_split(&sub, "m", n).unwrap();
        assert_eq!(paths.len(), n as usize);
        for p in &paths {
            let m = GgufModel::open(p).unwrap();
            assert_eq!(m.parts().len(), n as usize, "{}", p.display());
            assert_eq!(index(&m), index(&whole), "opened from {}", p.display());
            // The model metadata is the unsplit file's plus the three split keys.
            let mut md = m.metadata().clone();
            assert_eq!(md.get_u64("split.no"), Some(0));
            assert_eq!(md.get_u64("split.count"), Some(n as u64));
            assert_eq!(md.get_u64("split.tensors.count"), Some(7));
            for k in ["split.no", "split.count", "split.tensors.count"] {
                md.remove(k);
            }
            assert_eq!(&md, whole.metadata());
        }
        // Every part holds at least one tensor and keeps the alignment.
        for p in &paths {
            let f = minfer_gguf::GgufFile::open(p).unwrap();
            assert!(!f.header().tensors.is_empty());
            assert_eq!(f.header().alignment, 64);
        }
    }
}

#[test]
fn split_keys_have_llama_cpp_types() {
    // gguf-split writes split.no and split.count as u16 and split.tensors.count as i32.
    let dir = tmp_dir("split-types");
    let paths = model_writer().write_split(&dir, "m", 2).unwrap();
    let f = minfer_gguf::GgufFile::open(&paths[1]).unwrap();
    let md = &f.header().metadata;
    assert_eq!(md.get("split.no"), Some(&Value::U16(1)));
    assert_eq!(md.get("split.count"), Some(&Value::U16(2)));
    assert_eq!(md.get("split.tensors.count"), Some(&Value::I32(7)));
    // Only the first part carries the model metadata.
    assert_eq!(md.get_str("general.architecture"), None);
    assert!(paths[0].ends_with("m-00001-of-00002.gguf"));
}

#[test]
fn write_split_refuses_impossible_counts() {
    let dir = tmp_dir("split-counts");
    for n in [0u32, 8] {
        let e = model_writer().write_split(&dir, "m", n).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    }
}

fn split_err(e: Error) -> (PathBuf, String) {
    match e {
        Error::Split { path, problem } => (path, problem),
        other => panic!("expected Error::Split, got {other:?}"),
    }
}

fn three_parts(name: &str) -> Vec<PathBuf> {
    let dir = tmp_dir(name);
    model_writer().write_split(&dir, "m", 3).unwrap()
}

#[test]
fn split_part_missing() {
    let paths = three_parts("split-missing");
    std::fs::remove_file(&paths[1]).unwrap();
    for p in [&paths[0], &paths[2]] {
        let (path, problem) = split_err(GgufModel::open(p).unwrap_err());
        assert_eq!(path, paths[1]);
        assert!(problem.contains("part 2 of 3 is missing"), "{problem}");
    }
}

#[test]
fn split_part_duplicated() {
    // Part 1 copied over part 2: two files claim split.no 0.
    let paths = three_parts("split-dup");
    std::fs::copy(&paths[0], &paths[1]).unwrap();
    let (path, problem) = split_err(GgufModel::open(&paths[0]).unwrap_err());
    assert_eq!(path, paths[1]);
    assert!(
        problem.contains("split.no is Some(0), expected 1"),
        "{problem}"
    );
}

#[test]
fn split_count_mismatched() {
    let paths = three_parts("split-count");
    // Patch part 3's split.count (a u16) to 4.
    let mut b = std::fs::read(&paths[2]).unwrap();
    let at = fields(&b).kv("split.count").value_at;
    b[at..at + 2].copy_from_slice(&4u16.to_le_bytes());
    std::fs::write(&paths[2], &b).unwrap();
    let (path, problem) = split_err(GgufModel::open(&paths[0]).unwrap_err());
    assert_eq!(path, paths[2]);
    assert!(
        problem.contains("split.count is Some(4), expected 3"),
        "{problem}"
    );
    // Opened from that part, the file name and the key disagree.
    let (_, problem) = split_err(GgufModel::open(&paths[2]).unwrap_err());
    assert!(
        problem.contains("file name says 3 parts, split.count says 4"),
        "{problem}"
    );
}

#[test]
fn split_tensors_duplicated_across_parts() {
    let dir = tmp_dir("split-dup-tensor");
    let src = model_writer();
    for (no, range) in [(0u16, 0..4), (1, 3..7)] {
        let mut part = GgufWriter::new();
        if no == 0 {
            part.metadata = src.metadata.clone();
        } else {
            part.set("general.alignment", Value::U32(64));
        }
        part.set("split.no", Value::U16(no))
            .set("split.count", Value::U16(2))
            .set("split.tensors.count", Value::I32(7));
        part.tensors = src.tensors[range].to_vec();
        part.write_to(dir.join(format!("m-0000{}-of-00002.gguf", no + 1)))
            .unwrap();
    }
    let (path, problem) =
        split_err(GgufModel::open(dir.join("m-00001-of-00002.gguf")).unwrap_err());
    assert!(path.ends_with("m-00002-of-00002.gguf"));
    assert!(
        problem.contains("tensor \"blk.0.ffn_up.weight\" appears in more than one part"),
        "{problem}"
    );
}

#[test]
fn split_tensors_count_wrong() {
    let paths = three_parts("split-tcount");
    let mut b = std::fs::read(&paths[0]).unwrap();
    let at = fields(&b).kv("split.tensors.count").value_at;
    wr_u32(&mut b, at, 8);
    std::fs::write(&paths[0], &b).unwrap();
    let (_, problem) = split_err(GgufModel::open(&paths[1]).unwrap_err());
    assert!(
        problem.contains("split.tensors.count is 8 but the parts hold 7 tensors"),
        "{problem}"
    );
}

#[test]
fn split_name_without_split_keys() {
    let dir = tmp_dir("split-nokeys");
    let p = dir.join("m-00001-of-00002.gguf");
    model_writer().write_to(&p).unwrap();
    let (_, problem) = split_err(GgufModel::open(&p).unwrap_err());
    assert!(
        problem.contains("one of 2 parts but it has no split.count"),
        "{problem}"
    );
}

#[test]
fn split_keys_with_a_plain_name() {
    let dir = tmp_dir("split-plainname");
    let paths = model_writer().write_split(&dir, "m", 2).unwrap();
    let p = dir.join("renamed.gguf");
    std::fs::rename(&paths[0], &p).unwrap();
    let (_, problem) = split_err(GgufModel::open(&p).unwrap_err());
    assert!(
        problem.contains("not PREFIX-NNNNN-of-MMMMM.gguf"),
        "{problem}"
    );
}

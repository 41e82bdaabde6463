//! Crafted corrupt files: each must give a typed error naming the problem and its byte offset,
//! never a panic, never heap use beyond `common::alloc_bound` (checked by `common::parse`).
//!
//! Control: disabling a check in header.rs (e.g. the `n_dims == 0` test, the duplicate-name
//! pass, or the bool 0/1 check) makes the matching test fail with "corrupt file parsed".

mod common;

use common::*;
use minfer_gguf::{Array, Error, GgmlType, GgufModel, GgufWriter, Value};

fn one_kv(key: &str, v: Value) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set(key, v);
    w.to_bytes()
}

/// Writer output for one tensor and the field map.
fn one_tensor(dims: &[u64], ty: GgmlType, n_bytes: usize) -> (Vec<u8>, Fields) {
    let mut w = GgufWriter::new();
    w.add_tensor("w", dims, ty, pattern(n_bytes, 9)).unwrap();
    let b = w.to_bytes();
    let f = fields(&b);
    (b, f)
}

fn truncated(e: &Error) -> (u64, &'static str) {
    match e {
        Error::Truncated { offset, what, .. } => (*offset, what),
        other => panic!("expected Truncated, got {other:?}"),
    }
}

fn count_too_large(e: &Error) -> (u64, u64, &'static str) {
    match e {
        Error::CountTooLarge {
            offset,
            count,
            what,
            ..
        } => (*offset, *count, what),
        other => panic!("expected CountTooLarge, got {other:?}"),
    }
}

fn bad_tensor(e: &Error) -> (&str, u64, &str) {
    match e {
        Error::BadTensor {
            name,
            offset,
            problem,
        } => (name, *offset, problem),
        other => panic!("expected BadTensor, got {other:?}"),
    }
}

// --- magic, version, counts ----------------------------------------------------------------

#[test]
fn bad_magic() {
    let mut b = small_file();
    b[..4].copy_from_slice(b"GGML");
    let e = parse_err(&b);
    assert!(matches!(e, Error::BadMagic { found } if &found == b"GGML"));
    assert_mentions(&e, &["magic", "offset 0"]);
}

#[test]
fn unknown_versions() {
    for v in [0u32, 1, 4, 0x0300_0000] {
        let mut b = small_file();
        wr_u32(&mut b, 4, v);
        let e = parse_err(&b);
        assert!(matches!(e, Error::UnsupportedVersion { version } if version == v));
        assert_mentions(&e, &[&format!("version {v}"), "offset 4"]);
        assert_eq!(
            e.to_string().contains("big-endian"),
            v == 0x0300_0000,
            "{e}"
        );
    }
}

#[test]
fn truncated_in_magic() {
    let e = parse_err(&small_file()[..2]);
    assert_eq!(truncated(&e), (0, "magic"));
    assert_mentions(&e, &["offset 0", "magic"]);
}

#[test]
fn truncated_in_version() {
    let e = parse_err(&small_file()[..6]);
    assert_eq!(truncated(&e), (4, "version"));
    assert_mentions(&e, &["offset 4", "version"]);
}

#[test]
fn truncated_in_tensor_count() {
    let e = parse_err(&small_file()[..13]);
    assert_eq!(truncated(&e), (8, "tensor count"));
    assert_mentions(&e, &["offset 8"]);
}

#[test]
fn truncated_in_kv_count() {
    let e = parse_err(&one_kv("k", Value::U8(1))[..20]);
    assert_eq!(truncated(&e), (16, "metadata entry count"));
    assert_mentions(&e, &["offset 16"]);
}

#[test]
fn tensor_count_2_pow_63() {
    let mut b = small_file();
    wr_u64(&mut b, N_TENSORS_AT, 1 << 63);
    let e = parse_err(&b);
    assert_eq!(count_too_large(&e), (8, 1 << 63, "tensor count"));
    assert_mentions(&e, &["tensor count 9223372036854775808", "offset 8"]);
}

#[test]
fn kv_count_2_pow_63() {
    let mut b = small_file();
    wr_u64(&mut b, N_KV_AT, 1 << 63);
    let e = parse_err(&b);
    assert_eq!(count_too_large(&e), (16, 1 << 63, "metadata entry count"));
    assert_mentions(&e, &["9223372036854775808", "offset 16"]);
}

#[test]
fn kv_count_one_too_many_runs_into_tensor_infos() {
    // The count fits the bytes left, so the parser reads the first tensor info as a key/value:
    // its n_dims (1 or 2) becomes the key's value type... whatever it hits, it must be typed.
    let mut b = small_file();
    let n = rd_u64(&b, N_KV_AT);
    wr_u64(&mut b, N_KV_AT, n + 1);
    let e = parse_err(&b);
    assert!(!matches!(e, Error::Io { .. } | Error::Invalid(_)), "{e:?}");
}

// --- metadata: every value type truncated ----------------------------------------------------

/// Truncates a one-key file `cut` bytes into the value and checks the error names `what` at
/// the value's offset (+ `field_offset` for fields inside the value).
fn check_value_truncation(v: Value, cut: usize, field_offset: usize, what: &str) {
    let b = one_kv("k", v);
    let kv = fields(&b).kvs[0].clone();
    let e = parse_err(&b[..kv.value_at + cut]);
    let off = (kv.value_at + field_offset) as u64;
    match &e {
        Error::Truncated {
            offset, what: w, ..
        }
        | Error::CountTooLarge {
            offset, what: w, ..
        } => {
            assert_eq!((*offset, *w), (off, what), "{e}");
        }
        other => panic!("expected Truncated or CountTooLarge, got {other:?}"),
    }
    assert_mentions(&e, &[&format!("offset {off}"), what]);
}

macro_rules! value_truncation_tests {
    ($($name:ident: $v:expr, $cut:expr, $field:expr, $what:expr;)*) => {$(
        #[test]
        fn $name() {
            check_value_truncation($v, $cut, $field, $what);
        }
    )*};
}

value_truncation_tests! {
    truncated_u8_value: Value::U8(1), 0, 0, "u8 value";
    truncated_i8_value: Value::I8(-1), 0, 0, "i8 value";
    truncated_u16_value: Value::U16(1), 1, 0, "u16 value";
    truncated_i16_value: Value::I16(1), 1, 0, "i16 value";
    truncated_u32_value: Value::U32(1), 3, 0, "u32 value";
    truncated_i32_value: Value::I32(1), 2, 0, "i32 value";
    truncated_f32_value: Value::F32(1.0), 1, 0, "f32 value";
    truncated_bool_value: Value::Bool(true), 0, 0, "bool value";
    truncated_u64_value: Value::U64(1), 7, 0, "u64 value";
    truncated_i64_value: Value::I64(1), 4, 0, "i64 value";
    truncated_f64_value: Value::F64(1.0), 1, 0, "f64 value";
    truncated_string_length: Value::String("hello".into()), 5, 0, "string value length";
    truncated_string_body: Value::String("hello".into()), 10, 0, "string value length";
    truncated_array_type: Value::Array(Array::U32(vec![1, 2])), 2, 0, "value type";
    truncated_array_count: Value::Array(Array::U32(vec![1, 2])), 6, 4, "array element count";
    truncated_array_elements: Value::Array(Array::U32(vec![1, 2])), 14, 4, "array element count";
    truncated_string_array_element: Value::Array(Array::String(vec!["ab", "cd"].into())), 12 + 10 + 9, 22, "string array element length";
    truncated_nested_array: Value::Array(Array::Nested(vec![Array::U8(vec![1, 2, 3])])), 12 + 13, 16, "array element count";
}

fn two_kvs() -> (Vec<u8>, KvAt) {
    let mut w = GgufWriter::new();
    w.set("general.name", Value::String("x".into()))
        .set("general.a_rather_long_key_name", Value::U8(1));
    let b = w.to_bytes();
    let second = fields(&b).kvs[1].clone();
    (b, second)
}

#[test]
fn truncated_in_key() {
    let (b, kv) = two_kvs();
    // Inside the second key's length field, then inside its bytes.
    let e = parse_err(&b[..kv.at + 3]);
    assert_eq!(truncated(&e), (kv.at as u64, "metadata key length"));
    assert_mentions(&e, &[&format!("offset {}", kv.at), "metadata key length"]);
    let e = parse_err(&b[..kv.at + 8 + 4]);
    assert_eq!(
        count_too_large(&e),
        (kv.at as u64, 30, "metadata key length")
    );
    assert_mentions(
        &e,
        &[
            "metadata key length 30",
            &format!("offset {}", kv.at),
            "4 bytes left",
        ],
    );
}

#[test]
fn truncated_in_value_type() {
    let (b, kv) = two_kvs();
    let e = parse_err(&b[..kv.type_at + 2]);
    assert_eq!(truncated(&e), (kv.type_at as u64, "value type"));
}

#[test]
fn counts_are_checked_against_the_bytes_left_first() {
    // Three tensor infos need at least 96 bytes; 4 are left after the tensor count.
    let e = parse_err(&small_file()[..20]);
    assert_eq!(count_too_large(&e), (8, 3, "tensor count"));
    assert_mentions(&e, &["tensor count 3 at offset 8", "4 bytes left"]);
}

// --- metadata: lengths and counts --------------------------------------------------------------

#[test]
fn string_length_2_pow_63() {
    let mut b = one_kv("k", Value::String("abc".into()));
    let at = fields(&b).kvs[0].value_at;
    wr_u64(&mut b, at, 1 << 63);
    let e = parse_err(&b);
    assert_eq!(
        count_too_large(&e),
        (at as u64, 1 << 63, "string value length")
    );
}

#[test]
fn key_length_past_the_end() {
    let mut b = small_file();
    let len = b.len() as u64;
    wr_u64(&mut b, 24, len);
    let e = parse_err(&b);
    assert_eq!(count_too_large(&e), (24, len, "metadata key length"));
}

#[test]
fn array_length_2_pow_63() {
    for arr in [
        Array::U8(vec![1]),
        Array::U64(vec![1]),
        Array::String(vec!["x"].into()),
        Array::Nested(vec![Array::Bool(vec![])]),
    ] {
        let mut b = one_kv("k", Value::Array(arr));
        let at = fields(&b).kvs[0].value_at + 4;
        wr_u64(&mut b, at, 1 << 63);
        let e = parse_err(&b);
        assert_eq!(
            count_too_large(&e),
            (at as u64, 1 << 63, "array element count")
        );
    }
}

#[test]
fn unknown_value_type() {
    let mut b = small_file();
    let at = fields(&b).kvs[2].type_at;
    wr_u32(&mut b, at, 13);
    let e = parse_err(&b);
    assert!(matches!(e, Error::BadValueType { type_id: 13, offset } if offset == at as u64));
    assert_mentions(&e, &["type 13", &format!("offset {at}")]);
}

#[test]
fn duplicate_keys() {
    // Two keys of equal length; patch the second into the first.
    let mut w = GgufWriter::new();
    w.set("key.a", Value::U32(1)).set("key.b", Value::U32(2));
    let mut b = w.to_bytes();
    let second = fields(&b).kv("key.b").clone();
    b[second.at + 8 + 4] = b'a';
    let e = parse_err(&b);
    assert!(
        matches!(&e, Error::DuplicateKey { key, offset } if key == "key.a" && *offset == second.at as u64)
    );
    assert_mentions(&e, &["\"key.a\"", &format!("offset {}", second.at)]);
}

#[test]
fn invalid_utf8_key_value_and_tensor_name() {
    // In a key.
    let mut b = small_file();
    b[24 + 8] = 0xFF;
    assert!(matches!(parse_err(&b), Error::BadUtf8 { offset: 24 }));
    // In a string value.
    let mut b = small_file();
    let kv = fields(&b).kv("general.name").clone();
    b[kv.value_at + 8] = 0xC3; // a lone lead byte
    let e = parse_err(&b);
    assert!(matches!(e, Error::BadUtf8 { offset } if offset == kv.value_at as u64));
    assert_mentions(&e, &["UTF-8", &format!("offset {}", kv.value_at)]);
    // In a tensor name.
    let mut b = small_file();
    let t = fields(&b).tensors[1].clone();
    b[t.at + 8 + 2] = 0x80;
    assert!(matches!(parse_err(&b), Error::BadUtf8 { offset } if offset == t.at as u64));
}

#[test]
fn invalid_utf8_in_a_string_array() {
    let mut b = one_kv(
        "k",
        Value::Array(Array::String(vec!["ok", "bad", "ok"].into())),
    );
    let second = fields(&b).kvs[0].value_at + 12 + 8 + 2;
    b[second + 8 + 1] = 0xFE; // never valid in UTF-8
    let e = parse_err(&b);
    assert!(
        matches!(e, Error::BadUtf8 { offset } if offset == second as u64),
        "{e:?}"
    );
    assert_mentions(&e, &[&format!("offset {second}")]);
}

#[test]
fn a_char_split_across_two_array_strings_is_invalid() {
    // "é" is C3 A9: as the strings "\xC3" and "\xA9" each is invalid, although their
    // concatenation (what the parser validates in one pass) is valid.
    let mut b = one_kv("k", Value::Array(Array::String(vec!["x", "y"].into())));
    let first = fields(&b).kvs[0].value_at + 12;
    b[first + 8] = 0xC3;
    b[first + 9 + 8] = 0xA9;
    let e = parse_err(&b);
    assert!(
        matches!(e, Error::BadUtf8 { offset } if offset == first as u64),
        "{e:?}"
    );
}

#[test]
fn bool_not_0_or_1() {
    let mut b = small_file();
    let at = fields(&b).kv("t.bool").value_at;
    b[at] = 2;
    let e = parse_err(&b);
    assert!(matches!(e, Error::BadBool { value: 2, offset } if offset == at as u64));
    assert_mentions(&e, &["bool value 2", &format!("offset {at}")]);
    // Inside a bool array too.
    let mut b = one_kv("k", Value::Array(Array::Bool(vec![true, false, true])));
    let at = fields(&b).kvs[0].value_at + 12 + 1;
    b[at] = 0xFF;
    assert!(matches!(parse_err(&b), Error::BadBool { value: 255, offset } if offset == at as u64));
}

#[test]
fn nesting_too_deep() {
    let mut a = Array::U8(vec![1]);
    for _ in 0..4 {
        a = Array::Nested(vec![a]);
    }
    let b = one_kv("k", Value::Array(a));
    let e = parse_err(&b);
    assert!(matches!(e, Error::NestingTooDeep { max: 4, .. }));
    assert_mentions(&e, &["nested deeper than 4", "offset"]);
    // Four levels of arrays (three nested in the top one) are accepted: the control.
    let mut a = Array::U8(vec![1]);
    for _ in 0..3 {
        a = Array::Nested(vec![a]);
    }
    parse(&one_kv("k", Value::Array(a))).unwrap();
}

// --- general.alignment -------------------------------------------------------------------------

fn alignment_error(v: Value) -> Error {
    let mut w = small_writer();
    w.set("general.alignment", v);
    let b = w.to_bytes();
    let at = fields(&b).kv("general.alignment").at;
    let e = parse_err(&b);
    assert!(
        matches!(&e, Error::BadKey { key, offset, .. } if key == "general.alignment" && *offset == at as u64),
        "{e:?}"
    );
    assert_mentions(&e, &["general.alignment", &format!("offset {at}")]);
    e
}

#[test]
fn alignment_zero() {
    assert_mentions(&alignment_error(Value::U32(0)), &["found u32 0"]);
}

#[test]
fn alignment_not_a_power_of_two() {
    assert_mentions(&alignment_error(Value::U32(3)), &["power of two", "u32 3"]);
}

#[test]
fn alignment_wrong_type() {
    assert_mentions(&alignment_error(Value::U64(32)), &["found u64 32"]);
    assert_mentions(&alignment_error(Value::String("32".into())), &["string"]);
}

// --- tensor infos ------------------------------------------------------------------------------

#[test]
fn truncated_in_tensor_info_fields() {
    let b = small_file();
    // The last of three infos: the ones before it leave enough bytes for the tensor count
    // check (3 x 32 bytes), so the parser gets to read into the cut.
    let t = fields(&b).tensors[2].clone();
    let cases = [
        (t.at + 4, t.at, "tensor name length"),
        (t.at + 10, t.at, "tensor name length"),
        (t.n_dims_at + 2, t.n_dims_at, "tensor dimension count"),
        (t.dims_at + 5, t.dims_at, "tensor dimension"),
        (t.type_at + 1, t.type_at, "tensor type"),
        (t.offset_at + 7, t.offset_at, "tensor offset"),
    ];
    for (cut, at, what) in cases {
        let e = parse_err(&b[..cut]);
        match &e {
            Error::Truncated {
                offset, what: w, ..
            }
            | Error::CountTooLarge {
                offset, what: w, ..
            } => {
                assert_eq!((*offset, *w), (at as u64, what), "cut at {cut}: {e}")
            }
            other => panic!("cut at {cut}: expected a truncation, got {other:?}"),
        }
        assert_mentions(&e, &[&format!("offset {at}"), what]);
    }
}

#[test]
fn tensor_count_is_checked_again_against_the_bytes_after_the_metadata() {
    let b = small_file();
    let t = fields(&b).tensors[1].clone();
    let e = parse_err(&b[..t.at + 4]);
    let left = t.at + 4 - t.at + (t.at - fields(&b).tensors[0].at);
    assert_eq!(count_too_large(&e), (8, 3, "tensor count"));
    assert_mentions(&e, &[&format!("{left} bytes left")]);
}

#[test]
fn truncated_in_data_section() {
    let b = small_file();
    let f = fields(&b);
    let last = f.tensor("output_norm.weight");
    // Cut the last tensor's data by one byte.
    let h = parse(&b).unwrap();
    let info = &h.tensors[2];
    let end = (h.data_offset + info.offset + info.n_bytes) as usize;
    let e = parse_err(&b[..end - 1]);
    let (name, off, problem) = bad_tensor(&e);
    assert_eq!((name, off), ("output_norm.weight", last.at as u64));
    assert!(
        problem.contains("runs past the end of the file"),
        "{problem}"
    );
    // Exactly to the end is fine (the control): padding after the last tensor is optional.
    parse(&b[..end]).unwrap();
}

#[test]
fn dimension_product_overflows() {
    let (mut b, f) = one_tensor(&[4, 2], GgmlType::F32, 32);
    let t = &f.tensors[0];
    wr_u64(&mut b, t.dims_at, 1 << 32);
    wr_u64(&mut b, t.dims_at + 8, 1 << 32);
    let e = parse_err(&b);
    let (name, off, problem) = bad_tensor(&e);
    assert_eq!((name, off), ("w", t.at as u64));
    assert!(problem.contains("overflow the element count"), "{problem}");
    // 2^62 F32 elements fit the element count but are 2^64 bytes.
    wr_u64(&mut b, t.dims_at, 1 << 31);
    wr_u64(&mut b, t.dims_at + 8, 1 << 31);
    let e = parse_err(&b);
    assert!(bad_tensor(&e).2.contains("overflow the byte size"), "{e}");
}

#[test]
fn zero_dimension() {
    let (mut b, f) = one_tensor(&[4, 2], GgmlType::F32, 32);
    wr_u64(&mut b, f.tensors[0].dims_at + 8, 0);
    let e = parse_err(&b);
    assert!(bad_tensor(&e).2.contains("zero dimension [4, 0]"), "{e}");
    assert_mentions(&e, &[&format!("offset {}", f.tensors[0].at)]);
}

#[test]
fn zero_and_five_dimensions() {
    for n in [0u32, 5, u32::MAX] {
        let (mut b, f) = one_tensor(&[4, 2], GgmlType::F32, 32);
        wr_u32(&mut b, f.tensors[0].n_dims_at, n);
        let e = parse_err(&b);
        let problem = bad_tensor(&e).2;
        assert!(
            problem.contains(&format!("has {n} dimensions")),
            "{problem}"
        );
        assert!(
            problem.contains(&format!("offset {}", f.tensors[0].n_dims_at)),
            "{problem}"
        );
    }
}

#[test]
fn data_offset_past_the_end() {
    for off in [1u64 << 20, u64::MAX - 31] {
        let (mut b, f) = one_tensor(&[8], GgmlType::F32, 32);
        wr_u64(&mut b, f.tensors[0].offset_at, off);
        let e = parse_err(&b);
        let problem = bad_tensor(&e).2;
        assert!(
            problem.contains("runs past the end of the file"),
            "{problem}"
        );
        assert!(problem.contains(&format!("data {off}..+32")), "{problem}");
    }
}

#[test]
fn misaligned_data_offset() {
    let b = small_file();
    let t = fields(&b).tensors[1].clone();
    let mut b = b;
    let off = rd_u64(&b, t.offset_at);
    wr_u64(&mut b, t.offset_at, off + 4);
    let e = parse_err(&b);
    let (name, _, problem) = bad_tensor(&e);
    assert_eq!(name, "blk.0.attn_q.weight");
    assert!(
        problem.contains("not a multiple of the alignment 32"),
        "{problem}"
    );
    assert!(
        problem.contains(&format!("offset {}", t.offset_at)),
        "{problem}"
    );
}

#[test]
fn overlapping_tensors() {
    let b = small_file();
    let f = fields(&b);
    let data = parse(&b).unwrap().data_offset;
    let mut b = b;
    // The F32 tensor holds data bytes 0..48; move the Q8_0 one (68 bytes) to 32.
    wr_u64(&mut b, f.tensors[1].offset_at, 32);
    let e = parse_err(&b);
    match &e {
        Error::OverlappingTensors {
            a,
            b: bn,
            a_start,
            a_end,
            b_start,
            ..
        } => {
            assert_eq!(
                (a.as_str(), bn.as_str()),
                ("token_embd.weight", "blk.0.attn_q.weight")
            );
            assert_eq!((*a_start, *a_end, *b_start), (data, data + 48, data + 32));
        }
        other => panic!("expected OverlappingTensors, got {other:?}"),
    }
    assert_mentions(&e, &["overlap", &format!("{}..{}", data, data + 48)]);
}

#[test]
fn removed_type_ids_are_named() {
    for (id, name) in [(31u32, "Q4_0_4_4"), (4, "Q4_2"), (38, "IQ4_NL_8_8")] {
        let (mut b, f) = one_tensor(&[8], GgmlType::F32, 32);
        wr_u32(&mut b, f.tensors[0].type_at, id);
        let e = parse_err(&b);
        let problem = bad_tensor(&e).2;
        assert!(
            problem.contains(name) && problem.contains("removed"),
            "{problem}"
        );
        assert!(
            problem.contains(&format!("offset {}", f.tensors[0].type_at)),
            "{problem}"
        );
    }
}

#[test]
fn unknown_type_id() {
    let (mut b, f) = one_tensor(&[8], GgmlType::F32, 32);
    wr_u32(&mut b, f.tensors[0].type_at, 999);
    let e = parse_err(&b);
    assert!(bad_tensor(&e).2.contains("unknown type id 999"), "{e}");
}

#[test]
fn unsupported_known_type_is_refused_by_name() {
    // IQ2_XXS parses (its geometry is known) but the model refuses to compute with it.
    let mut w = GgufWriter::new();
    w.add_tensor(
        "blk.0.ffn_up.weight",
        &[256],
        GgmlType::Iq2Xxs,
        pattern(66, 1),
    )
    .unwrap();
    let dir = tmp_dir("iq2xxs");
    let p = dir.join("m.gguf");
    w.write_to(&p).unwrap();
    let m = GgufModel::open(&p).unwrap();
    let e = m.check_supported_types().unwrap_err();
    assert!(
        matches!(&e, Error::UnsupportedType { name, ty } if name == "blk.0.ffn_up.weight" && ty == "IQ2_XXS")
    );
    assert_mentions(&e, &["IQ2_XXS", "blk.0.ffn_up.weight"]);
}

#[test]
fn duplicate_tensor_names() {
    // Two names of equal length; patch the second into the first.
    let mut w = GgufWriter::new();
    w.add_tensor("t.a", &[8], GgmlType::F32, pattern(32, 1))
        .unwrap();
    w.add_tensor("t.b", &[8], GgmlType::F32, pattern(32, 2))
        .unwrap();
    let mut b = w.to_bytes();
    let second = fields(&b).tensor("t.b").clone();
    b[second.at + 8 + 2] = b'a';
    let e = parse_err(&b);
    assert!(
        matches!(&e, Error::DuplicateTensor { name, offset } if name == "t.a" && *offset == second.at as u64),
        "{e:?}"
    );
    assert_mentions(&e, &["\"t.a\"", &format!("offset {}", second.at)]);
}

#[test]
fn row_length_not_a_multiple_of_the_block_size() {
    let (mut b, f) = one_tensor(&[32, 2], GgmlType::Q8_0, 68);
    wr_u64(&mut b, f.tensors[0].dims_at, 16);
    wr_u64(&mut b, f.tensors[0].dims_at + 8, 4);
    let e = parse_err(&b);
    let problem = bad_tensor(&e).2;
    assert!(problem.contains("row length 16"), "{problem}");
    assert!(problem.contains("Q8_0 block size 32"), "{problem}");
}

#[test]
fn empty_file_on_disk() {
    let dir = tmp_dir("empty");
    let p = dir.join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    let e = GgufModel::open(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Truncated {
                offset: 0,
                what: "magic",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn missing_file_names_the_path() {
    let e = GgufModel::open("/nonexistent/minfer/model.gguf").unwrap_err();
    assert!(matches!(e, Error::Io { .. }));
    assert_mentions(&e, &["/nonexistent/minfer/model.gguf"]);
}

//! Shared by the hardening tests: a counting allocator (peak bytes per parse, per thread),
//! a field map of well-formed files for byte surgery, and a small valid model.
#![allow(dead_code)] // each test binary uses a different subset

use minfer_gguf::{parse_header, Array, Error, GgmlType, GgufWriter, Header, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

// ---------------------------------------------------------------------------------------------
// Counting allocator

/// Counts live heap bytes per thread (tests run on several threads; a parse runs on one).
struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn track(delta: i64) {
    // try_with: during thread teardown the slots may be gone; those frees are not a parse's.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

// SAFETY: every call forwards to the system allocator unchanged; the bookkeeping touches only
// const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            track(l.size() as i64);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            track(l.size() as i64);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) };
        track(-(l.size() as i64));
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            // Old and new blocks may coexist during the copy: count the peak as both.
            track(new as i64);
            track(-(l.size() as i64));
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result with the peak heap bytes it held above what was live
/// when it started (on this thread).
pub fn peak_alloc<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, (peak - base).max(0) as u64)
}

/// The most heap a parse of `len` bytes may hold: 8 bytes per file byte plus 64 KiB.
///
/// Why 8: counts are walked against the bytes before anything is reserved, so memory follows
/// what the file really encodes. The densest encodings cost at most 5.5 heap bytes per file
/// byte (measured by `allocation_bound_holds_for_the_densest_encodings` in mutation.rs:
/// 16-byte metadata entries hold an 80-byte entry, an 8-byte key offset and a 4-byte index
/// slot, 5.4x; 12-byte empty nested arrays a 48-byte Array, 4.0x; 32-byte tensor infos a
/// TensorInfo, its dims and two index slots, 3.0x; string arrays one buffer plus 8 bytes a
/// string, 1.0x). 8 leaves headroom for changes to those structs without hiding a
/// count-driven reservation, which costs far more (see the control in that test). The
/// 64 KiB covers costs that do not scale with the file (error strings, small headers).
pub fn alloc_bound(len: usize) -> u64 {
    8 * len as u64 + 64 * 1024
}

/// `parse_header` over the whole buffer, asserting the allocation bound.
pub fn parse(bytes: &[u8]) -> Result<Header, Error> {
    let (r, peak) = peak_alloc(|| parse_header(bytes, bytes.len() as u64));
    assert!(
        peak <= alloc_bound(bytes.len()),
        "parse of {} bytes held {peak} heap bytes (bound {})",
        bytes.len(),
        alloc_bound(bytes.len())
    );
    r
}

/// The error a corrupt buffer must produce (panics with the header if it parsed).
pub fn parse_err(bytes: &[u8]) -> Error {
    match parse(bytes) {
        Ok(h) => panic!(
            "corrupt file parsed: {} tensors, {} keys",
            h.tensors.len(),
            h.metadata.len()
        ),
        Err(e) => e,
    }
}

/// Asserts the message mentions every needle.
pub fn assert_mentions(e: &Error, needles: &[&str]) {
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} does not mention {n:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// A small valid model

/// Metadata of several types and three tensors (F32, Q8_0, F16) at alignment 32.
pub fn small_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("general.name", Value::String("tiny".into()))
        .set("llama.block_count", Value::U32(1))
        .set("llama.rope.freq_base", Value::F32(10000.0))
        .set("t.bool", Value::Bool(true))
        .set("t.u64", Value::U64(7))
        .set(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["<s>", "a", "bc"].into())),
        )
        .set(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0, -1.0, -2.0])),
        )
        .set(
            "t.nested",
            Value::Array(Array::Nested(vec![
                Array::I16(vec![1, 2]),
                Array::U8(vec![]),
            ])),
        );
    w.add_tensor("token_embd.weight", &[4, 3], GgmlType::F32, pattern(48, 1))
        .unwrap();
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[32, 2],
        GgmlType::Q8_0,
        pattern(68, 2),
    )
    .unwrap();
    w.add_tensor("output_norm.weight", &[4], GgmlType::F16, pattern(8, 3))
        .unwrap();
    w
}

pub fn small_file() -> Vec<u8> {
    small_writer().to_bytes()
}

/// Deterministic non-constant bytes.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Field map of a well-formed file (walked independently of the reader under test)

#[derive(Debug, Clone)]
pub struct KvAt {
    pub key: String,
    /// Offset of the key's length field.
    pub at: usize,
    pub type_at: usize,
    pub value_at: usize,
    pub end: usize,
}

#[derive(Debug, Clone)]
pub struct TensorAt {
    pub name: String,
    /// Offset of the name's length field.
    pub at: usize,
    pub n_dims_at: usize,
    pub dims_at: usize,
    pub type_at: usize,
    pub offset_at: usize,
    pub end: usize,
}

#[derive(Debug, Clone)]
pub struct Fields {
    pub kvs: Vec<KvAt>,
    pub tensors: Vec<TensorAt>,
    pub header_end: usize,
}

impl Fields {
    pub fn kv(&self, key: &str) -> &KvAt {
        self.kvs.iter().find(|k| k.key == key).expect("key in file")
    }
    pub fn tensor(&self, name: &str) -> &TensorAt {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .expect("tensor in file")
    }
}

pub const N_TENSORS_AT: usize = 8;
pub const N_KV_AT: usize = 16;

pub fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
pub fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
pub fn wr_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn wr_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn skip_value(b: &[u8], at: usize, ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => at + 1,
        2 | 3 => at + 2,
        4..=6 => at + 4,
        10..=12 => at + 8,
        8 => at + 8 + rd_u64(b, at) as usize,
        9 => {
            let et = rd_u32(b, at);
            let n = rd_u64(b, at + 4) as usize;
            let mut p = at + 12;
            for _ in 0..n {
                p = skip_value(b, p, et);
            }
            p
        }
        _ => panic!("bad type {ty} in a well-formed file"),
    }
}

/// Maps the fields of a file the writer produced.
pub fn fields(b: &[u8]) -> Fields {
    let n_t = rd_u64(b, N_TENSORS_AT) as usize;
    let n_kv = rd_u64(b, N_KV_AT) as usize;
    let mut p = 24;
    let mut kvs = Vec::new();
    for _ in 0..n_kv {
        let at = p;
        let klen = rd_u64(b, p) as usize;
        let key = String::from_utf8(b[p + 8..p + 8 + klen].to_vec()).unwrap();
        let type_at = p + 8 + klen;
        let value_at = type_at + 4;
        let end = skip_value(b, value_at, rd_u32(b, type_at));
        kvs.push(KvAt {
            key,
            at,
            type_at,
            value_at,
            end,
        });
        p = end;
    }
    let mut tensors = Vec::new();
    for _ in 0..n_t {
        let at = p;
        let nlen = rd_u64(b, p) as usize;
        let name = String::from_utf8(b[p + 8..p + 8 + nlen].to_vec()).unwrap();
        let n_dims_at = p + 8 + nlen;
        let nd = rd_u32(b, n_dims_at) as usize;
        let dims_at = n_dims_at + 4;
        let type_at = dims_at + 8 * nd;
        let offset_at = type_at + 4;
        let end = offset_at + 8;
        tensors.push(TensorAt {
            name,
            at,
            n_dims_at,
            dims_at,
            type_at,
            offset_at,
            end,
        });
        p = end;
    }
    Fields {
        kvs,
        tensors,
        header_end: p,
    }
}

/// A fresh empty directory for one test (under the target's temp dir, unique per process).
pub fn tmp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-gguf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

//! `minfer convert` (issue 17) against an oracle and a reference forward.
//!
//! scripts/make-hf-checkpoint.py builds small Qwen2 (bf16, tied), LLaMA (bf16, untied, two
//! shards) and Qwen3 (f32, untied, head_dim != hidden/heads) checkpoints with a real qwen2
//! BPE vocabulary (taken from the cached demo model, so llama.cpp's pre-tokenizer hash
//! table knows it), and the greedy continuation of a prompt by a numpy forward that follows
//! the Hugging Face modelling code (rotate-half RoPE on the checkpoint's layout).
//! scripts/convert-reference.py converts the same checkpoint with the `gguf` package by
//! convert_hf_to_gguf.py's rules (that script itself needs torch, too heavy for the venv).
//!
//! Gates: the f32 conversion's greedy continuation under minfer's reference forward equals
//! the numpy forward's (checked first: it shares nothing with the oracle); our GGUF is
//! byte-identical to the oracle's for every out type tried (so every key, value type,
//! tokenizer array, tensor name, shape, type and encoding agrees, and their order).
//! Controls: skipping the LLaMA q/k permutation fails the LLaMA greedy gate; writing the
//! norms as F16 (`tensor_type`) fails the byte gate.
//!
//! SKIP without the venv (gguf, safetensors, tokenizers, numpy), the demo model, or the
//! llama.cpp source (for its pre-tokenizer hash table).

use minfer_convert::{ConvertError, OutType};
use minfer_gguf::GgufModel;
use minfer_models::{reference, HParams};
use minfer_testkit::models;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> Option<PathBuf> {
    let p = std::env::var_os("MINFER_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/venv/bin/python"))
        })
        .filter(|p| p.exists())?;
    let ok = Command::new(&p)
        .args(["-c", "import gguf, safetensors, tokenizers, numpy"])
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(p)
}

fn llama_cpp() -> Option<PathBuf> {
    let p = std::env::var_os("MINFER_LLAMA_CPP_SRC")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| {
                PathBuf::from(h)
                    .join(".cache/minfer/peer/src/llama_cpp_python-0.3.36/vendor/llama.cpp")
            })
        })?;
    p.join("conversion/base.py").exists().then_some(p)
}

struct Env {
    py: PathBuf,
    llama: PathBuf,
    vocab: PathBuf,
    dir: PathBuf,
}

fn env(name: &str) -> Option<Env> {
    let (Some(py), Some(llama), Some(vocab)) = (python(), llama_cpp(), models::qwen()) else {
        eprintln!("SKIP: needs the venv (gguf, safetensors, tokenizers), the llama.cpp source and the demo model");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("minfer-convert-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Some(Env {
        py,
        llama,
        vocab,
        dir,
    })
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn checkpoint(e: &Env, name: &str, args: &[&str]) -> PathBuf {
    let ck = e.dir.join(name);
    run(Command::new(&e.py)
        .arg(script("make-hf-checkpoint.py"))
        .arg(&ck)
        .arg("--vocab-from")
        .arg(&e.vocab)
        .args(args));
    ck
}

fn outtype_name(t: OutType) -> &'static str {
    match t {
        OutType::F32 => "f32",
        OutType::F16 => "f16",
        OutType::Bf16 => "bf16",
        OutType::Q8_0 => "q8_0",
    }
}

fn ours(ck: &Path, t: OutType) -> PathBuf {
    let out = ck.with_extension(format!("ours-{}.gguf", outtype_name(t)));
    minfer_convert::convert(ck, &out, t, &mut |_, _| {}).unwrap();
    out
}

fn oracle(e: &Env, ck: &Path, t: OutType) -> PathBuf {
    let out = ck.with_extension(format!("oracle-{}.gguf", outtype_name(t)));
    run(Command::new(&e.py)
        .arg(script("convert-reference.py"))
        .arg(ck)
        .arg(&out)
        .args(["--outtype", outtype_name(t), "--llama-cpp"])
        .arg(&e.llama));
    out
}

/// Byte identity, and on failure the first metadata key or tensor that differs.
fn assert_same_gguf(a: &Path, b: &Path) {
    if std::fs::read(a).unwrap() == std::fs::read(b).unwrap() {
        return;
    }
    let (ma, mb) = (GgufModel::open(a).unwrap(), GgufModel::open(b).unwrap());
    let ka: Vec<_> = ma.metadata().iter().collect();
    let kb: Vec<_> = mb.metadata().iter().collect();
    for (x, y) in ka.iter().zip(&kb) {
        assert_eq!(x, y, "metadata differs");
    }
    assert_eq!(ka.len(), kb.len(), "metadata key counts differ");
    for (x, y) in ma.tensors().iter().zip(mb.tensors()) {
        assert_eq!(
            (&x.info.name, &x.info.dims, x.info.ty),
            (&y.info.name, &y.info.dims, y.info.ty)
        );
        assert!(
            ma.tensor_data(&x.info.name).unwrap().1 == mb.tensor_data(&y.info.name).unwrap().1,
            "tensor {} bytes differ",
            x.info.name
        );
    }
    panic!(
        "{} and {} differ outside metadata and tensors",
        a.display(),
        b.display()
    );
}

/// Greedy continuation under minfer's plain reference forward (f64).
fn greedy(gguf: &Path, prompt: &[u32], steps: usize) -> Vec<u32> {
    let model = GgufModel::open(gguf).unwrap();
    let hp = HParams::from_metadata(model.metadata()).unwrap();
    let mut ids = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let logits = reference::forward(&model, &hp, &ids).unwrap();
        let last = logits.last().unwrap();
        let best = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap() as u32;
        out.push(best);
        ids.push(best);
    }
    out
}

/// The greedy gate first (it shares nothing with the oracle), then the bytes.
fn check(e: &Env, ck: &Path, types: &[OutType]) {
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("reference.json")).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        r[k].as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let want = ids("greedy");
    let f32_path = ours(ck, OutType::F32);
    assert_eq!(
        greedy(&f32_path, &ids("prompt_ids"), want.len()),
        want,
        "{}: greedy continuation differs from the numpy forward's",
        ck.display()
    );
    for &t in types {
        let mine = if t == OutType::F32 {
            f32_path.clone()
        } else {
            ours(ck, t)
        };
        assert_same_gguf(&mine, &oracle(e, ck, t));
    }
}

#[test]
fn qwen2_converts_as_the_oracle_and_generates_as_the_source() {
    let Some(e) = env("qwen2") else { return };
    let ck = checkpoint(&e, "qwen2", &["--arch", "qwen2", "--dtype", "bf16"]);
    check(
        &e,
        &ck,
        &[OutType::F32, OutType::F16, OutType::Bf16, OutType::Q8_0],
    );
    let _ = std::fs::remove_dir_all(&e.dir);
}

#[test]
fn sharded_untied_llama_converts_as_the_oracle_and_generates_as_the_source() {
    let Some(e) = env("llama") else { return };
    let ck = checkpoint(
        &e,
        "llama",
        &[
            "--arch", "llama", "--dtype", "bf16", "--untied", "--shards", "2",
        ],
    );
    check(&e, &ck, &[OutType::F32, OutType::Q8_0]);
    let _ = std::fs::remove_dir_all(&e.dir);
}

#[test]
fn qwen3_converts_as_the_oracle_and_generates_as_the_source() {
    let Some(e) = env("qwen3") else { return };
    let ck = checkpoint(
        &e,
        "qwen3",
        &["--arch", "qwen3", "--dtype", "f32", "--untied"],
    );
    check(&e, &ck, &[OutType::F32, OutType::Bf16]);
    let _ = std::fs::remove_dir_all(&e.dir);
}

/// A minimal safetensors file with one f32 tensor.
fn write_safetensors(path: &Path, name: &str, shape: &[u64]) {
    let n: u64 = shape.iter().product::<u64>() * 4;
    let header =
        serde_json::json!({name: {"dtype": "F32", "shape": shape, "data_offsets": [0, n]}});
    let h = header.to_string();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(h.as_bytes());
    bytes.resize(bytes.len() + n as usize, 0);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn unknown_architectures_missing_files_and_unknown_tensors_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("minfer-convert-refuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.gguf");
    let conv =
        |d: &Path| minfer_convert::convert(d, &out, OutType::F16, &mut |_, _| {}).unwrap_err();
    // No config.json.
    let e = conv(&dir);
    assert!(
        matches!(e, ConvertError::MissingFile { .. }) && e.to_string().contains("config.json"),
        "{e}"
    );
    let config = |arch: &str| {
        serde_json::json!({"architectures": [arch], "num_hidden_layers": 1,
            "max_position_embeddings": 64, "hidden_size": 8, "intermediate_size": 16,
            "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
            "vocab_size": 4})
        .to_string()
    };
    std::fs::write(dir.join("config.json"), config("MambaForCausalLM")).unwrap();
    let e = conv(&dir);
    assert!(e.to_string().contains("MambaForCausalLM"), "{e}");
    std::fs::write(dir.join("config.json"), config("Qwen2ForCausalLM")).unwrap();
    let e = conv(&dir);
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
    // A tiny BPE tokenizer whose pre-tokenizer no table entry matches is refused too.
    let tok = serde_json::json!({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3},
        "merges": ["a b"]}, "added_tokens": []});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    let e = conv(&dir);
    assert!(
        matches!(e, ConvertError::Tokenizer { .. }) || e.to_string().contains("pre-tokenizer"),
        "{e}"
    );
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_tensor_is_refused_by_name() {
    let Some(e) = env("unknown") else { return };
    let ck = checkpoint(
        &e,
        "q",
        &["--arch", "qwen2", "--layers", "1", "--steps", "1"],
    );
    std::fs::remove_file(ck.join("model.safetensors")).unwrap();
    write_safetensors(
        &ck.join("model.safetensors"),
        "model.layers.0.mlp.mystery.weight",
        &[4, 4],
    );
    let err = minfer_convert::convert(&ck, &e.dir.join("x.gguf"), OutType::F16, &mut |_, _| {})
        .unwrap_err();
    assert!(matches!(err, ConvertError::UnknownTensor { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("model.layers.0.mlp.mystery.weight"),
        "{err}"
    );
    assert!(!e.dir.join("x.gguf").exists());
    let _ = std::fs::remove_dir_all(&e.dir);
}

//! Issue 30's rough edges a newcomer from llama.cpp hits first: its multi-letter flags
//! answered with minfer's equivalent, `run -p`/`-f`, `-c`/`--ctx-size`/`--n-ctx` alike,
//! `serve --host localhost`, a too-small `serve -c` refused, `--numerics llamacpp-*` with
//! `--cache-type auto`, and counts in the right number.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

/// One tiny model per process, written before any test reads it.
fn tiny() -> PathBuf {
    static MODEL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let d = std::env::temp_dir().join(format!("minfer-habits-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("tiny.gguf");
            let spec = SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128);
            std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
            p
        })
        .clone()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn run(args: &[&str]) -> Output {
    minfer()
        .args(["run", "-t", "1", "-m"])
        .arg(tiny())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn llama_cpp_multi_letter_flags_are_answered_with_minfers_equivalent() {
    for (args, needles) in [
        (&["run", "-cnv"][..], &["'-cnv'", "minfer chat"][..]),
        (&["serve", "-fa"][..], &["'-fa'", "fused"][..]),
        (&["run", "-ctk", "q8_0", "hi"][..], &["--cache-type"][..]),
        (&["run", "-sys", "be brief", "hi"][..], &["--system"][..]),
    ] {
        let o = minfer().args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
        for n in needles {
            assert!(err(&o).contains(n), "{args:?}: {}", err(&o));
        }
        assert!(!err(&o).contains("invalid value"), "{args:?}: {}", err(&o));
    }
    // After `--` they are prompt text (`-ngl` too, which before `--` is `--gpu-layers`:
    // crates/cli/tests/offload.rs).
    let o = run(&["--no-template", "-n", "1", "--temp", "0", "--", "-ngl"]);
    assert!(o.status.success(), "{}", err(&o));
}

#[test]
fn run_takes_the_prompt_by_p_and_f_as_llama_cpp() {
    let ids = |o: &Output| -> serde_json::Value {
        assert!(o.status.success(), "{}", err(o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["prompt_ids"].clone()
    };
    let base = ["--no-template", "-n", "1", "--temp", "0", "--json"];
    let positional = ids(&run(&[&base[..], &["Hello there"]].concat()));
    let p = ids(&run(&[&base[..], &["-p", "Hello there"]].concat()));
    let f = std::env::temp_dir().join(format!("minfer-habits-prompt-{}.txt", std::process::id()));
    std::fs::write(&f, "Hello there\n").unwrap();
    let file = ids(&run(&[&base[..], &["-f", f.to_str().unwrap()]].concat()));
    assert_eq!(positional, p);
    assert_eq!(positional, file, "one trailing newline dropped");
    let o = run(&[&base[..], &["-p", "a", "b"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
}

/// `-c`, `--ctx-size` and `--n-ctx` the same in every command that takes a context: run,
/// chat, serve (its too-small refusal names the value read) and perplexity (its past-the-
/// model refusal does). Control: `--ctx` (not one of the three) is refused by each.
#[test]
fn the_context_flag_has_llama_cpps_three_spellings() {
    for flag in ["-c", "--ctx-size", "--n-ctx"] {
        let o = run(&["--no-template", "-n", "1", "--temp", "0", flag, "64", "hi"]);
        assert!(o.status.success(), "{flag}: {}", err(&o));
        let o = minfer()
            .args([
                "chat", "-t", "1", "-n", "1", "--temp", "0", flag, "64", "-m",
            ])
            .arg(tiny())
            .arg("hi")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "chat {flag}: {}", err(&o));
        let o = minfer()
            .args(["serve", "--port", "0", flag, "1", "-m"])
            .arg(tiny())
            .output()
            .unwrap();
        assert!(err(&o).contains("-c 1:"), "serve {flag}: {}", err(&o));
        let o = minfer()
            .args(["perplexity", "-f", "/dev/null", flag, "100000", "-m"])
            .arg(tiny())
            .output()
            .unwrap();
        assert!(
            err(&o).contains("-c 100000:"),
            "perplexity {flag}: {}",
            err(&o)
        );
    }
    for cmd in ["run", "chat", "serve", "perplexity"] {
        let o = minfer().args([cmd, "--ctx", "64"]).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", err(&o));
    }
}

#[test]
fn serve_binds_localhost_and_refuses_a_context_too_small() {
    let o = minfer()
        .args(["serve", "--port", "0", "-c", "1", "-m"])
        .arg(tiny())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("-c 1"), "{}", err(&o));
    let mut child = minfer()
        .args([
            "serve",
            "--host",
            "localhost",
            "--port",
            "0",
            "-t",
            "1",
            "-m",
        ])
        .arg(tiny())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut seen = String::new();
    let listening = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.starts_with("listening on ") => break l,
            Ok(l) => seen.push_str(&(l + "\n")),
            Err(_) => break String::new(),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        listening.contains("http://127.0.0.1:") || listening.contains("http://[::1]:"),
        "{seen}{listening}"
    );
}

#[test]
fn llamacpp_numerics_with_auto_cache_type_pick_f16() {
    // Q8_0 weights: llama.cpp's x86 numerics reproduce its quantized matmuls only.
    let d = std::env::temp_dir().join(format!("minfer-habits-q8-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let m = d.join("q8.gguf");
    let mut spec = SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128);
    spec.weight_type = minfer_gguf::GgmlType::Q8_0;
    std::fs::write(&m, synthesize(&spec).unwrap().to_bytes()).unwrap();
    let with_cache = |ty: &str| {
        minfer()
            .args(["run", "-t", "1", "-m"])
            .arg(&m)
            .args(["--numerics", "llamacpp-x86-avx2", "--cache-type", ty])
            .args(["--no-template", "-n", "4", "--temp", "0", "--json", "hi"])
            .output()
            .unwrap()
    };
    let o = with_cache("auto");
    if err(&o).contains("cannot run") || err(&o).contains("not supported") {
        println!("SKIP: {}", err(&o));
        return;
    }
    assert!(o.status.success(), "{}", err(&o));
    // It is f16: the same reply as with an f16 KV.
    let reply = |o: &Output| {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (v["generated_ids"].clone(), v["text"].clone())
    };
    let f16 = with_cache("f16");
    assert!(f16.status.success(), "{}", err(&f16));
    assert_eq!(reply(&o), reply(&f16));
    // Control: an f32 KV, which auto picked before, is refused with these numerics.
    let f32 = with_cache("f32");
    assert!(!f32.status.success(), "{}", err(&f32));
    assert!(err(&f32).contains("f16"), "{}", err(&f32));
}

#[test]
fn counts_of_one_are_singular() {
    let o = run(&["--no-template", "-n", "1", "--temp", "0", "hi"]);
    assert!(o.status.success(), "{}", err(&o));
    let e = err(&o);
    assert!(e.contains("generated: 1 token in"), "{e}");
}

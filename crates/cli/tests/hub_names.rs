//! `hf:` names through the binary (issue 17): `HF_ENDPOINT` and `HF_TOKEN` from the
//! environment, `minfer pull`, `-m hf:…` on a command, `minfer list` and `minfer rm`,
//! against scripts/hf-test-server.py on loopback. The download rules themselves are tested
//! in crates/hub/tests/hub.rs.

use minfer_gguf::{GgmlType, GgufWriter, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

#[test]
fn pull_run_list_and_rm_by_hub_name() {
    let dir = std::env::temp_dir().join(format!("minfer-cli-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let repo = dir.join("root/tester/tiny-GGUF");
    std::fs::create_dir_all(&repo).unwrap();
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.add_tensor("t.weight", &[8], GgmlType::F32, vec![0; 32])
        .unwrap();
    w.write_to(repo.join("tiny-Q8_0.gguf")).unwrap();
    w.write_to(repo.join("tiny-F16.gguf")).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf-test-server.py");
    let mut server = Command::new("python3")
        .arg(script)
        .arg("--root")
        .arg(dir.join("root"))
        .args(["--token", "tok"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().strip_prefix("PORT ").unwrap().parse().unwrap();
    let models = dir.join("models");
    let run = |args: &[&str], token: &str| {
        let out = minfer()
            .args(args)
            .env("MINFER_MODELS", &models)
            .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}/"))
            .env("HF_TOKEN", token)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = run(&["pull", "hf:tester/tiny-GGUF:q8_0"], "bad");
    assert!(!ok && err.contains("HF_TOKEN was refused"), "{err}");
    let (ok, out, err) = run(&["pull", "hf:tester/tiny-GGUF:q8_0"], "tok");
    assert!(ok && out.contains("fetched and verified"), "{out}{err}");
    // -m hf:… on a command: F16 is not cached yet, so it comes from the hub first.
    let (ok, out, err) = run(&["inspect", "hf:tester/tiny-GGUF:F16", "--json"], "tok");
    assert!(ok && out.contains("t.weight"), "{out}{err}");
    let (ok, out, _) = run(&["list"], "tok");
    assert!(ok, "{out}");
    assert!(out.contains("hf:tester/tiny-GGUF:tiny-Q8_0.gguf"), "{out}");
    assert!(out.contains("hf:tester/tiny-GGUF:tiny-F16.gguf"), "{out}");
    let (ok, out, err) = run(&["rm", "hf:tester/tiny-GGUF:Q8_0"], "tok");
    assert!(ok && out.contains("removed"), "{out}{err}");
    let (ok, _, err) = run(&["rm", "hf:tester/tiny-GGUF:Q8_0"], "tok");
    assert!(!ok && err.contains("not in the cache"), "{err}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

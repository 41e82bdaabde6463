//! Runs one of the repository's checker scripts (`scripts/*.py`) under a Python interpreter,
//! feeding it `input` on stdin: `(exit status ok, stdout)`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

pub fn pipe(python: &Path, script: &str, input: &str) -> (bool, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(script);
    let mut child = Command::new(python)
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} {}: {e}", python.display(), path.display()));
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.as_bytes())
        .expect("writing the script's input");
    let out = child.wait_with_output().expect("the script's output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

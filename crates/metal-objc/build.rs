//! On macOS with Xcode's tools, precompiles the kernel library (`xcrun metal` + `metallib`)
//! and hands its path to the crate as MINFER_METALLIB; otherwise the device compiles the
//! embedded sources at start.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../metal/kernels");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("macos") {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let src = out.join("minfer.metal");
    let air = out.join("minfer.air");
    let lib = out.join("minfer.metallib");
    if std::fs::write(&src, minfer_metal::source::library_source()).is_err() {
        return;
    }
    let ok = |cmd: &mut Command| cmd.status().map(|s| s.success()).unwrap_or(false);
    let built = ok(Command::new("xcrun")
        .args(["-sdk", "macosx", "metal", "-c"])
        .arg(&src)
        .arg("-o")
        .arg(&air))
        && ok(Command::new("xcrun")
            .args(["-sdk", "macosx", "metallib"])
            .arg(&air)
            .arg("-o")
            .arg(&lib));
    if built {
        println!("cargo:rustc-env=MINFER_METALLIB={}", lib.display());
    } else {
        println!("cargo:warning=xcrun metal unavailable: the kernel library is compiled from source at start");
    }
}

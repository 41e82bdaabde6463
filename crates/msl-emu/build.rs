//! Compiles every `.metal` file of crates/metal/kernels (and the deliberately broken kernels of
//! tests/broken, used by the detector tests) as C++17 with g++ against the shim standard
//! library, into one static library the emulator links.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/rewrite.rs"]
#[allow(dead_code)]
mod rewrite;

fn metal_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "metal"))
        .collect();
    v.sort();
    v
}

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !status.success() {
        panic!("command failed ({status}): {cmd:?}");
    }
}

/// Points a kernel object's half <-> float library calls (soft-float code when F16C is not
/// assumed) at the runtime's bit-exact fast versions. Without objcopy the kernels keep the
/// library calls: slower, same results.
fn redirect_half_calls(objcopy: &str, obj: &Path) {
    let ok = Command::new(objcopy)
        .args([
            "--redefine-sym",
            "__extendhfsf2=emu_extendhfsf2",
            "--redefine-sym",
            "__truncsfhf2=emu_truncsfhf2",
        ])
        .arg(obj)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!(
            "cargo:warning={objcopy} failed on {}: the kernels keep the library half conversions",
            obj.display()
        );
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let kernels = manifest.join("../metal/kernels");
    let broken = manifest.join("tests/broken");
    let shim = manifest.join("cpp");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".to_string());
    let objcopy = std::env::var("OBJCOPY").unwrap_or_else(|_| "objcopy".to_string());
    for d in [&kernels, &broken, &shim] {
        println!("cargo:rerun-if-changed={}", d.display());
    }
    println!("cargo:rerun-if-changed=build/rewrite.rs");
    println!("cargo:rerun-if-env-changed=CXX");
    println!("cargo:rerun-if-env-changed=OBJCOPY");

    let flags = [
        "-std=c++17",
        "-O3",
        "-fno-plt",
        "-fPIC",
        "-fsigned-char",
        "-fno-exceptions",
        "-Wno-unused-parameter",
        "-Wno-unused-variable",
    ];
    // extra compiler flags for the kernels and the runtime (e.g. -DEMU_FORCE_UCONTEXT)
    println!("cargo:rerun-if-env-changed=MINFER_EMU_CXXFLAGS");
    let extra: Vec<String> = std::env::var("MINFER_EMU_CXXFLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut objects = Vec::new();
    let mut stems = Vec::new();
    let files: Vec<(PathBuf, String)> = metal_files(&kernels)
        .into_iter()
        .map(|p| {
            let label = format!("kernels/{}", p.file_name().unwrap().to_string_lossy());
            (p, label)
        })
        .chain(metal_files(&broken).into_iter().map(|p| {
            let label = format!("tests/broken/{}", p.file_name().unwrap().to_string_lossy());
            (p, label)
        }))
        .collect();
    for (n, (path, label)) in files.iter().enumerate() {
        let src = std::fs::read_to_string(path).unwrap();
        let stem = format!("f{n}_{}", path.file_stem().unwrap().to_string_lossy());
        let rw = rewrite::rewrite(&src, label, &stem, (n as u32) * 10_000)
            .unwrap_or_else(|e| panic!("rewrite {}: {e}", path.display()));
        let cpp = out.join(format!("{stem}.cpp"));
        std::fs::write(&cpp, rw.cpp).unwrap();
        let obj = out.join(format!("{stem}.o"));
        run(Command::new(&cxx)
            .args(flags)
            .args(&extra)
            .arg("-I")
            .arg(&shim)
            .arg("-I")
            .arg(path.parent().unwrap())
            .arg("-I")
            .arg(&kernels)
            .arg("-c")
            .arg(&cpp)
            .arg("-o")
            .arg(&obj));
        redirect_half_calls(&objcopy, &obj);
        objects.push(obj);
        stems.push(stem);
    }
    let mut reg = String::new();
    for s in &stems {
        reg.push_str(&format!("extern \"C\" void emu_register_{s}();\n"));
    }
    reg.push_str("extern \"C\" void emu_register_all() {\n");
    for s in &stems {
        reg.push_str(&format!("    emu_register_{s}();\n"));
    }
    reg.push_str("}\n");
    let reg_cpp = out.join("emu_register_all.cpp");
    std::fs::write(&reg_cpp, reg).unwrap();
    for (src, name) in [
        (reg_cpp, "emu_register_all.o"),
        (shim.join("emu_runtime.cpp"), "emu_runtime.o"),
    ] {
        let obj = out.join(name);
        run(Command::new(&cxx)
            .args(flags)
            .args(&extra)
            .arg("-I")
            .arg(&shim)
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj));
        objects.push(obj);
    }
    let lib = out.join("libmslemu.a");
    let _ = std::fs::remove_file(&lib);
    run(Command::new("ar").arg("crs").arg(&lib).args(&objects));
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=mslemu");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}

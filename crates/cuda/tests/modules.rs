//! The program as several NVRTC modules (crates/cuda/src/compile.rs), checked without a GPU:
//! every kernel the executor launches is in exactly one module, each module's kernels are
//! the whole program's (the PTX of every entry equal once line numbers and per-module label
//! numbers are set aside), modules are cached one by one under keys that cover the defines,
//! and a module that does not compile is an error naming its file with NVRTC's log; NVRTC's
//! CUBIN images (`MINFER_CUDA_IMAGE=cubin`) are ELF and cached apart from the PTX.
//! Run for `MINFER_CUDA_ARCH` (scripts/nvrtc-check sets it), or the device's architecture;
//! SKIP (pass) where neither is there.

#![cfg(feature = "cuda")]

use std::collections::HashMap;
use std::path::PathBuf;

use minfer_cuda::compile;
use minfer_cuda::device::KERNELS;

fn arch() -> Option<String> {
    match std::env::var("MINFER_CUDA_ARCH") {
        Ok(a) => Some(a),
        Err(_) => match minfer_cuda::available() {
            Ok(()) => Some("sm_90".into()),
            Err(why) => {
                println!("SKIP: no CUDA device ({why}) and no MINFER_CUDA_ARCH");
                None
            }
        },
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-modules-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Each `.entry` of a PTX text, by name, with what differs between a module and the whole
/// program for the same code set aside: `.loc`/`.file` lines (line numbers move) and the
/// numbers in labels and local depots (they count functions of the module).
fn entries(ptx: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut cur: Option<(String, String, i32)> = None;
    for line in ptx.lines() {
        let t = line.trim();
        if cur.is_none() {
            if let Some(rest) = t.strip_prefix(".visible .entry ") {
                let name = rest.split('(').next().unwrap_or("").trim().to_string();
                cur = Some((name, String::new(), 0));
            } else {
                continue;
            }
        }
        let (_, body, depth) = cur.as_mut().expect("set above");
        if t.starts_with(".loc") || t.starts_with(".file") {
            continue;
        }
        body.push_str(&normalise(t));
        body.push('\n');
        *depth += t.matches('{').count() as i32 - t.matches('}').count() as i32;
        if *depth == 0 && t.contains('}') {
            let (name, body, _) = cur.take().expect("set above");
            out.insert(name, body);
        }
    }
    out
}

/// Digits right after `__BB`, `__local_depot`, `func_begin`, `func_end` and `$L__tmp` become
/// `#`, and a `$N` NVRTC appends to a name two files both declare (each attention file's
/// `extern __shared__` array `sh`: `sh$1` in the whole program) is dropped.
fn normalise(line: &str) -> String {
    let mut s = String::new();
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let after_name = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if b[i] == b'$' && after_name && b.get(i + 1).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
            while b.get(i).is_some_and(|c| c.is_ascii_digit()) {
                i += 1;
            }
            continue;
        }
        s.push(b[i] as char);
        i += 1;
    }
    for marker in ["__BB", "__local_depot", "func_begin", "func_end", "$L__tmp"] {
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(i) = rest.find(marker) {
            out.push_str(&rest[..i + marker.len()]);
            rest = &rest[i + marker.len()..];
            let n = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
            if n > 0 {
                out.push('#');
            }
            rest = &rest[n..];
        }
        out.push_str(rest);
        s = out;
    }
    s
}

/// The first line where `a` and `b` differ, both shown (None: equal).
fn first_difference(a: &str, b: &str) -> Option<String> {
    if a == b {
        return None;
    }
    let (mut la, mut lb) = (a.lines(), b.lines());
    let mut n = 0;
    loop {
        n += 1;
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (x, y) => return Some(format!("line {n}: module {x:?}, whole program {y:?}")),
        }
    }
}

#[test]
fn modules_hold_the_whole_programs_kernels_and_cache_one_by_one() {
    let Some(arch) = arch() else { return };
    let sources = compile::sources(None).unwrap();
    let prelude = compile::prelude("", false);
    let mods = compile::modules(&prelude, &sources);
    let dir = temp_dir("cache");
    let p = compile::start(mods.clone(), &arch, Some(&dir)).unwrap();
    assert_eq!(p.compiling(), mods.len(), "a fresh cache holds nothing");
    let (out, report) = p.join().unwrap();
    println!("{}", report.describe());
    assert_eq!(report.cached, 0);

    // Every launched kernel in exactly one module.
    let per_module: Vec<(String, HashMap<String, String>)> = out
        .iter()
        .map(|c| (c.file.clone(), entries(c.image.ptx().expect("PTX images"))))
        .collect();
    for k in KERNELS {
        let holders: Vec<&str> = per_module
            .iter()
            .filter(|(_, e)| e.contains_key(*k))
            .map(|(f, _)| f.as_str())
            .collect();
        assert_eq!(holders.len(), 1, "{k} is in {holders:?}");
    }

    // The same code as the whole program's. Control: a different define changes some
    // entry (so the comparison can see a difference).
    let whole = |prelude: &str| {
        let ptx = compile::compile(&compile::whole(prelude, &sources), &arch)
            .unwrap_or_else(|e| panic!("{}", compile::compile_log(&e)))
            .to_src();
        entries(&ptx)
    };
    let all = whole(&prelude);
    let mut differ = Vec::new();
    for (file, e) in &per_module {
        for (name, body) in e {
            if let Some(d) = first_difference(body, all.get(name).map_or("", |s| s.as_str())) {
                differ.push(format!("{name} of {file}: {d}"));
            }
        }
    }
    assert!(
        differ.is_empty(),
        "entries that differ from the whole program's:\n{}",
        differ.join("\n")
    );
    // The control compiles one small module (mmvt.cu, whose walk the define unrolls), not a
    // second whole program: that took minutes of CI on two cores.
    let ctl = compile::modules(
        &compile::prelude("#define MF_MVT_UNROLL 4\n", false),
        &sources,
    )
    .into_iter()
    .find(|m| m.file == "mmvt.cu")
    .expect("mmvt.cu is a module");
    let unrolled = entries(
        &compile::compile(&ctl.src, &arch)
            .unwrap_or_else(|e| panic!("{}", compile::compile_log(&e)))
            .to_src(),
    );
    assert!(
        unrolled.iter().any(|(n, b)| all.get(n) != Some(b)),
        "the control define changed no entry: the comparison sees nothing"
    );

    // Warm: every module from the cache. Control: another define is a key the cache holds
    // for no module (checked by path: starting it would compile them all again).
    let again = compile::start(mods.clone(), &arch, Some(&dir)).unwrap();
    assert_eq!(again.compiling(), 0);
    again.join().unwrap();
    for m in compile::modules(&compile::prelude("", true), &sources) {
        assert!(!compile::cache_path(&dir, &m, &arch).exists(), "{}", m.file);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_module_that_does_not_compile_is_named_with_the_log() {
    let Some(arch) = arch() else { return };
    let mut sources = compile::sources(None).unwrap();
    let kv = sources.iter_mut().find(|(n, _)| n == "kv.cu").unwrap();
    kv.1.push_str("\nextern \"C\" __global__ void mf_broken() { undeclared_thing(); }\n");
    let mods = compile::modules("", &sources);
    let e = compile::start(mods, &arch, None)
        .unwrap()
        .join()
        .expect_err("a broken module compiled");
    assert!(e.contains("kv.cu"), "{e}");
    assert!(e.contains("undeclared_thing"), "{e}");
    // Control: the same sources unbroken compile (the failure is the added line's).
    let sources = compile::sources(None).unwrap();
    let kv_only: Vec<_> = compile::modules("", &sources)
        .into_iter()
        .filter(|m| m.file == "kv.cu")
        .collect();
    compile::start(kv_only, &arch, None)
        .unwrap()
        .join()
        .unwrap();
}

/// On a device: a cold start compiles every module in the background and the first kernel
/// asked for joins them (the report once, with the compile's wall time), every kernel then
/// resolves; a warm start reads every module from the cache. Control: the cold start's cache
/// really was empty (it compiled every module). SKIP without a device.
#[test]
fn a_device_compiles_cold_joins_at_the_first_kernel_and_starts_warm() {
    if let Err(why) = minfer_cuda::available() {
        println!("SKIP: no CUDA device ({why})");
        return;
    }
    let dir = temp_dir("device");
    // The only test of this binary that opens a device, so the variable is not raced.
    std::env::set_var("MINFER_CUDA_CACHE", &dir);
    let g = minfer_cuda::device::Gpu::new().unwrap();
    let n = KERNELS.len();
    assert_eq!(g.cached_modules, 0, "a fresh cache held modules");
    assert!(g.modules >= 2, "{} modules", g.modules);
    let report = g.kernels().unwrap().expect("the first join reports");
    println!("cold: {}; waited {:?}", report.describe(), report.waited);
    assert_eq!((report.modules, report.cached), (g.modules, 0));
    assert!(report.wall > std::time::Duration::ZERO);
    assert!(
        g.kernels().unwrap().is_none(),
        "a second join reported again"
    );
    for k in KERNELS {
        assert!(g.resident_blocks(k, 32, 0).unwrap() > 0, "{k}");
    }
    drop(g);
    let warm = minfer_cuda::device::Gpu::new().unwrap();
    assert_eq!(warm.cached_modules, warm.modules, "the warm start compiled");
    let report = warm.kernels().unwrap().unwrap();
    println!("warm: {} ({n} kernels)", report.describe());
    assert_eq!(report.cached, report.modules);
    drop(warm);
    // NVRTC's CUBIN instead of PTX (`MINFER_CUDA_IMAGE=cubin`): cold (its own cache keys:
    // every module compiled again), every kernel resolves from the loaded machine code, then
    // warm. The times say what a cold start costs each way (the PTX one also waits for the
    // driver's compile at load, unless the driver's own cache holds it).
    std::env::set_var("MINFER_CUDA_IMAGE", "cubin");
    let t = std::time::Instant::now();
    let g = minfer_cuda::device::Gpu::new().unwrap();
    assert_eq!(g.cached_modules, 0, "the CUBIN keys are the PTX ones");
    let report = g.kernels().unwrap().expect("the first join reports");
    println!(
        "cold CUBIN: {}; to every kernel loaded {:.2} s",
        report.describe(),
        t.elapsed().as_secs_f64()
    );
    for k in KERNELS {
        assert!(g.resident_blocks(k, 32, 0).unwrap() > 0, "{k} (CUBIN)");
    }
    drop(g);
    let warm = minfer_cuda::device::Gpu::new().unwrap();
    assert_eq!(
        warm.cached_modules, warm.modules,
        "the warm CUBIN start compiled"
    );
    warm.kernels().unwrap();
    std::env::remove_var("MINFER_CUDA_IMAGE");
    std::env::remove_var("MINFER_CUDA_CACHE");
    let _ = std::fs::remove_dir_all(&dir);
}

/// NVRTC's CUBIN of a module (`compile::ImageKind::Cubin`): an ELF image for the real
/// architecture, cached under a key and a file of its own, read back warm; a cache file cut
/// short is compiled again, not loaded. Controls: the PTX image of the same module is text
/// under another file, and a virtual architecture has no CUBIN (refused by name).
#[test]
fn cubin_images_are_elf_and_cached_apart_from_ptx() {
    let Some(arch) = arch() else { return };
    let sources = compile::sources(None).unwrap();
    let kv: Vec<_> = compile::modules(&compile::prelude("", false), &sources)
        .into_iter()
        .filter(|m| m.file == "kv.cu")
        .collect();
    let dir = temp_dir("cubin");
    let cubin = compile::ImageKind::Cubin;
    let (out, report) = compile::start_images(kv.clone(), &arch, Some(&dir), cubin)
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(report.cached, 0);
    let compile::Image::Cubin(bytes) = &out[0].image else {
        panic!("not a CUBIN: {:?}", out[0].image.ptx().map(|p| &p[..40]))
    };
    assert!(bytes.starts_with(b"\x7fELF"), "not an ELF image");
    let path = compile::cache_path_of(&dir, &kv[0], &arch, cubin);
    assert!(path.to_string_lossy().ends_with(".cubin"));
    assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    let (warm, report) = compile::start_images(kv.clone(), &arch, Some(&dir), cubin)
        .unwrap()
        .join()
        .unwrap();
    assert_eq!((report.cached, &warm[0].image), (1, &out[0].image));
    // A cut file is compiled again.
    std::fs::write(&path, &bytes[..16]).unwrap();
    let p = compile::start_images(kv.clone(), &arch, Some(&dir), cubin).unwrap();
    assert_eq!(p.compiling(), 1, "a cut CUBIN was read");
    p.join().unwrap();
    // Controls.
    let ptx_path = compile::cache_path(&dir, &kv[0], &arch);
    assert_ne!(ptx_path, path);
    let ptx = compile::compile(&kv[0].src, &arch).unwrap().to_src();
    assert!(ptx.contains(".entry"), "the PTX image is text");
    let e = compile::compile_cubin(&kv[0].src, "compute_90").unwrap_err();
    assert!(e.contains("real architecture"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

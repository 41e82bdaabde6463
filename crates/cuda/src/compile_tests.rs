//! Tests of crate::compile (the modules, their cache keys, the cache and the threads).

use super::*;

fn srcs() -> Vec<(String, String)> {
    sources(None).unwrap()
}

/// Every `.cu` file is one module holding the prelude and every header before it; the
/// control: a header is in no module list, and the whole program holds each file once.
#[test]
fn one_module_per_cu_file_with_the_prelude_and_headers() {
    let p = prelude("#define MF_MV1_UNROLL 4\n", true);
    let mods = modules(&p, &srcs());
    let cu: Vec<_> = SOURCES
        .iter()
        .filter(|(n, _)| n.ends_with(".cu"))
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(mods.iter().map(|m| m.file.clone()).collect::<Vec<_>>(), cu);
    for m in &mods {
        assert!(m
            .src
            .starts_with("#define MF_PDL_EARLY 1\n#define MF_MV1_UNROLL 4\n"));
        for (h, _) in SOURCES.iter().filter(|(n, _)| n.ends_with(".cuh")) {
            let at = m.src.find(&format!("// ---- {h} ----")).expect(h);
            assert!(at < m.src.find(&format!("// ---- {} ----", m.file)).unwrap());
        }
        // No other .cu file is in it.
        for other in cu.iter().filter(|f| **f != m.file) {
            assert!(!m.src.contains(&format!("// ---- {other} ----")));
        }
    }
    let w = whole(&p, &srcs());
    for (n, _) in SOURCES {
        assert_eq!(w.matches(&format!("// ---- {n} ----")).count(), 1, "{n}");
    }
}

/// The cache key moves with the defines, the architecture and the file; the control:
/// the same module and architecture give the same path.
#[test]
fn the_cache_key_covers_defines_arch_and_source() {
    let dir = Path::new("/cache");
    let plain = modules(&prelude("", false), &srcs());
    let early = modules(&prelude("", true), &srcs());
    let unroll = modules(&prelude("#define MF_MV1_UNROLL 4\n", false), &srcs());
    let a = cache_path(dir, &plain[0], "sm_90");
    assert_eq!(a, cache_path(dir, &plain[0].clone(), "sm_90"));
    assert_ne!(a, cache_path(dir, &early[0], "sm_90"));
    assert_ne!(a, cache_path(dir, &unroll[0], "sm_90"));
    assert_ne!(a, cache_path(dir, &plain[0], "sm_89"));
    assert_ne!(a, cache_path(dir, &plain[1], "sm_90"));
    let name = a.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-elementwise-sm_90.ptx"), "{name}");
}

/// Modules the cache holds are read, not compiled (no NVRTC needed); the control: with
/// the cache file gone the module is one to compile.
#[test]
fn cached_modules_are_read_without_nvrtc() {
    let dir = std::env::temp_dir().join(format!("minfer-ptx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mods = modules(&prelude("", false), &srcs());
    for m in &mods {
        std::fs::write(
            cache_path(&dir, m, "sm_90"),
            format!("// ptx of {}", m.file),
        )
        .unwrap();
    }
    let p = start(mods.clone(), "sm_90", Some(&dir)).unwrap();
    assert_eq!((p.modules(), p.compiling()), (mods.len(), 0));
    let (out, report) = p.join().unwrap();
    assert_eq!(report.cached, mods.len());
    assert!(out
        .iter()
        .all(|c| c.image == Image::Ptx(format!("// ptx of {}", c.file))));
    assert_eq!(
        report.describe(),
        format!("{} modules from the PTX cache", mods.len())
    );
    // Control: one file gone is one module to compile (which needs NVRTC: where the
    // library is missing, `start` says so instead).
    std::fs::remove_file(cache_path(&dir, &mods[0], "sm_90")).unwrap();
    match start(mods.clone(), "sm_90", Some(&dir)) {
        Ok(p) => {
            assert_eq!(p.compiling(), 1);
            let _ = p.join();
        }
        Err(e) => assert!(e.contains("NVRTC"), "{e}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A compile dropped unjoined waits for its threads (a process may then exit safely):
/// the module's PTX is in the cache once the drop returns. Control: the cache held
/// nothing before (the thread wrote it). Needs NVRTC (SKIP without).
#[test]
fn a_dropped_compile_waits_for_its_threads() {
    let dir = std::env::temp_dir().join(format!("minfer-ptx-drop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let m: Vec<_> = modules("", &srcs())
        .into_iter()
        .filter(|m| m.file == "elementwise.cu")
        .collect();
    let path = cache_path(&dir, &m[0], "sm_90");
    assert!(!path.exists());
    match start(m, "sm_90", Some(&dir)) {
        Ok(p) => {
            assert_eq!(p.compiling(), 1);
            drop(p);
            assert!(path.exists(), "the drop returned before its thread ended");
        }
        Err(e) => println!("SKIP: {e}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! `--backend` resolution: three distinct refusals, before anything loads.

use minfer_graph::{resolve_backends, BackendEntry, BackendId, Error};

fn table() -> Vec<BackendEntry> {
    vec![
        BackendEntry {
            id: BackendId(0),
            name: "cpu",
            compiled: Ok(()),
            available: Ok(()),
            by_default: true,
        },
        BackendEntry {
            id: BackendId(1),
            name: "metal",
            compiled: Err("macOS only".into()),
            available: Err("-".into()),
            by_default: true,
        },
        BackendEntry {
            id: BackendId(2),
            name: "cuda",
            compiled: Ok(()),
            available: Err("no CUDA device".into()),
            by_default: true,
        },
        BackendEntry {
            id: BackendId(3),
            name: "emu",
            compiled: Ok(()),
            available: Ok(()),
            by_default: false,
        },
    ]
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn names_resolve_case_insensitively_and_cpu_always_participates() {
    let t = table();
    assert_eq!(
        resolve_backends(&names(&[" CPU "]), &t, BackendId(0)).unwrap(),
        vec![BackendId(0)]
    );
    assert_eq!(
        resolve_backends(&[], &t, BackendId(0)).unwrap(),
        vec![BackendId(0)]
    );
}

#[test]
fn unknown_not_compiled_and_unavailable_are_three_errors() {
    let t = table();
    let e = resolve_backends(&names(&["vulkan"]), &t, BackendId(0)).unwrap_err();
    assert!(
        matches!(&e, Error::UnknownBackend { name, known } if name == "vulkan" && known == "cpu, metal, cuda, emu"),
        "{e}"
    );
    let e = resolve_backends(&names(&["cpu,metal"]), &t, BackendId(0)).unwrap_err();
    assert!(
        matches!(&e, Error::NotCompiled { name, .. } if name == "metal"),
        "{e}"
    );
    let e = resolve_backends(&names(&["cuda"]), &t, BackendId(0)).unwrap_err();
    assert!(
        matches!(&e, Error::Unavailable { name, why } if name == "cuda" && why == "no CUDA device"),
        "{e}"
    );
}

#[test]
fn a_backend_off_by_default_takes_part_only_when_named() {
    let t = table();
    assert_eq!(
        resolve_backends(&[], &t, BackendId(0)).unwrap(),
        vec![BackendId(0)]
    );
    assert_eq!(
        resolve_backends(&names(&["emu"]), &t, BackendId(0)).unwrap(),
        vec![BackendId(0), BackendId(3)]
    );
}

//! The kernel gate suite on the real device (scripts/mac-gate). The same gates the emulator
//! runs on Linux under three schedules; here each runs once against the GPU. Prints `SKIP`
//! where no Metal device exists.
#![cfg(feature = "conformance")]

use minfer_metal::conformance::gates;
use minfer_metal_objc::MetalDevice;

#[test]
fn every_kernel_gate_passes_on_the_metal_device() {
    let dev = match MetalDevice::shared() {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP: {e}");
            return;
        }
    };
    let mut failed = Vec::new();
    let all = gates::<MetalDevice>();
    for (name, gate) in &all {
        match gate(dev) {
            Ok(o) => println!(
                "ok   {name}: max err {:.3e} (tolerance {:.1e})",
                o.max_err, o.tolerance
            ),
            Err(msg) => {
                println!("FAIL {name}: {msg}");
                failed.push(name.clone());
            }
        }
    }
    println!(
        "metal device gates: {} passed, {} failed",
        all.len() - failed.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "failed gates: {failed:?}");
}

//! The kernel self-test: every `.cu` file compiled on its own by NVRTC, and then the whole
//! program, for the device's architecture (or `MINFER_CUDA_ARCH`), every error reported at
//! once. SKIP (pass) where NVRTC or the device is missing.

#![cfg(feature = "cuda")]

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let arch = match std::env::var("MINFER_CUDA_ARCH") {
        Ok(a) => a,
        Err(_) => match minfer_cuda::available() {
            Ok(()) => "sm_90".to_string(),
            Err(why) => {
                println!("SKIP: no CUDA device ({why}) and no MINFER_CUDA_ARCH");
                return;
            }
        },
    };
    let results = minfer_cuda::device::selftest(&arch);
    let mut failed = Vec::new();
    for (file, r) in &results {
        match r {
            Ok(()) => println!("nvrtc {arch} {file}: ok"),
            Err(log) => {
                println!("nvrtc {arch} {file}: FAILED\n{log}");
                failed.push(file.clone());
            }
        }
    }
    assert!(failed.is_empty(), "NVRTC failed on {failed:?}");
}

#[test]
fn the_backend_starts_and_every_kernel_loads() {
    if let Err(why) = minfer_cuda::available() {
        println!("SKIP: no CUDA device ({why})");
        return;
    }
    let s = minfer_cuda::CudaSettings::from_env().unwrap();
    let b = minfer_cuda::CudaBackend::new(minfer_graph::BackendId(2), "cuda", &s).unwrap();
    assert_eq!(b.nodes_executed(), 0);
    // The modules compile in the background (crate::compile): joined here, every kernel
    // looked up.
    let report = b.kernels_ready().unwrap().expect("the first join reports");
    println!("{}", report.describe());
    assert!(b.kernels_ready().unwrap().is_none());
}

//! What a benchmark row was measured on: the CPU, the SIMD features it reports at run time,
//! and the ones this binary was compiled to assume.

#[derive(Clone, Debug, serde::Serialize)]
pub struct SysInfo {
    pub cpu: String,
    pub logical_cpus: usize,
    /// Detected at run time (what the dispatching kernels may pick).
    pub cpu_simd: Vec<&'static str>,
    /// The instruction set the CPU kernels run (the best of `cpu_simd`, or `MINFER_CPU_ISA`'s).
    pub cpu_kernels: &'static str,
    /// `target_feature`s enabled at compile time (what every function may assume).
    pub build_target_features: Vec<&'static str>,
    pub build_profile: &'static str,
    pub version: &'static str,
}

fn cpu_model() -> String {
    // Linux names the model in /proc/cpuinfo ("model name" on x86, absent on some ARM boards).
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| format!("unknown {}", std::env::consts::ARCH))
}

#[cfg(target_arch = "x86_64")]
fn runtime_simd() -> Vec<&'static str> {
    let mut v = Vec::new();
    macro_rules! probe {
        ($($f:tt),*) => { $( if std::is_x86_feature_detected!($f) { v.push($f); } )* };
    }
    probe!(
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi2",
        "avxvnni",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512vnni",
        "avx512bf16"
    );
    v
}

#[cfg(target_arch = "aarch64")]
fn runtime_simd() -> Vec<&'static str> {
    let mut v = Vec::new();
    macro_rules! probe {
        ($($f:tt),*) => { $( if std::arch::is_aarch64_feature_detected!($f) { v.push($f); } )* };
    }
    probe!("neon", "dotprod", "i8mm", "fp16", "bf16", "sve");
    v
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn runtime_simd() -> Vec<&'static str> {
    Vec::new()
}

fn build_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    macro_rules! built {
        ($($f:tt),*) => { $( if cfg!(target_feature = $f) { v.push($f); } )* };
    }
    built!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "neon", "dotprod", "i8mm");
    v
}

pub fn detect() -> SysInfo {
    SysInfo {
        cpu: cpu_model(),
        logical_cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_simd: runtime_simd(),
        cpu_kernels: minfer_engine::backends::cpu::kernels(),
        build_target_features: build_features(),
        build_profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        version: env!("CARGO_PKG_VERSION"),
    }
}

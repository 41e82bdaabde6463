//! The kernel sources, embedded so a device can build its library at start without files on
//! disk. The real device compiles them as one library: [`library_source`] inlines the local
//! headers once (Metal's runtime compiler cannot resolve `#include "..."`).

/// Local headers, in dependency order.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.h", include_str!("../kernels/common.h")),
    ("dequant.h", include_str!("../kernels/dequant.h")),
    ("matmul.h", include_str!("../kernels/matmul.h")),
];

/// Kernel files.
pub const KERNEL_FILES: &[(&str, &str)] = &[
    (
        "elementwise.metal",
        include_str!("../kernels/elementwise.metal"),
    ),
    ("norm.metal", include_str!("../kernels/norm.metal")),
    ("rope.metal", include_str!("../kernels/rope.metal")),
    ("kv.metal", include_str!("../kernels/kv.metal")),
    ("fused.metal", include_str!("../kernels/fused.metal")),
    ("get_rows.metal", include_str!("../kernels/get_rows.metal")),
    ("matmul.metal", include_str!("../kernels/matmul.metal")),
    (
        "attn_classic.metal",
        include_str!("../kernels/attn_classic.metal"),
    ),
    (
        "fa_decode.metal",
        include_str!("../kernels/fa_decode.metal"),
    ),
    (
        "fa_prefill.metal",
        include_str!("../kernels/fa_prefill.metal"),
    ),
    (
        "attn_window.metal",
        include_str!("../kernels/attn_window.metal"),
    ),
    (
        "fa_window.metal",
        include_str!("../kernels/fa_window.metal"),
    ),
    (
        "attn_split.metal",
        include_str!("../kernels/attn_split.metal"),
    ),
    (
        "fa_window_prefill.metal",
        include_str!("../kernels/fa_window_prefill.metal"),
    ),
    (
        "attn_3pass.metal",
        include_str!("../kernels/attn_3pass.metal"),
    ),
];

fn strip_local(src: &str) -> String {
    src.lines()
        .filter(|l| {
            let t = l.trim();
            !(t.starts_with("#include \"") || t == "#pragma once")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One translation unit with every header and kernel, for `newLibraryWithSource`.
pub fn library_source() -> String {
    let mut out = String::new();
    for (name, src) in HEADERS.iter().chain(KERNEL_FILES) {
        out.push_str(&format!("// ---- {name} ----\n"));
        out.push_str(&strip_local(src));
        out.push('\n');
    }
    out
}

/// Every kernel name declared in the sources (`kernel void NAME(`).
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for (_, src) in KERNEL_FILES {
        let mut rest = *src;
        while let Some(i) = rest.find("kernel void ") {
            let after = &rest[i + "kernel void ".len()..];
            if let Some(end) = after.find('(') {
                names.push(after[..end].trim().to_string());
            }
            rest = after;
        }
    }
    names
}

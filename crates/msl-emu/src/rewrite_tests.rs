use crate::rewrite::rewrite;

#[test]
fn params_become_context_reads_and_lines_are_kept() {
    let src = "#include \"common.h\"\nkernel void k_a(\n    device const float * a [[buffer(0)]],\n    constant P & p [[buffer(1)]],\n    threadgroup float * s [[threadgroup(0)]],\n    uint3 tg [[threadgroup_position_in_grid]]) {\n    threadgroup float part[32];\n    threadgroup float os[4 * 64];\n    threadgroup float * sp = s;\n    a[0];\n}\n";
    let rw = rewrite(src, "x.metal", "x", 7).unwrap();
    assert!(rw
        .cpp
        .contains("device const float * a = ::emu::arg_buffer<device const float *>(0)"));
    assert!(rw
        .cpp
        .contains("constant P & p = ::emu::arg_buffer<constant P &>(1)"));
    assert!(rw
        .cpp
        .contains("threadgroup float * s = ::emu::arg_threadgroup<threadgroup float *>(0)"));
    assert!(rw
        .cpp
        .contains("uint3 tg = ::emu::builtin<uint3>(::emu::B_THREADGROUP_POSITION_IN_GRID)"));
    assert!(rw
        .cpp
        .contains("auto & part = ::emu::tg_static_ref<float[32]>(7);"));
    // Lines map 1:1 up to the registration block (first line is the #line directive).
    let body: Vec<&str> = rw.cpp.lines().skip(1).take(src.lines().count()).collect();
    assert_eq!(body.len(), src.lines().count());
    assert_eq!(body[9], "    a[0];");
    assert_eq!(rw.kernels.len(), 1);
    assert_eq!(rw.kernels[0].name, "k_a");
    assert_eq!(rw.kernels[0].bindings.len(), 4);
}

#[test]
fn an_unknown_attribute_is_refused_with_its_location() {
    let src = "kernel void k(\n device float * a [[stage_in]]) {}\n";
    let err = rewrite(src, "y.metal", "y", 0).unwrap_err();
    assert!(err.contains("y.metal:1"), "{err}");
    assert!(err.contains("stage_in"), "{err}");
}

//! Compiles every CUDA kernel with NVRTC, for Ampere (sm_80) and Hopper (sm_90), to PTX and to
//! CUBIN. Needs libnvrtc but no GPU: run `scripts/install-nvrtc.sh` first. A missing libnvrtc is
//! a failure, not a skip, so CI really checks that the kernels compile.
#![cfg(feature = "cuda")]

use engine_worker::backend::cuda::kernels::{
    combined_source, compile, full_source, nvrtc_available, nvrtc_version, CompileTarget,
    KernelCompileError, KERNEL_FILES,
};

const ARCHS: [u32; 2] = [80, 90];

fn require_nvrtc() {
    assert!(
        nvrtc_available(),
        "libnvrtc.so.12 cannot be loaded: run scripts/install-nvrtc.sh (this test fails rather \
         than skips without it)"
    );
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn nvrtc_compiles_every_kernel() {
    require_nvrtc();
    let (major, minor) = nvrtc_version().expect("nvrtcVersion");
    eprintln!("NVRTC {major}.{minor}");
    for file in KERNEL_FILES {
        let source = full_source(file);
        for arch in ARCHS {
            let ptx = compile(file.name, &source, CompileTarget::Ptx(arch))
                .unwrap_or_else(|e| panic!("{e}"));
            let ptx_text = String::from_utf8(ptx).expect("PTX is text");
            assert!(
                ptx_text.contains(&format!(".target sm_{arch}")),
                "{}: wrong target",
                file.name
            );
            for function in file.functions {
                assert!(
                    ptx_text.contains(&format!(".entry {function}(")),
                    "{}: PTX for compute_{arch} has no entry point {function}",
                    file.name
                );
            }

            let cubin = compile(file.name, &source, CompileTarget::Cubin(arch))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                &cubin[..4],
                b"\x7fELF",
                "{}: sm_{arch} CUBIN is not an ELF image",
                file.name
            );
            for function in file.functions {
                assert!(
                    contains(&cubin, function),
                    "{}: sm_{arch} CUBIN lacks {function}",
                    file.name
                );
            }
        }
    }
}

#[test]
fn nvrtc_compiles_the_combined_module() {
    require_nvrtc();
    let source = combined_source();
    for arch in ARCHS {
        let cubin = compile("specula_kernels.cu", &source, CompileTarget::Cubin(arch))
            .unwrap_or_else(|e| panic!("{e}"));
        for function in KERNEL_FILES.iter().flat_map(|f| f.functions) {
            assert!(
                contains(&cubin, function),
                "combined sm_{arch} CUBIN lacks {function}"
            );
        }
    }
}

#[test]
fn nvrtc_reports_compile_errors_with_the_log() {
    require_nvrtc();
    let broken = "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }";
    match compile("broken.cu", broken, CompileTarget::Ptx(90)) {
        Err(KernelCompileError::Compile { log, .. }) => {
            assert!(
                log.contains("undefined_name"),
                "log should name the error: {log}"
            )
        }
        other => panic!("a broken kernel must not compile: {other:?}"),
    }
}

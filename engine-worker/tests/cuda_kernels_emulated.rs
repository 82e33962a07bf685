//! Runs every CUDA kernel (`engine-worker/kernels/*.cu`, unmodified) on a small CPU emulator of
//! the CUDA execution model (`tests/cuda_emu/emu.h`: one real thread per CUDA thread, barriers
//! for `__syncthreads` and warp shuffles) and checks each against a plain reference
//! (`tests/cuda_emu/driver.cpp`). Needs a C++20 compiler but no GPU and no CUDA, so the kernels'
//! logic (indexing, reductions, the attention's online softmax, argmax, greedy acceptance)
//! is tested on every machine; the GPU tests in cuda_parity.rs check the real thing.
//!
//! Without a C++ compiler the test prints why and passes, unless SPECULA_REQUIRE_EMULATOR=1.

use std::path::{Path, PathBuf};
use std::process::Command;

fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX")
        .ok()
        .into_iter()
        .chain(["g++", "c++", "clang++"].map(String::from));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn cuda_kernels_match_references_on_cpu_emulator() {
    let Some(cxx) = compiler() else {
        // scripts/test.sh installs a compiler and sets SPECULA_REQUIRE_TOOLS=1: a missing one is
        // a failure there, never a silent skip.
        let required = ["SPECULA_REQUIRE_EMULATOR", "SPECULA_REQUIRE_TOOLS"]
            .iter()
            .any(|var| std::env::var(var).is_ok_and(|v| v == "1"));
        assert!(
            !required,
            "a C++ compiler is required (SPECULA_REQUIRE_TOOLS=1) but none (g++, c++, clang++ or $CXX) was found"
        );
        eprintln!("SKIPPED cuda_kernels_emulated: no C++ compiler (g++, c++, clang++ or $CXX)");
        return;
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir: PathBuf =
        std::env::temp_dir().join(format!("specula-cuda-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("kernel_checks");
    let build = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-I"])
        .arg(crate_dir.join("kernels"))
        .arg("-o")
        .arg(&exe)
        .arg(crate_dir.join("tests/cuda_emu/driver.cpp"))
        .output()
        .expect("run the C++ compiler");
    assert!(
        build.status.success(),
        "{cxx} could not build the kernel emulator:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&exe).output().expect("run the kernel checks");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        run.status.success(),
        "kernel checks failed on the CPU emulator:\n{stderr}"
    );
    assert!(
        stdout.contains("all kernel checks passed"),
        "unexpected output: {stdout}"
    );
}

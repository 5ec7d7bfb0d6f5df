//! Every kernel program compiles through NVRTC for sm_80 and sm_90 with no error and no warning,
//! and defines every kernel the host side launches. Needs NVRTC, not a GPU. Where NVRTC is absent
//! the test prints SKIP, unless `KVBENCH_REQUIRE_NVRTC=1` (CI, which installs the wheel) makes
//! absence a failure.

use kvbench_cuda::nvrtc::{compile_all, defines, CHECK_ARCHS};
use kvbench_cuda::{libs, ProgramId};

fn nvrtc_or_skip() -> bool {
    libs::nvrtc_or_skip().unwrap_or_else(|e| panic!("KVBENCH_REQUIRE_NVRTC=1 but {e}"))
}

#[test]
fn every_program_compiles_for_sm80_and_sm90_without_warnings() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = kvbench_cuda::nvrtc::version().expect("NVRTC version");
    eprintln!("NVRTC {major}.{minor}");
    let all = compile_all();
    assert_eq!(all.len(), CHECK_ARCHS.len() * ProgramId::ALL.len());
    for (arch, p, c) in all {
        let c = c.unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{} {arch}: {} bytes, {:.1} s",
            p.name(),
            c.cubin.len(),
            c.seconds
        );
        assert!(
            c.warnings.is_empty(),
            "{} {arch} warnings:\n{}",
            p.name(),
            c.log
        );
        assert!(c.cubin.len() > 1000, "{} {arch}: empty cubin", p.name());
        for k in p.kernels() {
            assert!(defines(&c.cubin, &k), "{} {arch}: no kernel {k}", p.name());
        }
        assert!(
            !defines(&c.cubin, "attn_paged_f16_d128_g4"),
            "name check is vacuous"
        );
    }
}

#[test]
fn a_broken_program_is_an_error_value_with_the_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err =
        kvbench_cuda::nvrtc::compile_source("broken", "__global__ void f() { int x = ; }", "sm_90")
            .expect_err("must not compile");
    let msg = err.to_string();
    assert!(msg.contains("broken") && msg.contains("sm_90"), "{msg}");
    assert!(msg.contains("error"), "log missing from: {msg}");
}

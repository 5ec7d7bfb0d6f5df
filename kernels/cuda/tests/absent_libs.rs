//! Absent CUDA libraries are error values naming the library, never panics. One test per file
//! keeps `KVBENCH_CUDA_HIDE` from leaking into other tests (each test file is its own process).

use kvbench_cuda::nvrtc::compile;
use kvbench_cuda::{libs, CudaLib, ProgramId};

#[test]
fn hidden_or_missing_libraries_are_errors_naming_them() {
    std::env::set_var("KVBENCH_CUDA_HIDE", "nvrtc,driver,cublas");
    let err = compile(ProgramId::KvOps, "sm_90").expect_err("nvrtc hidden");
    assert!(err.to_string().contains("NVRTC"), "{err}");
    let err = kvbench_cuda::nvrtc::version().expect_err("nvrtc hidden");
    assert!(err.to_string().contains("NVRTC"), "{err}");
    for lib in CudaLib::ALL {
        let err = libs::open(lib).expect_err("hidden");
        assert!(err.to_string().contains(lib.name()), "{err}");
    }
    std::env::remove_var("KVBENCH_CUDA_HIDE");
    // A library that really is absent: the search reports every place it looked.
    match libs::open(CudaLib::Driver) {
        Ok(f) => eprintln!(
            "driver present at {} (absent path not reachable here)",
            f.path.display()
        ),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("libcuda.so.1") && msg.contains("CUDA driver"),
                "{msg}"
            );
        }
    }
}

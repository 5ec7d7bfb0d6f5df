//! The attention kernels under ThreadSanitizer: `emu/tsan_driver.cpp` (the real `.cu` text,
//! every CUDA thread an OS thread, barriers a mutex and condition variable) built by the
//! system `c++` with `-fsanitize=thread` and run on small inputs; any report fails the test.
//! The same driver built with one `__syncthreads` of attention.cu dropped must be reported, so
//! the check is shown able to fail. Skipped, with the reason printed, only where the compiler
//! cannot build a ThreadSanitizer program.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// TSan's exit status when it reported anything (set through TSAN_OPTIONS).
const TSAN_EXIT: i32 = 66;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn compile(src: &Path, out: &Path, defines: &[String]) -> Result<(), String> {
    let m = manifest();
    let o = Command::new("c++")
        .args(["-std=c++17", "-O1", "-g", "-fsanitize=thread", "-pthread"])
        .args([
            "-DEMU_OS_THREADS",
            "-fno-strict-aliasing",
            "-Wno-unknown-pragmas",
        ])
        .args(defines)
        .arg("-I")
        .arg(m.join("emu"))
        .arg("-I")
        .arg(m.join("cu"))
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("cannot run c++: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

fn run_tsan(bin: &Path) -> Output {
    let go = |cmd: &mut Command| {
        cmd.env("TSAN_OPTIONS", format!("exitcode={TSAN_EXIT}"))
            .output()
            .expect("run the sanitizer driver")
    };
    let o = go(&mut Command::new(bin));
    // Kernels with high mmap randomization defeat TSan's fixed layout; without ASLR it runs.
    if String::from_utf8_lossy(&o.stderr).contains("unexpected memory mapping") {
        eprintln!("TSan needs ASLR off on this kernel: rerunning under setarch -R");
        return go(Command::new("setarch")
            .arg(std::env::consts::ARCH)
            .arg("-R")
            .arg(bin));
    }
    o
}

/// The line of attention.cu's first `__syncthreads` (after a key tile's slots are written):
/// dropping it lets threads load K/V rows through slots other threads are still writing.
fn first_sync_line() -> usize {
    let text = std::fs::read_to_string(manifest().join("cu/attention.cu")).expect("attention.cu");
    text.lines()
        .position(|l| l.trim() == "__syncthreads();")
        .expect("attention.cu has a __syncthreads")
        + 1
}

#[test]
fn attention_kernels_are_race_free_under_thread_sanitizer_and_a_dropped_barrier_is_caught() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("emu_tsan");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let probe = dir.join("probe.cpp");
    std::fs::write(&probe, "int main() { return 0; }\n").expect("probe");
    if let Err(e) = compile(&probe, &dir.join("probe"), &[]) {
        eprintln!("SKIP: the C++ compiler cannot build with -fsanitize=thread:\n{e}");
        return;
    }
    let driver = manifest().join("emu/tsan_driver.cpp");
    let (clean, planted) = (dir.join("clean"), dir.join("planted"));
    let line = first_sync_line();
    // Both builds at once (two cores in CI).
    std::thread::scope(|s| {
        let a = s.spawn(|| compile(&driver, &clean, &[]));
        let b = s.spawn(|| compile(&driver, &planted, &[format!("-DEMU_DROP_SYNC_LINE={line}")]));
        a.join().expect("thread").expect("clean build");
        b.join().expect("thread").expect("planted build");
    });
    let (c, p) = std::thread::scope(|s| {
        let a = s.spawn(|| run_tsan(&clean));
        let b = s.spawn(|| run_tsan(&planted));
        (a.join().expect("thread"), b.join().expect("thread"))
    });
    let (c_err, p_err) = (
        String::from_utf8_lossy(&c.stderr),
        String::from_utf8_lossy(&p.stderr),
    );
    assert!(
        c.status.success() && !c_err.contains("ThreadSanitizer"),
        "the kernels as written: status {:?}\n{}\n{c_err}",
        c.status,
        String::from_utf8_lossy(&c.stdout)
    );
    assert!(String::from_utf8_lossy(&c.stdout).contains("outputs agree"));
    assert_eq!(
        p.status.code(),
        Some(TSAN_EXIT),
        "with attention.cu:{line}'s barrier dropped TSan must report:\n{p_err}"
    );
    assert!(
        p_err.contains("WARNING: ThreadSanitizer: data race") && p_err.contains("attention.cu"),
        "{p_err}"
    );
}

//! `tests/skips.sh`, which `tests/check.sh` runs on the test output: a test that printed
//! `SKIP: ...` is counted and listed (cargo counts it as passed), and with `KVBENCH_NO_SKIP`
//! (CI) a skip of a required component fails the run.

use std::path::Path;
use std::process::Command;

fn skips(log: &str, no_skip: Option<&str>) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("test-output.log");
    std::fs::write(&path, log).expect("write log");
    let mut cmd = Command::new("bash");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/skips.sh"))
        .arg(&path)
        .env_remove("KVBENCH_NO_SKIP");
    if let Some(re) = no_skip {
        cmd.env("KVBENCH_NO_SKIP", re);
    }
    let out = cmd.output().expect("run tests/skips.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

const LOG: &str = "running 3 tests\n\
test a ... SKIP: no CUDA device: cuInit failed\nok\n\
SKIP: no CUDA device: cuInit failed\n\
SKIP: no NVRTC: libnvrtc.so not found\n\
test result: ok. 3 passed; 0 failed\n";

#[test]
fn skips_are_counted_and_listed() {
    let (code, text) = skips(LOG, None);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("skipped: 3 test(s) checked nothing"),
        "{text}"
    );
    assert!(text.contains("2 SKIP: no CUDA device"), "{text}");
    assert!(text.contains("1 SKIP: no NVRTC"), "{text}");
    let (code, text) = skips("test result: ok. 3 passed\n", None);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("skipped: 0 tests"), "{text}");
}

#[test]
fn a_required_component_that_skipped_fails_the_run() {
    let (code, text) = skips(LOG, Some("NVRTC|chromium"));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("required component was skipped"), "{text}");
    assert!(text.contains("SKIP: no NVRTC"), "{text}");
    // A skip it allows (no GPU in CI) does not.
    let only_gpu = "SKIP: no CUDA device: cuInit failed\n";
    let (code, text) = skips(only_gpu, Some("NVRTC|chromium"));
    assert_eq!(code, 0, "{text}");
}

#[test]
fn check_sh_runs_the_skip_count_on_the_test_output() {
    let check =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check.sh"))
            .expect("tests/check.sh");
    assert!(
        check.contains("-- --nocapture"),
        "the SKIP lines must reach the log"
    );
    assert!(check.contains("bash tests/skips.sh"), "{check}");
}

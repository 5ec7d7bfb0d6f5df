//! Host memory is estimated before anything is allocated, on every backend: under an
//! address-space limit (`ulimit -v`, which the estimate reads), a run whose backend would hold
//! more than the process can get is refused with exit 2, naming the scenario's FILE:LINE:COL
//! (or the `--set` that gave the key), the key that costs most and the figure — never an abort on a failed allocation, never a
//! results folder.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kvbench");
/// The children's address-space limit: 4 GiB (KiB).
const LIMIT_KIB: u64 = 4 << 20;

fn scenario(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"))
}

/// `kvbench ARGS` under the limit; exit code and stdout+stderr.
fn limited(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run kvbench under ulimit");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Runs `name` with `sets` on `backend` under the limit; it must be refused naming `key`.
fn refused(name: &str, backend: &str, sets: &[&str], key: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let path = scenario(name);
    let mut args = vec![
        "run",
        path.to_str().expect("utf-8"),
        "--backend",
        backend,
        "--out",
        out.to_str().expect("utf-8"),
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (code, said) = limited(dir.path(), &args);
    assert_eq!(code, 2, "{name} {sets:?} on {backend}: {said}");
    assert!(!out.exists(), "{name}: the refused run wrote its folder");
    // Placed in the file, or at the `--set` that gave the key its value.
    let at = format!("{}:", path.display());
    let placed = said.contains(&at) && said.contains(&format!(": {key}: "));
    assert!(
        placed || said.contains(&format!("--set {key}: ")),
        "{name} {sets:?} on {backend}: neither {at}…: {key}: nor --set {key}: in {said}"
    );
    assert!(said.contains("of host memory"), "{said}");
    for bad in ["memory allocation of", "panicked at"] {
        assert!(!said.contains(bad), "{said}");
    }
    said
}

/// `cuda-emu` holds the device's memory in the host's: a 64 GiB KV budget on an `h100`
/// profile passes the scenario's check (a device's KV is not host memory) and must be refused
/// once the backend is known.
#[test]
fn cuda_emu_device_memory_is_estimated_on_the_host() {
    let said = refused(
        "quick-basic",
        "cuda-emu",
        &["device=h100", "memory.kv_budget=64 GiB"],
        "memory.kv_budget",
    );
    assert!(said.contains("--backend cuda-emu"), "{said}");
    assert!(said.contains("KV 64 GiB"), "{said}");
}

/// `cpu` holds its KV pool in host memory whatever device the scenario names.
#[test]
fn cpu_kv_pool_counts_when_the_device_is_not_cpu() {
    refused(
        "quick-basic",
        "cpu",
        &["device=h100", "memory.kv_budget=12 GiB"],
        "memory.kv_budget",
    );
}

/// FP8 KV is held as f32 on `cpu`: a 1.5 GiB budget is 6 GiB of host memory.
#[test]
fn cpu_fp8_store_is_priced_as_the_f32_it_holds() {
    refused(
        "quick-basic",
        "cpu",
        &["model.kv_dtype=fp8", "memory.kv_budget=1.5 GiB"],
        "memory.kv_budget",
    );
}

/// The disk tier's pool is host memory on `cpu` (it stands for the disk).
#[test]
fn cpu_disk_tier_pool_is_counted() {
    refused(
        "quick-tiered",
        "cpu",
        &[
            "cache.disk_tier.capacity=6 GiB",
            "cache.disk_tier.read_bytes_per_s=7e9",
            "cache.disk_tier.write_bytes_per_s=5e9",
            "cache.disk_tier.latency_us=80",
        ],
        "cache.disk_tier.capacity",
    );
}

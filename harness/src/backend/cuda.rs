//! The `cuda` backend's host side: whether this machine can run it (and, if not, exactly what
//! is missing), the choice `--backend auto` makes, and the device-free pieces of the backend —
//! ledger reconciliation against `cuMemGetInfo` ([`ledger`]) and event fences ([`fence`]).
//!
//! The backend itself is [`backend::CudaBackend`] (the seeded model on the GPU, [`setup`];
//! the oracle check of its logits, [`check`]).

pub mod backend;
pub mod check;
pub mod fence;
pub mod ledger;
pub mod setup;
mod tier;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use kvbench_cuda::probe::Probe;

use super::{BackendError, BackendKind};

/// The scenario model runs on `cuda` (`auto` picks it wherever nothing is missing).
pub const SCENARIO_MODEL_BUILT: bool = true;

/// What stands between this machine and the cuda backend (empty: nothing). Probed once.
pub fn missing() -> &'static [String] {
    static MISSING: OnceLock<Vec<String>> = OnceLock::new();
    MISSING.get_or_init(|| Probe::run().missing())
}

/// `auto`'s choice given what is missing, and the line that explains it.
pub fn choose_auto(missing: &[String], model_built: bool) -> (BackendKind, String) {
    if !missing.is_empty() {
        (
            BackendKind::Cpu,
            format!(
                "--backend auto: cuda unavailable ({}); falling back to cpu",
                missing.join("; ")
            ),
        )
    } else if !model_built {
        (
            BackendKind::Cpu,
            "--backend auto: a usable GPU is present but the cuda scenario backend is not built \
             yet; falling back to cpu"
                .into(),
        )
    } else {
        (BackendKind::Cuda, "--backend auto: using cuda".into())
    }
}

/// `auto` resolved on this machine; the explanation is printed to stderr once per process.
pub fn resolve_auto() -> BackendKind {
    static NOTE: OnceLock<()> = OnceLock::new();
    let (kind, note) = choose_auto(missing(), SCENARIO_MODEL_BUILT);
    NOTE.get_or_init(|| eprintln!("kvbench: {note}"));
    kind
}

/// Why `--backend cuda` cannot run here.
pub fn unavailable(missing: &[String], model_built: bool) -> BackendError {
    if !missing.is_empty() {
        BackendError::Unavailable(format!("cuda: missing {}", missing.join("; ")))
    } else {
        debug_assert!(!model_built);
        BackendError::Unavailable(
            "cuda: the GPU is usable but the cuda scenario backend is not built yet; \
             the kernels run with `kvbench cuda-check` and `kernel-bench --backend cuda`"
                .into(),
        )
    }
}

static EMU_SEED: AtomicU64 = AtomicU64::new(DEFAULT_EMU_SEED);

/// The seed of the emulated device's completion delays when `--emu-seed` is not given.
pub const DEFAULT_EMU_SEED: u64 = 1;

/// Sets the seed of the emulated devices opened from now on (`--emu-seed`; `kvbench fuzz`
/// draws one per case).
pub fn set_emu_seed(seed: u64) {
    EMU_SEED.store(seed, Ordering::Relaxed);
}

/// The emulated devices' delay seed.
pub fn emu_seed() -> u64 {
    EMU_SEED.load(Ordering::Relaxed)
}

/// How emulated devices opened from now on present their driver (`--emu-driver`,
/// `--emu-driver-noise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmuDriver {
    /// `cuDriverGetVersion`'s figure (13000 = 13.0).
    pub version: i32,
    pub noise_seed: Option<u64>,
}

static EMU_DRIVER: std::sync::Mutex<EmuDriver> = std::sync::Mutex::new(EmuDriver {
    version: 13000,
    noise_seed: None,
});

pub fn set_emu_driver(d: EmuDriver) {
    *EMU_DRIVER.lock().unwrap_or_else(|e| e.into_inner()) = d;
}

pub fn emu_driver() -> EmuDriver {
    *EMU_DRIVER.lock().unwrap_or_else(|e| e.into_inner())
}

static DEVICE_LEAK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static DEVICE_LEAKS_PLANTED: AtomicU64 = AtomicU64::new(0);

/// Plants a device leak in the runs from now on (`--inject-fault device-leak`): each cuda
/// backend allocates one KV block's bytes at its first step and never frees them.
pub fn set_device_leak(on: bool) {
    DEVICE_LEAK.store(on, Ordering::Relaxed);
}

pub fn device_leak() -> bool {
    DEVICE_LEAK.load(Ordering::Relaxed)
}

/// How many planted device leaks took effect in this process.
pub fn device_leaks_planted() -> u64 {
    DEVICE_LEAKS_PLANTED.load(Ordering::Relaxed)
}

pub(crate) fn note_device_leak_planted() {
    DEVICE_LEAKS_PLANTED.fetch_add(1, Ordering::Relaxed);
}

/// Prints the delay seed once per process and seed, so a failing run can be replayed.
pub fn note_emu_seed(seed: u64) {
    static LAST: AtomicU64 = AtomicU64::new(u64::MAX);
    if LAST.swap(seed, Ordering::Relaxed) != seed {
        eprintln!(
            "cuda-emu: emulated device, completion delays from --emu-seed {seed}; timings are \
             emulated (not comparable with a GPU)"
        );
    }
}

/// Constructs the backend on the emulated device (`--backend cuda-emu`): needs no GPU and no
/// CUDA library. It is for testing, and `auto` never picks it.
pub fn create_emulated(setup: &super::RunSetup) -> Result<Box<dyn super::Backend>, BackendError> {
    Ok(Box::new(backend::CudaBackend::new(setup, true)?))
}

/// What is missing for `--backend cuda` (driver, NVRTC, cuBLAS, device), as the error a run
/// ends with. Checked before anything about the run is estimated: on a machine without a GPU,
/// that is the one thing to say.
pub fn check_available() -> Result<(), BackendError> {
    let miss = missing();
    if !miss.is_empty() || !SCENARIO_MODEL_BUILT {
        return Err(unavailable(miss, SCENARIO_MODEL_BUILT));
    }
    Ok(())
}

/// Constructs the cuda backend, or says what is missing ([`check_available`]).
pub fn create(setup: &super::RunSetup) -> Result<Box<dyn super::Backend>, BackendError> {
    check_available()?;
    Ok(Box::new(backend::CudaBackend::new(setup, false)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_falls_back_to_cpu_naming_what_is_missing() {
        let miss = vec!["CUDA driver (libcuda) not found".to_string()];
        let (k, note) = choose_auto(&miss, true);
        assert_eq!(k, BackendKind::Cpu);
        assert!(
            note.contains("libcuda") && note.contains("falling back to cpu"),
            "{note}"
        );
        let (k, note) = choose_auto(&[], false);
        assert_eq!(k, BackendKind::Cpu);
        assert!(note.contains("not built"), "{note}");
        assert_eq!(choose_auto(&[], true).0, BackendKind::Cuda);
    }

    #[test]
    fn cuda_unavailable_names_every_missing_piece() {
        let miss = vec![
            "CUDA driver (libcuda) not found".to_string(),
            "NVRTC (libnvrtc) not found".to_string(),
            "cuBLAS (libcublas) not found".to_string(),
        ];
        let msg = unavailable(&miss, true).to_string();
        for m in &miss {
            assert!(msg.contains(m.as_str()), "{msg}");
        }
        assert!(unavailable(&[], false).to_string().contains("not built"));
    }
}

//! Device memory sizes known without reading a device profile, so that a budget given as a
//! share ("90%") can be checked when a scenario is loaded. The full device profiles (bandwidth,
//! FLOP/s) live in `scenarios/devices/*.toml`, owned by the engine; names here match them.

/// Memory of one device in bytes, for the device names scenarios use.
pub fn device_memory_bytes(name: &str) -> Option<u64> {
    match name {
        // NVIDIA H200: 141 GB HBM3e (datasheet, decimal gigabytes).
        "h200" => Some(141_000_000_000),
        // The CPU backend: a nominal 16 GiB so shares stay meaningful on small machines.
        "cpu" => Some(16 << 30),
        _ => None,
    }
}

/// Names [`device_memory_bytes`] knows, for error messages.
pub const KNOWN_DEVICES: &[&str] = &["h200", "cpu"];

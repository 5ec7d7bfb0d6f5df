//! Device memory sizes known without reading a device profile, so that a budget given as a
//! share ("90%") can be checked when a scenario is loaded. The full device profiles (bandwidth,
//! FLOP/s) live in `scenarios/devices/*.toml`, read by `backend/sim/profile.rs`; names here match
//! them.

/// Memory of one device in bytes, for the device names scenarios use.
pub fn device_memory_bytes(name: &str) -> Option<u64> {
    match name {
        // NVIDIA H200: 141 GB HBM3e (datasheet, decimal gigabytes).
        "h200" => Some(141_000_000_000),
        // The other shipped GPU profiles, from the datasheets their files name (decimal GB).
        "a100-40g" => Some(40_000_000_000),
        "a100-80g" | "h100" => Some(80_000_000_000),
        "gh200" => Some(96_000_000_000),
        "b200" => Some(180_000_000_000),
        "l40s" => Some(48_000_000_000),
        "mi300x" => Some(192_000_000_000),
        // The CPU backend: a nominal 16 GiB so shares stay meaningful on small machines.
        "cpu" => Some(16 << 30),
        _ => None,
    }
}

/// Names [`device_memory_bytes`] knows, for error messages.
pub const KNOWN_DEVICES: &[&str] = &[
    "h200", "a100-40g", "a100-80g", "h100", "gh200", "b200", "l40s", "mi300x", "cpu",
];

//! A backend's refusal of a scenario's configuration is placed in the scenario's file as the
//! scenario's own errors are — `FILE:LINE:COL: KEY: message`, exit 2, no results folder — not a
//! bare "backend configuration: ..." that leaves the user to find the key.

use crate::support::kvbench;

/// (backend, `--set`, the key the refusal must name).
const CASES: &[(&str, &str, &str)] = &[
    ("cpu", "model.kv_dtype=f16", "model.kv_dtype"),
    ("cuda-emu", "model.kv_dtype=fp8", "model.kv_dtype"),
    ("cuda-emu", "model.weight_dtype=fp8", "model.weight_dtype"),
];

#[test]
fn backend_refusals_name_the_scenario_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quick-basic.toml");
    for (backend, set, key) in CASES {
        let out = dir.path().join("out");
        let (code, text) = kvbench(&[
            "run",
            scenario,
            "--backend",
            backend,
            "--set",
            set,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{backend} {set}: {text}");
        assert!(!out.exists(), "{backend} {set}: wrote a folder");
        assert!(
            !text.contains("backend configuration:"),
            "{backend} {set}: {text}"
        );
        let at = format!("{scenario}:");
        let line = text.lines().find(|l| l.contains(&at)).unwrap_or_else(|| {
            panic!("{backend} {set}: no {at} in {text}");
        });
        assert!(
            line.contains(&format!(": {key}: ")),
            "{backend} {set}: {key} not named in {line}"
        );
    }
}

//! Every device profile shipped in `scenarios/devices/` loads, passes the range checks, states a
//! source for each constant, and is refused with `FILE:LINE` when broken.

use std::path::{Path, PathBuf};

use kvbench::backend::sim::profile::{DeviceProfile, RANGES};

fn devices_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/devices")
}

/// `(stem, path, text)` of every `*.toml` in `scenarios/devices/`, sorted by name.
fn shipped() -> Vec<(String, PathBuf, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(devices_dir()).expect("read scenarios/devices") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 name")
            .to_string();
        let text = std::fs::read_to_string(&path).expect("read profile");
        out.push((stem, path, text));
    }
    out.sort();
    out
}

/// The GPU profiles this suite expects to ship (the `cpu` profile is fitted, not sourced).
const GPUS: &[&str] = &[
    "a100-40g", "a100-80g", "b200", "gh200", "h100", "h200", "l40s", "mi300x",
];

/// The keys a line `KEY = VALUE` sets, with its 1-based line number and value text.
fn assignments(text: &str) -> Vec<(usize, String, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let l = l.trim();
            if l.starts_with('#') || l.is_empty() {
                return None;
            }
            let (k, v) = l.split_once('=')?;
            Some((i + 1, k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The comment block directly above line `line` (1-based), joined.
fn comment_above(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut block = Vec::new();
    let mut i = line - 1;
    while i > 0 && lines[i - 1].trim_start().starts_with('#') {
        block.push(lines[i - 1]);
        i -= 1;
    }
    block.reverse();
    block.join("\n")
}

#[test]
fn every_expected_profile_ships_and_is_built_in() {
    let stems: Vec<String> = shipped().into_iter().map(|(s, _, _)| s).collect();
    let builtin: Vec<&str> = DeviceProfile::builtin_names().collect();
    for gpu in GPUS {
        assert!(stems.iter().any(|s| s == gpu), "{gpu}.toml missing");
    }
    for stem in &stems {
        assert!(
            builtin.contains(&stem.as_str()),
            "{stem}.toml ships but is not compiled in (built in: {builtin:?})"
        );
    }
}

#[test]
fn every_shipped_profile_loads_and_matches_its_built_in_copy() {
    for (stem, path, _) in shipped() {
        let from_file =
            DeviceProfile::load_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(from_file.name, stem, "name key differs from the file name");
        assert!(
            from_file.problems().is_empty(),
            "{stem}: {:?}",
            from_file.problems()
        );
        let built_in = DeviceProfile::load(&stem, None).expect("built in");
        assert_eq!(from_file, built_in, "{stem}: built-in copy differs");
    }
}

#[test]
fn gpu_profiles_keep_effective_figures_below_the_datasheet() {
    for gpu in GPUS {
        let p = DeviceProfile::load(gpu, None).expect("load");
        assert!(
            p.hbm_effective_bytes_per_s < p.hbm_datasheet_bytes_per_s,
            "{gpu}: effective HBM {} not below datasheet {}",
            p.hbm_effective_bytes_per_s,
            p.hbm_datasheet_bytes_per_s
        );
        // Sustained bandwidth between 70% and 100% of the datasheet peak: anything else is a
        // units slip (GB/s written as TB/s) rather than a derivation.
        let share = p.hbm_effective_bytes_per_s / p.hbm_datasheet_bytes_per_s;
        assert!((0.7..1.0).contains(&share), "{gpu}: {share}");
    }
}

/// Words that say where a constant comes from.
const SOURCE_WORDS: &[&str] = &["datasheet", "measured", "derived", "assumption", "fitted"];

/// `KEY at line N` for every numeric constant of profile `stem` without a source comment
/// directly above it, and the count of numeric constants seen.
fn unsourced(stem: &str, text: &str) -> (Vec<String>, usize) {
    let mut missing = Vec::new();
    let mut numeric = 0;
    for (line, key, value) in assignments(text) {
        if value.replace('_', "").parse::<f64>().is_err() {
            continue;
        }
        numeric += 1;
        let comment = comment_above(text, line).to_ascii_lowercase();
        // The cpu profile's memory and datasheet lines are carried over from its base ("kept
        // from"); every other constant must say what kind of source it has.
        let named = SOURCE_WORDS.iter().any(|w| comment.contains(w))
            || (stem == "cpu" && comment.contains("kept from"));
        let datasheet_key = matches!(key.as_str(), "memory_bytes" | "hbm_datasheet_bytes_per_s");
        if !named || (GPUS.contains(&stem) && datasheet_key && !comment.contains("datasheet")) {
            missing.push(format!("{key} at line {line}"));
        }
    }
    (missing, numeric)
}

#[test]
fn every_numeric_constant_in_every_profile_has_a_source_comment() {
    for (stem, path, text) in shipped() {
        let (missing, numeric) = unsourced(&stem, &text);
        assert!(
            missing.is_empty(),
            "{}: no source comment (want one of {SOURCE_WORDS:?}) for {missing:?}",
            path.display()
        );
        assert!(
            numeric >= 7,
            "{stem}: only {numeric} numeric constants found"
        );
    }
}

#[test]
fn the_source_check_catches_a_constant_without_a_comment() {
    let text = include_str!("../../../scenarios/devices/l40s.toml");
    let stripped: String = text
        .lines()
        .filter(|l| !l.contains("Memory bandwidth 864GB/s") && !l.contains("Kept for the report"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(stripped, text);
    let (missing, _) = unsourced("l40s", &stripped);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(
        missing[0].starts_with("hbm_datasheet_bytes_per_s"),
        "{missing:?}"
    );
}

#[test]
fn an_out_of_range_value_is_refused_at_its_line_in_every_profile() {
    for (stem, _, text) in shipped() {
        for (line, key, _) in assignments(&text) {
            if !RANGES.iter().any(|(k, _, _)| *k == key) {
                continue;
            }
            let broken: String = text
                .lines()
                .enumerate()
                .map(|(i, l)| {
                    if i + 1 == line {
                        format!("{key} = -1.0\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            let err = DeviceProfile::parse(&broken, Some(Path::new("broken.toml")))
                .expect_err(&format!("{stem}: {key} = -1.0 accepted"))
                .to_string();
            assert!(
                err.contains(&format!("broken.toml:{line}:1: {key}: must be between")),
                "{stem}: {err}"
            );
        }
    }
}

#[test]
fn memory_out_of_range_is_refused_at_its_line() {
    let text = include_str!("../../../scenarios/devices/h100.toml");
    let (line, ..) = assignments(text)
        .into_iter()
        .find(|(_, k, _)| k == "memory_bytes")
        .expect("memory_bytes");
    let broken = text.replace("memory_bytes = 80_000_000_000", "memory_bytes = 5");
    assert_ne!(broken, text);
    let err = DeviceProfile::parse(&broken, Some(Path::new("h100.toml")))
        .expect_err("5 bytes")
        .to_string();
    assert!(
        err.contains(&format!(
            "h100.toml:{line}:1: memory_bytes: must be between"
        )),
        "{err}"
    );
}

#[test]
fn a_wrong_type_is_refused_at_its_line() {
    let text = include_str!("../../../scenarios/devices/mi300x.toml");
    let (line, ..) = assignments(text)
        .into_iter()
        .find(|(_, k, _)| k == "peak_flops_per_s")
        .expect("peak_flops_per_s");
    let broken = text.replace("peak_flops_per_s = 1044e12", "peak_flops_per_s = \"fast\"");
    assert_ne!(broken, text);
    let err = DeviceProfile::parse(&broken, Some(Path::new("mi300x.toml")))
        .expect_err("string")
        .to_string();
    assert!(
        err.contains(&format!("mi300x.toml:{line}:")) && err.contains("peak_flops_per_s"),
        "{err}"
    );
}

#[test]
fn a_missing_key_is_refused_naming_the_file_and_key() {
    let text = include_str!("../../../scenarios/devices/gh200.toml");
    let broken: String = text
        .lines()
        .filter(|l| !l.starts_with("host_link_bytes_per_s"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(broken, text);
    let err = DeviceProfile::parse(&broken, Some(Path::new("gh200.toml")))
        .expect_err("missing key")
        .to_string();
    assert!(
        err.contains("gh200.toml:") && err.contains("host_link_bytes_per_s"),
        "{err}"
    );
}

#[test]
fn an_unknown_key_is_refused_at_its_line() {
    let text = include_str!("../../../scenarios/devices/l40s.toml");
    let broken = format!("{text}warp_drive_bytes_per_s = 1e9\n");
    let line = broken.lines().count();
    let err = DeviceProfile::parse(&broken, Some(Path::new("l40s.toml")))
        .expect_err("unknown key")
        .to_string();
    assert!(err.contains(&format!("l40s.toml:{line}:")), "{err}");
}

#[test]
fn scenario_device_memory_matches_every_shipped_profile() {
    // A scenario's "90%" budget is checked at load time from a table of memory sizes; it must
    // agree with the profile the `sim` backend then runs.
    for (stem, _, _) in shipped() {
        let p = DeviceProfile::load(&stem, None).expect("load");
        assert_eq!(
            kvbench::scenario::device_memory_bytes(&stem),
            Some(p.memory_bytes),
            "{stem}"
        );
        assert!(
            kvbench::scenario::KNOWN_DEVICES.contains(&stem.as_str()),
            "{stem}"
        );
    }
}

//! `kvbench gate` against planted regressions: a smaller step budget fails it (exit 1), a rerun
//! of the same code passes (exit 0), a different workload or device profile is refused (exit 2:
//! figures priced on another device are not a regression of the code). One cheap sweep
//! configuration throughout (700 requests, one seed, 5% precision).

use crate::support;

use std::path::Path;

use support::kvbench;

const CHEAP: &[&str] = &[
    "--backend",
    "sim",
    "--set",
    "traffic.requests=700",
    "--precision",
    "5",
    "--force",
];

fn sweep(scenario: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "sweep",
        scenario.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(CHEAP);
    args.extend_from_slice(extra);
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{text}");
}

fn gate(base: &Path, cur: &Path) -> (i32, String) {
    kvbench(&[
        "gate",
        "--baseline",
        base.to_str().unwrap(),
        "--current",
        cur.to_str().unwrap(),
        "--max-regression",
        "5",
    ])
}

#[test]
fn gate_fails_planted_regressions_and_passes_a_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let chat = Path::new("scenarios/chat-8b-h200.toml");
    sweep(chat, &d.join("base"), &[]);

    sweep(chat, &d.join("rerun"), &[]);
    let (code, text) = gate(&d.join("base"), &d.join("rerun"));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("gate: passed") && text.contains("rate_at_target_rps"),
        "{text}"
    );

    // A device with 30% less memory bandwidth: a copy of the profile beside a copy of the scenario.
    std::fs::create_dir(d.join("devices")).unwrap();
    let profile = std::fs::read_to_string("scenarios/devices/h200.toml").unwrap();
    let slow = profile
        .replace("name = \"h200\"", "name = \"h200-slow\"")
        .replace(
            "hbm_effective_bytes_per_s = 4.3e12",
            "hbm_effective_bytes_per_s = 3.0e12",
        );
    assert_ne!(
        slow, profile,
        "the profile's bandwidth line moved: update this test"
    );
    std::fs::write(d.join("devices/h200-slow.toml"), slow).unwrap();
    std::fs::copy(chat, d.join("chat.toml")).unwrap();
    sweep(
        &d.join("chat.toml"),
        &d.join("slow"),
        &["--set", "device=h200-slow"],
    );
    let (code, text) = gate(&d.join("base"), &d.join("slow"));
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("priced with device profile h200 (") && text.contains("with h200-slow ("),
        "{text}"
    );
    assert!(!text.contains("gate: passed"), "{text}");

    // A step budget of 128 tokens instead of 4,096.
    sweep(
        chat,
        &d.join("budget"),
        &["--set", "scheduler.max_tokens_per_step=128"],
    );
    let (code, text) = gate(&d.join("base"), &d.join("budget"));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("REGRESSED"), "{text}");
}

#[test]
fn gate_refuses_different_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let chat = Path::new("scenarios/chat-8b-h200.toml");
    sweep(chat, &d.join("base"), &["--set", "traffic.requests=600"]);
    sweep(
        chat,
        &d.join("other"),
        &[
            "--set",
            "traffic.requests=600",
            "--set",
            "traffic.prompt_tokens.median=500",
        ],
    );
    let (code, text) = gate(&d.join("base"), &d.join("other"));
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("workload hash"), "{text}");
    sweep(
        chat,
        &d.join("seed"),
        &["--set", "traffic.requests=600", "--seed", "7"],
    );
    let (code, text) = gate(&d.join("base"), &d.join("seed"));
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("only in the baseline"), "{text}");
    // A run folder is not a sweep.
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--out",
        d.join("run").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = gate(&d.join("base"), &d.join("run"));
    assert_eq!(code, 2, "{text}");
}

//! Results folders are input: a path read from a file stays in its folder or is refused, every
//! file read whole is size-capped and parsed strictly, `--force` replaces only a results folder
//! or an empty one, and a failed or interrupted `suite` or `merge` leaves no partial folder.

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::kvbench;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Shard 0/1 of a one-scenario, two-seed sim suite of quick-basic: a whole suite as one shard.
fn shard(out: &Path) {
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--seeds",
        "2",
        "--shard",
        "0/1",
        "--out",
        s(out),
    ]);
    assert_eq!(code, 0, "{text}");
}

fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

#[test]
fn a_cell_dir_that_leaves_its_folder_is_refused_by_merge_report_and_compare() {
    let root = tempfile::tempdir().unwrap();
    let good = root.path().join("good");
    shard(&good);
    let victim = root.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    for (i, bad) in [
        "../victim".to_string(),
        s(&victim).to_string(),
        "a/b".to_string(),
        "..".to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        let sh = root.path().join(format!("bad{i}"));
        copy_tree(&good, &sh);
        let mut j: Value =
            serde_json::from_str(&std::fs::read_to_string(sh.join("suite.json")).unwrap()).unwrap();
        j["plan"][0]["dir"] = Value::from(bad.clone());
        std::fs::write(sh.join("suite.json"), j.to_string()).unwrap();
        let out = root.path().join(format!("merged{i}"));
        let (code, text) = kvbench(&["merge", s(&sh), "--out", s(&out)]);
        assert_eq!(code, 2, "{bad}: {text}");
        assert!(
            text.contains("suite.json") && text.contains("plan[0].dir"),
            "{bad}: {text}"
        );
        assert!(!out.exists(), "{bad}: merge wrote {}", out.display());
        let (code, text) = kvbench(&["report", s(&sh)]);
        assert_eq!(code, 2, "{bad}: {text}");
        assert!(text.contains("plan[0].dir"), "{bad}: {text}");
        let (code, text) = kvbench(&["compare", s(&good), s(&sh)]);
        assert_eq!(code, 2, "{bad}: {text}");
        assert!(text.contains("plan[0].dir"), "{bad}: {text}");
        assert!(
            ls(&victim).is_empty(),
            "{bad}: wrote into the victim folder"
        );
    }
}

#[test]
fn a_truncated_summary_is_refused_naming_the_file() {
    let root = tempfile::tempdir().unwrap();
    let run = root.path().join("run");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--out",
        s(&run),
    ]);
    assert_eq!(code, 0, "{text}");
    let other = root.path().join("other");
    copy_tree(&run, &other);
    let path = run.join("summary.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    let name = path.display().to_string();
    for args in [
        vec!["report", s(&run)],
        vec!["compare", s(&run), s(&other)],
        vec!["gate", "--baseline", s(&other), "--current", s(&run)],
    ] {
        let (code, out) = kvbench(&args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(out.contains(&name), "{args:?}: {out}");
    }
}

#[test]
fn an_oversized_sweep_json_is_refused_by_its_size() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("sweep");
    std::fs::create_dir(&dir).unwrap();
    // 600 MB, sparse: no disk used, and reading it whole would cost 600 MB of memory or more.
    let f = std::fs::File::create(dir.join("sweep.json")).unwrap();
    f.set_len(600 << 20).unwrap();
    drop(f);
    for args in [
        vec!["report", s(&dir)],
        vec!["compare", "results/baseline/sim/chat-8b-h200", s(&dir)],
    ] {
        let started = std::time::Instant::now();
        let (code, out) = kvbench(&args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(
            out.contains("sweep.json: 629145600 bytes: larger than"),
            "{args:?}: {out}"
        );
        // Not a timing claim: a refusal by size returns before reading; this only catches a
        // regression that reads 600 MB of zeros first (seconds even from the page cache).
        println!("{args:?} refused in {:?}", started.elapsed());
    }
}

/// `report` reads a run's `report.md` and a suite's `suite.csv` whole: past the cap, refused.
#[test]
fn report_refuses_oversized_files_it_would_read_whole() {
    let root = tempfile::tempdir().unwrap();
    let sh = root.path().join("suite");
    shard(&sh);
    let cell = std::fs::read_dir(&sh)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("report.md").is_file())
        .unwrap();
    for victim in [cell.join("report.md"), sh.join("suite.csv")] {
        let saved = std::fs::read(&victim).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&victim)
            .unwrap()
            .set_len(600 << 20)
            .unwrap();
        let (code, out) = kvbench(&["report", s(&sh)]);
        assert_eq!(code, 2, "{out}");
        assert!(
            out.contains(&format!(
                "{}: 629145600 bytes: larger than",
                victim.display()
            )),
            "{out}"
        );
        std::fs::write(&victim, saved).unwrap();
    }
    let (code, out) = kvbench(&["report", s(&sh)]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn merge_force_replaces_only_a_results_folder_or_an_empty_one() {
    let root = tempfile::tempdir().unwrap();
    let sh = root.path().join("shard");
    shard(&sh);
    // Someone's folder.
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("notes.txt"), "mine").unwrap();
    let (code, text) = kvbench(&["merge", s(&sh), "--out", s(&data), "--force"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a kvbench results folder"), "{text}");
    assert_eq!(ls(&data), ["notes.txt"]);
    // A regular file: refused, left in place, nothing renamed aside.
    let file = root.path().join("file");
    std::fs::write(&file, "keep").unwrap();
    let before = ls(root.path());
    let (code, text) = kvbench(&["merge", s(&sh), "--out", s(&file), "--force"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a folder"), "{text}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    assert_eq!(ls(root.path()), before);
    // An empty folder, then the merged suite itself: replaced.
    let out = root.path().join("merged");
    std::fs::create_dir(&out).unwrap();
    let (code, text) = kvbench(&["merge", s(&sh), "--out", s(&out)]);
    assert_eq!(code, 2, "without --force: {text}");
    let (code, text) = kvbench(&["merge", s(&sh), "--out", s(&out), "--force"]);
    assert_eq!(code, 0, "{text}");
    assert!(out.join("suite.json").is_file());
    let (code, text) = kvbench(&["merge", s(&sh), "--out", s(&out), "--force"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(ls(root.path()), ["data", "file", "merged", "shard"]);
}

#[test]
fn a_failed_merge_leaves_no_folder() {
    let root = tempfile::tempdir().unwrap();
    let sh = root.path().join("shard");
    shard(&sh);
    // suite.json says the shard ran a cell whose folder is gone: the copy fails midway.
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(sh.join("suite.json")).unwrap()).unwrap();
    let last = meta["plan"].as_array().unwrap().last().unwrap()["dir"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::remove_dir_all(sh.join(&last)).unwrap();
    let out = root.path().join("merged");
    let (code, text) = kvbench(&["merge", s(&sh), "--out", s(&out)]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(&last), "{text}");
    assert_eq!(ls(root.path()), ["shard"], "a partial folder was left");
}

/// SIGINT while the suite runs: `--out` is left as it was (here: absent) and no temporary
/// folder remains. Polls for the first finished cell inside the temporary folder, then signals.
#[test]
fn an_interrupted_suite_leaves_no_partial_folder() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("suite");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "suite",
            "scenarios/quick-basic.toml",
            "--backend",
            "sim",
            "--seeds",
            "200",
            "--out",
            s(&out),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let cell_done = |p: &PathBuf| -> bool {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.path().join("summary.json").is_file())
            })
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let tmp: Vec<PathBuf> = std::fs::read_dir(root.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(".suite.tmp-"))
            })
            .collect();
        if tmp.iter().any(cell_done) {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the suite ended before it was interrupted"
        );
        assert!(std::time::Instant::now() < deadline, "no cell finished");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !out.exists(),
        "cells reached --out before the suite finished"
    );
    let pid = child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(ls(root.path()).is_empty(), "left: {:?}", ls(root.path()));
}

#[test]
fn a_suite_too_large_to_run_is_refused_before_allocating() {
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--seeds",
        "1000000000",
        "--out",
        "target/never-written",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("more than 100000 cells"), "{text}");
    assert!(!Path::new("target/never-written").exists());
}

/// A suite replaces its own cells and table in an existing folder and leaves everything else
/// there alone (the folder collects results, as `results/latest` does).
#[test]
fn a_suite_into_an_existing_folder_replaces_only_its_own_entries() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("latest");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    for _ in 0..2 {
        let (code, text) = kvbench(&[
            "suite",
            "scenarios/quick-basic.toml",
            "--backend",
            "sim",
            "--out",
            s(&out),
        ]);
        assert_eq!(code, 0, "{text}");
    }
    assert_eq!(
        ls(&out),
        [
            "notes.txt",
            "quick-basic",
            "report.html",
            "suite.csv",
            "suite.json",
            "suite.md"
        ]
    );
    assert_eq!(ls(root.path()), ["latest"]);
    // A non-results folder where a cell goes: refused before anything runs.
    let other = root.path().join("other");
    std::fs::create_dir_all(other.join("quick-basic")).unwrap();
    std::fs::write(other.join("quick-basic/data.txt"), "mine").unwrap();
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--out",
        s(&other),
    ]);
    assert_eq!(code, 2, "{text}");
    assert_eq!(ls(&other), ["quick-basic"]);
    assert_eq!(ls(root.path()), ["latest", "other"]);
}

//! A KV budget that cannot hold one request is refused before any work, on every backend and
//! under either cache manager — including the hybrid managers' pool, cut into whole pages, of
//! which the contiguous baseline first reserves recurrent state before a reservation gets any
//! room (it used to pass the bytes-a-token check and stall the contiguous run with "nothing
//! schedulable").

use crate::support;

use support::kvbench;

const SCENARIO: &str = "scenarios/quick-basic.toml";

/// `run` of quick-basic on `tiny-hybrid` with `budget`, the manager and backend given, writing
/// into a fresh folder; returns the exit code, the output and whether the folder was created.
fn run_hybrid_model(
    backend: &str,
    manager: &str,
    budget: &str,
    extra: &[&str],
) -> (i32, String, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let out_s = out.to_str().expect("utf-8 path");
    let budget = format!("memory.kv_budget={budget}");
    let manager = format!("cache.manager={manager}");
    let mut args = vec![
        "run",
        SCENARIO,
        "--backend",
        backend,
        "--out",
        out_s,
        "--set",
        "model.preset=tiny-hybrid",
        "--set",
        "scheduler.prefix_cache=false",
        "--set",
        &manager,
        "--set",
        &budget,
    ];
    for e in extra {
        args.extend(["--set", e]);
    }
    let (code, text) = kvbench(&args);
    (code, text, out.exists())
}

// tiny-hybrid: two full layers of 512 bytes a token each (1024 bytes a token), two recurrent
// layers of 256 bytes a sequence each (512 bytes a sequence). quick-basic reserves
// max_seq_len = 256 tokens a contiguous sequence (256 KiB), and its longest request is
// 96 + 48 = 144 tokens; 64 sequences a step (`scheduler.max_seqs_per_step`).

#[test]
fn hybrid_pool_that_cannot_hold_one_contiguous_reservation_is_refused_up_front() {
    // 256 KiB is 16 pages of 16 KiB (2 layers x 16 tokens x 512 B). The contiguous baseline
    // reserves 64 x 512 B of state first: 224 KiB, 14 pages, where a reservation of 256 tokens
    // needs 16. A paged 144-token sequence takes 9 pages and its state one more.
    let (code, text, written) = run_hybrid_model("sim", "hybrid", "256KiB", &[]);
    assert_eq!(code, 2, "{text}");
    assert!(!written, "a refused run wrote its folder: {text}");
    for part in [
        SCENARIO,
        "memory.kv_budget",
        "262144 bytes",
        "64 sequences",
        "16 pages of 16 KiB",
        "leaving it 14 pages",
        "10 pages (160 KiB) paged",
        "16 pages (256 KiB) contiguous",
    ] {
        assert!(text.contains(part), "missing {part:?} in: {text}");
    }
    assert!(!text.contains("stalled"), "{text}");
}

#[test]
fn auto_on_sim_is_refused_the_same_way_and_fewer_states_make_room() {
    // `auto` picks hybrid on sim for a model with a recurrent group.
    let (code, text, written) = run_hybrid_model("sim", "auto", "256KiB", &[]);
    assert_eq!(code, 2, "{text}");
    assert!(!written, "{text}");
    assert!(text.contains("16 pages (256 KiB) contiguous"), "{text}");
    // Four states (2 KiB) leave 15 pages: still one short.
    let (code, text, _) = run_hybrid_model(
        "sim",
        "hybrid",
        "256KiB",
        &["scheduler.max_seqs_per_step=4"],
    );
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("leaving it 15 pages"), "{text}");
    // 274 KiB - 4 x 512 B = 272 KiB: 17 pages, room for one reservation: it runs.
    let (code, text, written) = run_hybrid_model(
        "sim",
        "hybrid",
        "274KiB",
        &["scheduler.max_seqs_per_step=4"],
    );
    assert_eq!(code, 0, "{text}");
    assert!(written, "{text}");
}

#[test]
fn summed_pool_is_refused_below_one_reservation_and_runs_at_it_on_sim_and_cpu() {
    for backend in ["sim", "cpu"] {
        // Summed counts 1024 bytes a token and no state: 255 KiB is one token short.
        let (code, text, written) = run_hybrid_model(backend, "summed", "255KiB", &[]);
        assert_eq!(code, 2, "{backend}: {text}");
        assert!(!written, "{backend}: {text}");
        assert!(text.contains("memory.kv_budget"), "{backend}: {text}");
        assert!(
            text.contains("262144 bytes (256 KiB) contiguous"),
            "{backend}: {text}"
        );
        let (code, text, written) =
            run_hybrid_model(backend, "summed", "256KiB", &["traffic.requests=4"]);
        assert_eq!(code, 0, "{backend}: {text}");
        assert!(written, "{backend}: {text}");
    }
}

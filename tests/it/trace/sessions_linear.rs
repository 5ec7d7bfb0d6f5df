//! A CSV session of 50,000 turns replays in linear work: making a turn's prompt ids walks a
//! bounded number of links of its session's chain (it walked every earlier turn: quadratic in
//! the session's length), and the ids are still exactly "the previous turn's prompt, as much
//! as fits, then the turn's own fresh ids".
//!
//! Work is counted (links walked per prompt), not timed.

use std::io::Write;
use std::path::Path;

use kvbench::scenario::{ArrivalSpec, TraceSpec};
use kvbench::workload::{self, Head, Prompt, Recipe, Request};

const TURNS: u64 = 50_000;

fn session_trace(dir: &Path, len: impl Fn(u64) -> u64) -> std::path::PathBuf {
    let path = dir.join("session.csv");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    writeln!(f, "arrival_ms,prompt_tokens,output_tokens,session_id").unwrap();
    for i in 0..TURNS {
        writeln!(f, "{},{},4,s", i * 10, len(i)).unwrap();
    }
    f.into_inner().expect("flush").sync_all().unwrap();
    path
}

fn replay(path: &Path) -> Vec<Request> {
    let mut s = kvbench::scenario::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/trace-csv.toml"),
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    s.traffic.arrival = ArrivalSpec::Trace(TraceSpec::new(path.display().to_string()));
    let w = workload::generate(&s, s.seed).expect("workload");
    assert_eq!(w.requests.len() as u64, TURNS);
    w.requests
}

fn recipe(r: &Request) -> &Recipe {
    match &r.prompt {
        Prompt::Recipe(x) => x,
        Prompt::Explicit(_) => panic!("a trace row's prompt is a recipe"),
    }
}

#[test]
fn a_session_of_equal_turns_walks_a_bounded_chain_per_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reqs = replay(&session_trace(dir.path(), |_| 64));
    let links: Vec<usize> = reqs.iter().map(|r| recipe(r).chain_links()).collect();
    let total: usize = links.iter().sum();
    let most = links.iter().copied().max().unwrap_or(0);
    println!("{TURNS} equal turns: {total} links walked in all, {most} at most for one turn");
    // Each turn is its first turn's 64 ids: one link to it, whatever the session's length.
    assert!(most <= 2, "a turn walks {most} links");
    assert!(total as u64 <= 2 * TURNS, "{total} links for {TURNS} turns");
    let first = reqs[0].prompt.tokens().into_owned();
    assert_eq!(first.len(), 64);
    for r in reqs.iter().step_by(4999) {
        assert_eq!(r.prompt.tokens()[..], first[..], "request {}", r.id);
    }
}

#[test]
fn a_session_of_varying_turns_keeps_its_ids_and_walks_links_that_each_add_ids() {
    // Lengths wander in 40..=239: some turns grow past the previous one, some shrink.
    let len = |i: u64| 40 + (i * 7919 + i * i * 31) % 200;
    let dir = tempfile::tempdir().expect("tempdir");
    let reqs = replay(&session_trace(dir.path(), len));
    // Every link walked adds at least one id (the chain holds no row that only repeats an
    // earlier one): at most one link per id made.
    let mut total = 0usize;
    for r in &reqs {
        let links = recipe(r).chain_links();
        total += links;
        assert!(
            links <= r.prompt.len_tokens() as usize + 1,
            "request {}: {links} links for {} ids",
            r.id,
            r.prompt.len_tokens()
        );
    }
    println!("{TURNS} varying turns: {total} links walked in all");
    assert!(total as u64 <= 200 * TURNS);
    // The ids, checked against their definition for the first 3,000 turns.
    let mut prev: Vec<u32> = Vec::new();
    for r in reqs.iter().take(3000) {
        let x = recipe(r);
        let keep = if r.id == 0 {
            0
        } else {
            prev.len().min(x.len_tokens as usize)
        };
        let own = Recipe {
            seed: x.seed,
            key: x.key,
            len_tokens: x.len_tokens - keep as u32,
            vocab: x.vocab,
            head: Head::Fresh {
                opens_session: false,
            },
        }
        .tokens();
        let mut want = prev[..keep].to_vec();
        want.extend_from_slice(&own);
        let got = r.prompt.tokens().into_owned();
        assert_eq!(got, want, "request {}", r.id);
        prev = got;
    }
}

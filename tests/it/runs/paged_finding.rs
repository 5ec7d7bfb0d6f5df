//! The PagedAttention finding, reproduced on `sim` at the 8B-on-H200 shape with a `max_seq_len`
//! reservation and a chat-like length mix: contiguous KV waste well above 50%, paged under 5%,
//! paged holding a multiple of the contiguous concurrency. (A shortened request count keeps the
//! test quick; the full scenario is `kvbench run scenarios/chat-8b-h200.toml --backend sim`.)

use std::path::PathBuf;

use kvbench::experiment::{self, RunOptions};
use kvbench_cache_api::CacheMode;

#[test]
fn paged_wastes_little_and_holds_a_multiple_of_the_contiguous_concurrency() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/chat-8b-h200.toml");
    // Enough load that memory binds the contiguous baseline.
    let o = ["traffic.requests=400", "traffic.arrival.rate_per_s=60"].map(String::from);
    let s = kvbench::scenario::load(&path, &o).expect("scenario");
    let opts = RunOptions {
        invariant_check_every: 16,
        ..RunOptions::default()
    };
    let exp = experiment::run_scenario(&s, &opts).expect("run");
    assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    let paged = &exp.run(CacheMode::Paged).expect("paged").metrics;
    let contiguous = &exp.run(CacheMode::Contiguous).expect("contiguous").metrics;
    let (pw, cw) = (
        paged.ledger.kv_waste_fraction,
        contiguous.ledger.kv_waste_fraction,
    );
    assert!(cw > 0.5, "contiguous waste {cw}");
    assert!(pw < 0.05, "paged waste {pw}");
    let pc = exp.run(CacheMode::Paged).expect("paged").end.peak_running;
    let cc = exp
        .run(CacheMode::Contiguous)
        .expect("contiguous")
        .end
        .peak_running;
    assert!(
        pc >= 2 * cc,
        "paged peak concurrency {pc} vs contiguous {cc}"
    );
    // The contiguous baseline is capped by its reservations: 20 GiB / 512 MiB = 40 sequences.
    assert!(cc <= 40, "{cc}");
    assert!(paged.throughput_tokens_per_s > contiguous.throughput_tokens_per_s);
}

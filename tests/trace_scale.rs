//! Trace replay at scale: a generated 200,000-row trace parses row by row with bounded
//! allocation (`trace stats` holds no row; a replay holds one compact descriptor per request,
//! never its prompt's token ids), and a descriptor's size stays bounded.
//!
//! One test function: the counting allocator sees every thread of this binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use kvbench::scenario::{ArrivalSpec, TraceSpec};
use kvbench::workload::{self, trace, Prompt, Request};

/// The system allocator, counting live bytes and their peak since the last `reset_peak`.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Relaxed) + l.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Peak bytes allocated beyond what was live when `f` started.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed).saturating_sub(base))
}

const ROWS: u64 = 200_000;

#[test]
fn a_large_trace_parses_with_bounded_allocation() {
    // Descriptor sizes: a request (with its inline recipe) and a prompt.
    let request_bytes = std::mem::size_of::<Request>();
    println!(
        "size_of Request {request_bytes} B, Prompt {} B",
        std::mem::size_of::<Prompt>()
    );
    assert!(request_bytes <= 144, "Request is {request_bytes} bytes");
    assert!(std::mem::size_of::<Prompt>() <= 48);

    // A plain CSV: arrival, prompt (1..=3000 tokens), output, fixed by the row number.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.csv");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    writeln!(f, "arrival_ms,prompt_tokens,output_tokens").unwrap();
    let (mut prompt_sum, mut max_prompt) = (0u64, 0u64);
    for i in 0..ROWS {
        let p = 1 + (i * 7919) % 3000;
        prompt_sum += p;
        max_prompt = max_prompt.max(p);
        writeln!(f, "{}.5,{p},{}", i * 3, 1 + i % 400).unwrap();
    }
    f.into_inner().expect("flush").sync_all().unwrap();

    // `trace stats` streams: its memory follows the distinct lengths, not the rows.
    let spec = TraceSpec::new(path.display().to_string());
    let (st, stats_peak) =
        peak_during(|| trace::trace_stats(&path, &spec, Some(4096), 16).expect("stats"));
    println!("trace stats: {ROWS} rows, peak {stats_peak} B allocated");
    assert_eq!(st.rows, ROWS);
    assert_eq!(st.prompt_tokens.max as u64, max_prompt);
    let rate = st.mean_rate_per_s.expect("a rate");
    assert!((rate - 1000.0 / 3.0).abs() < 1e-6, "{rate}");
    assert!(st.gap_cv.expect("a gap CV").abs() < 1e-9);
    assert!(
        stats_peak < 2 << 20,
        "trace stats allocated {stats_peak} B at peak"
    );

    // A replay holds one descriptor per request, never a prompt's ids (4 B a token), and the
    // sorted rows only while it builds the list.
    let mut s = kvbench::scenario::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/trace-csv.toml"),
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    s.traffic.arrival = ArrivalSpec::Trace(TraceSpec::new(path.display().to_string()));
    let (w, replay_peak) = peak_during(|| workload::generate(&s, s.seed).expect("workload"));
    println!(
        "replay: {ROWS} requests, peak {replay_peak} B allocated ({} B a request); explicit ids \
         would hold {} B",
        replay_peak as u64 / ROWS,
        prompt_sum * 4
    );
    assert_eq!(w.requests.len() as u64, ROWS);
    assert!(
        (replay_peak as u64) < ROWS * 512,
        "replay allocated {replay_peak} B at peak"
    );
    assert!((replay_peak as u64) < prompt_sum * 4 / 10);
    // Held, the list is its descriptors: nothing on the heap per prompt.
    let heap: usize = w.requests.iter().map(|r| r.prompt.heap_bytes()).sum();
    assert_eq!(heap, 0);
    // Lengths read back exactly, and ids are made on demand with the right length.
    for (i, r) in w.requests.iter().enumerate().step_by(9973) {
        assert_eq!(r.prompt.len_tokens() as u64, 1 + (i as u64 * 7919) % 3000);
        assert_eq!(r.prompt.tokens().len(), r.prompt.len_tokens() as usize);
        assert_eq!(r.arrival_ms, i as f64 * 3.0);
    }
    drop(w);
}

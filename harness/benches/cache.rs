//! Cache-manager microbenchmarks, each with 10k+ live sequences in the cache so free lists, maps
//! and the LRU are at a realistic size.
//!
//! `cargo bench --bench cache -- --quick` (or `--measurement-time 2`). Targets (issue 3):
//! ≥ 20 M block allocate+free pairs/s on one core; prefix lookup ≤ 1 µs per block.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvbench::cache::{BlockAllocator, PagedCache, PagedConfig, Placement};
use kvbench_baselines::manager::ContiguousCache;
use kvbench_cache_api::{KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest};

const BLOCK_SIZE: u32 = 16;
const LIVE_SEQS: u64 = 10_000;
/// Tokens per background sequence: 4 full blocks and a partial one.
const LIVE_TOKENS: u32 = 70;
const PROMPT_TOKENS: usize = 1024;

fn scope() -> ScopeKey {
    ScopeKey {
        model: "llama-8b".into(),
        tokenizer: "tok".into(),
        reuse: ReuseScope::Tenant(1),
    }
}

/// A paged cache with `LIVE_SEQS` filled sequences and room for more.
fn loaded_paged(prefix_cache: bool) -> PagedCache {
    let per_seq = u64::from(LIVE_TOKENS.div_ceil(BLOCK_SIZE));
    let total_blocks = (LIVE_SEQS * per_seq * 2 + 100_000) as u32;
    let mut c = PagedCache::new(PagedConfig {
        total_blocks,
        block_size: BLOCK_SIZE,
        prefix_cache,
        placement: Placement::Lifo,
    });
    let s = scope();
    for seq in 0..LIVE_SEQS {
        let tokens: Vec<u32> = (0..LIVE_TOKENS).map(|t| (seq as u32) * 1000 + t).collect();
        let req = StartRequest {
            seq,
            tokens: &tokens,
            scope: Some(&s),
            reserve_tokens: LIVE_TOKENS,
        };
        c.start(&req).expect("room for the background sequences");
        c.fill(seq, LIVE_TOKENS).expect("fill");
    }
    c
}

fn block_alloc_free(c: &mut Criterion) {
    let mut g = c.benchmark_group("block_alloc_free");
    g.throughput(Throughput::Elements(1));
    // 10k sequences' worth of blocks held, the rest free.
    let mut a = BlockAllocator::new(200_000, BLOCK_SIZE);
    let held: Vec<u32> = (0..LIVE_SEQS * 5).filter_map(|_| a.allocate()).collect();
    g.bench_function("pair", |b| {
        b.iter(|| {
            let block = a.allocate().expect("free block");
            a.free(black_box(block));
        })
    });
    g.finish();
    black_box(held);
}

fn seq_start_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("seq_start_release");
    g.throughput(Throughput::Elements(1));
    let tokens: Vec<u32> = (0..48).collect();
    let mut paged = loaded_paged(false);
    let req = StartRequest {
        seq: u64::MAX,
        tokens: &tokens,
        scope: None,
        reserve_tokens: 64,
    };
    g.bench_function("paged_3_blocks", |b| {
        b.iter(|| {
            paged.start(black_box(&req)).expect("start");
            paged
                .release(u64::MAX, ReleaseReason::Finish)
                .expect("release");
        })
    });
    let mut contiguous = ContiguousCache::new(LIVE_SEQS * 80 + 10_000);
    for seq in 0..LIVE_SEQS {
        let r = StartRequest {
            seq,
            tokens: &tokens,
            scope: None,
            reserve_tokens: 80,
        };
        contiguous.start(&r).expect("room");
    }
    g.bench_function("contiguous", |b| {
        b.iter(|| {
            contiguous.start(black_box(&req)).expect("start");
            contiguous
                .release(u64::MAX, ReleaseReason::Finish)
                .expect("release");
        })
    });
    g.finish();
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("append");
    g.throughput(Throughput::Elements(1));
    g.bench_function("paged_round_robin_10k", |b| {
        b.iter_custom(|iters| {
            // Fresh cache per 1M appends so sequences do not grow without bound; setup untimed.
            let mut elapsed = Duration::ZERO;
            let mut done = 0u64;
            while done < iters {
                let mut cache = loaded_paged(false);
                let n = (iters - done).min(1_000_000);
                let start = Instant::now();
                for i in 0..n {
                    black_box(cache.append(i % LIVE_SEQS).expect("append"));
                }
                elapsed += start.elapsed();
                done += n;
            }
            elapsed
        })
    });
    g.finish();
}

fn fork_and_cow(c: &mut Criterion) {
    let mut g = c.benchmark_group("fork");
    g.throughput(Throughput::Elements(1));
    let mut cache = loaded_paged(false);
    let child = u64::MAX;
    g.bench_function("fork_release_5_blocks", |b| {
        b.iter(|| {
            cache.fork(black_box(7), child).expect("fork");
            cache
                .release(child, ReleaseReason::Finish)
                .expect("release");
        })
    });
    g.bench_function("fork_cow_append_release", |b| {
        b.iter(|| {
            cache.fork(7, child).expect("fork");
            let copies = cache.append(child).expect("copy-on-write");
            debug_assert_eq!(copies.len(), 1);
            black_box(copies);
            cache
                .release(child, ReleaseReason::Finish)
                .expect("release");
        })
    });
    g.finish();
}

fn prefix_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("prefix_lookup_1k");
    let blocks = (PROMPT_TOKENS / BLOCK_SIZE as usize) as u64;
    g.throughput(Throughput::Elements(blocks));
    let s = scope();
    let prompt: Vec<u32> = (0..PROMPT_TOKENS as u32).map(|t| 500_000_000 + t).collect();
    let mut cache = loaded_paged(true);
    let publisher = StartRequest {
        seq: u64::MAX - 1,
        tokens: &prompt,
        scope: Some(&s),
        reserve_tokens: 0,
    };
    cache.start(&publisher).expect("start");
    cache
        .fill(u64::MAX - 1, PROMPT_TOKENS as u32)
        .expect("fill");
    let req = StartRequest {
        seq: u64::MAX,
        tokens: &prompt,
        scope: Some(&s),
        reserve_tokens: 0,
    };
    assert_eq!(
        cache.probe_start(&req).cached_tokens as usize,
        PROMPT_TOKENS - BLOCK_SIZE as usize
    );
    // Per element = per block of the prompt.
    g.bench_function("probe", |b| {
        b.iter(|| black_box(cache.probe_start(black_box(&req))))
    });
    g.bench_function("start_hit_release", |b| {
        b.iter_batched(
            || (),
            |()| {
                black_box(cache.start(&req).expect("start"));
                cache
                    .release(u64::MAX, ReleaseReason::Finish)
                    .expect("release");
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = block_alloc_free, seq_start_release, append, fork_and_cow, prefix_lookup
}
criterion_main!(benches);

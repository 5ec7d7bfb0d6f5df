//! The scenario the `tune` tests search: its optimum is known.

/// Short requests on one H200 with an 8B model and no memory pressure: every step is bound by
/// reading the weights, so the rate at target is proportional to `max_seqs_per_step` — the
/// largest value is the known optimum, in both cache modes (`tune::cli`, `tune::seeds`).
pub const TUNE_SMALL: &str = r#"name = "tune-small"
seed = 3
device = "h200"

[model]
preset = "llama3-8b"

[memory]
kv_budget = "20 GiB"

[cache]
block_size = 16
contiguous_reservation = "max_seq_len"
max_seq_len = 256

[traffic]
requests = 400

[traffic.arrival]
kind = "poisson"
rate_per_s = 5.0

[traffic.prompt_tokens]
dist = "uniform"
min = 64
max = 128

[traffic.output_tokens]
dist = "uniform"
min = 16
max = 32

[scheduler]
policy = "decode_first"
max_tokens_per_step = 2048
max_seqs_per_step = 2

[slo]
ttft_p99_ms = 2000.0
itl_p99_ms = 100.0
"#;

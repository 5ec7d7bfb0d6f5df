//! What a run must hold in host memory, estimated before anything is allocated, and what the
//! host can give: a plausible typo (`requests = 4294967295`) is refused with the figure it
//! would need instead of aborting on a failed allocation.

/// Host memory this process can still allocate: the smaller of `MemAvailable` and the room left
/// under the address-space limit (`ulimit -v`). `None` where neither is known (not Linux).
pub fn available_bytes() -> Option<(u64, &'static str)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let available = meminfo
        .as_deref()
        .and_then(|t| kib_field(t, "MemAvailable:"));
    let limits = std::fs::read_to_string("/proc/self/limits").ok();
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let room = limits
        .as_deref()
        .and_then(address_space_limit)
        .map(|limit| {
            let used = status
                .as_deref()
                .and_then(|t| kib_field(t, "VmSize:"))
                .unwrap_or(0);
            limit.saturating_sub(used)
        });
    match (available, room) {
        (Some(a), Some(r)) if r < a => Some((r, "address-space limit")),
        (Some(a), _) => Some((a, "MemAvailable")),
        (None, Some(r)) => Some((r, "address-space limit")),
        (None, None) => None,
    }
}

/// A `Name:   123 kB` line of `/proc/meminfo` or `/proc/self/status`, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft "Max address space" of `/proc/self/limits`; `None` when unlimited.
fn address_space_limit(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Per-request and per-token host costs of one run (request list, per-stream records, token
/// stamps, trace events), from peak RSS on `sim`: 20,000 quick-basic requests (28 output tokens
/// each) peak at 6.1 KB per request, 4,000 of 150 tokens at 13.3 KB; these figures estimate
/// 7.4 KB and 19 KB, erring high.
pub mod cost {
    /// One request in the list and its engine bookkeeping (queues, heaps, lookups). A trace
    /// row's descriptor (request and prompt recipe, hash ids aside) is 144 bytes.
    pub const PER_REQUEST_BYTES: u64 = 256;
    /// One prompt token held in the list (explicit ids: synthetic scenarios) plus the copy a
    /// start builds. A replayed trace holds recipes instead: its ids are made per request in
    /// flight, so its list costs no bytes per token.
    pub const PER_PROMPT_TOKEN_BYTES: u64 = 8;
    /// One Mooncake hash id held in a trace row's recipe.
    pub const PER_HASH_ID_BYTES: u64 = 8;
    /// One stream's record (state, timestamps, counters, trace events), where records are
    /// collected (a sweep's probes, tests).
    pub const PER_STREAM_BYTES: u64 = 2048;
    /// One stream of a streaming run (`run`, `suite`): its state while it waits or runs — a
    /// queue as long as the request list under overload — and what stays once it is handed
    /// to the writers (4 bytes measured), erring high.
    pub const PER_STREAM_STREAMED_BYTES: u64 = 256;
    /// One output token: its time stamp (8) and id (4), trace events, vector slack.
    pub const PER_OUTPUT_TOKEN_BYTES: u64 = 48;
    /// One paged block's metadata (state, counts, prefix key, LRU links, free list).
    pub const PER_BLOCK_BYTES: u64 = 128;
}

/// The inputs of a host-memory estimate, all already validated.
#[derive(Debug, Clone, Copy)]
pub struct HostNeed {
    pub requests: u64,
    pub mean_prompt_tokens: f64,
    /// Whether the list holds its prompts' ids (false for a trace replay's recipes).
    pub prompts_held: bool,
    pub mean_output_tokens: f64,
    pub mean_samples: f64,
    pub paged_blocks: u64,
    /// Tokens per paged block.
    pub block_tokens: u64,
    /// KV bytes the cpu backend keeps in host memory (0 for a device).
    pub host_kv_bytes: u64,
    /// Slots of the lower tiers (host and disk), each with a block's metadata.
    pub tier_blocks: u64,
    /// Bytes of the lower tiers' pools where the cpu backend holds them in this process (0 for
    /// a device).
    pub host_tier_bytes: u64,
}

impl HostNeed {
    /// Bytes of a streaming run: the request list once, both cache modes' stream states, the
    /// records of what is in flight (at most one output token per KV slot), the block metadata
    /// and any host-resident KV pool. Saturating.
    pub fn bytes(&self) -> u64 {
        let n = self.requests as f64;
        let streams = 2.0 * n * self.mean_samples * cost::PER_STREAM_STREAMED_BYTES as f64;
        let kv_slots = self.paged_blocks as f64 * self.block_tokens as f64;
        let in_flight = kv_slots * cost::PER_OUTPUT_TOKEN_BYTES as f64;
        saturate(self.list_bytes() + streams + in_flight + self.fixed_bytes())
    }

    /// Bytes of a run that collects one cache mode's whole record (a sweep's probe): the list,
    /// every stream's record with its token stamps, the block metadata, the host KV pool.
    pub fn collected_bytes(&self) -> u64 {
        saturate(self.list_bytes() + self.records_bytes() + self.fixed_bytes())
    }

    fn list_bytes(&self) -> f64 {
        let n = self.requests as f64;
        let per_token = if self.prompts_held {
            cost::PER_PROMPT_TOKEN_BYTES as f64
        } else {
            // At most one hash id per 16 tokens (the smallest block releases use).
            cost::PER_HASH_ID_BYTES as f64 / 16.0
        };
        n * (cost::PER_REQUEST_BYTES as f64 + self.mean_prompt_tokens * per_token)
    }

    fn records_bytes(&self) -> f64 {
        self.requests as f64
            * self.mean_samples
            * (cost::PER_STREAM_BYTES as f64
                + self.mean_output_tokens * cost::PER_OUTPUT_TOKEN_BYTES as f64)
    }

    fn fixed_bytes(&self) -> f64 {
        (self.paged_blocks as f64 + self.tier_blocks as f64) * cost::PER_BLOCK_BYTES as f64
            + self.host_kv_bytes as f64
            + self.host_tier_bytes as f64
    }

    /// The lower tiers' share of [`HostNeed::bytes`]: their slots' metadata and a host tier
    /// held in this process.
    pub fn tier_bytes(&self) -> u64 {
        saturate(
            self.tier_blocks as f64 * cost::PER_BLOCK_BYTES as f64 + self.host_tier_bytes as f64,
        )
    }
}

fn saturate(total: f64) -> u64 {
    if total >= u64::MAX as f64 {
        u64::MAX
    } else {
        total.ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_fields() {
        let t = "MemTotal:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(kib_field(t, "MemAvailable:"), Some(2048 * 1024));
        let l = "Limit Soft Hard Units\nMax address space         4294967296           unlimited            bytes\n";
        assert_eq!(address_space_limit(l), Some(4 << 30));
        let u = "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_limit(u), None);
    }

    #[test]
    fn estimate_saturates() {
        let need = HostNeed {
            requests: u64::MAX,
            mean_prompt_tokens: 1e9,
            prompts_held: true,
            mean_output_tokens: 1e9,
            mean_samples: 4096.0,
            paged_blocks: u64::MAX,
            block_tokens: u64::MAX,
            host_kv_bytes: u64::MAX,
            tier_blocks: u64::MAX,
            host_tier_bytes: u64::MAX,
        };
        assert_eq!(need.bytes(), u64::MAX);
        assert_eq!(need.collected_bytes(), u64::MAX);
    }

    #[test]
    fn a_trace_list_costs_its_descriptors_not_its_tokens() {
        let held = HostNeed {
            requests: 1_000_000,
            mean_prompt_tokens: 4000.0,
            prompts_held: true,
            mean_output_tokens: 0.0,
            mean_samples: 0.0,
            paged_blocks: 0,
            block_tokens: 16,
            host_kv_bytes: 0,
            tier_blocks: 0,
            host_tier_bytes: 0,
        };
        let recipes = HostNeed {
            prompts_held: false,
            ..held
        };
        // 1M explicit prompts of 4000 tokens: 32 GB; as recipes: 256 B + 2 KB of hash ids each.
        assert_eq!(held.bytes(), 1_000_000 * (256 + 4000 * 8));
        assert_eq!(recipes.bytes(), 1_000_000 * (256 + 2000));
        assert!(recipes.bytes() < held.bytes() / 10);
    }

    /// A streaming run keeps a few hundred bytes per stream, not its token stamps; a run that
    /// collects records keeps them all, and the sweep checks that figure instead.
    #[test]
    fn streaming_costs_stream_states_collecting_costs_records() {
        let need = HostNeed {
            requests: 1_000_000,
            mean_prompt_tokens: 1000.0,
            prompts_held: false,
            mean_output_tokens: 200.0,
            mean_samples: 1.0,
            paged_blocks: 10_000,
            block_tokens: 16,
            host_kv_bytes: 0,
            tier_blocks: 0,
            host_tier_bytes: 0,
        };
        let list = 1_000_000 * (256 + 1000 / 2);
        let blocks = 10_000 * 128;
        let in_flight = 10_000 * 16 * 48;
        assert_eq!(
            need.bytes(),
            list + 2 * 1_000_000 * 256 + in_flight + blocks
        );
        assert_eq!(
            need.collected_bytes(),
            list + 1_000_000 * (2048 + 200 * 48) + blocks
        );
        assert!(need.bytes() < need.collected_bytes() / 5);
    }
}

//! `[cache.host_tier]` and `[cache.disk_tier]`: the lower tiers' keys checked like every other
//! key (a size that parses, ranges, what each tier needs), and the one conversion of a tier's
//! capacity into the slots the cache manager holds.
//!
//! A tier slot holds one full block of every layer's K and V: `block_size × kv_bytes_per_token`
//! bytes, so a capacity holds `floor(capacity ÷ block bytes)` slots. A capacity must hold at
//! least one block at every block size the scenario lists (each is run by `suite`/`sweep`), and
//! at most `u32::MAX` (slots are numbered in 32 bits). A lower tier needs the prefix cache, and
//! a disk tier a host tier. The run's set-up converts capacities through the same functions.

use super::error::KeyProblem;
use super::ranges::{self, within};
use super::types::*;
use crate::model::ModelShape;
use crate::units::{format_bytes, parse_bytes};

/// The slots a tier of `capacity_bytes` holds at `block_size` tokens per block: at least one,
/// at most `u32::MAX`. The error says why, for the key that gave the capacity.
pub fn tier_capacity_blocks(
    shape: &ModelShape,
    block_size: u32,
    capacity_bytes: u64,
) -> Result<u32, String> {
    let block_bytes = tier_block_bytes(shape, block_size).ok_or_else(|| {
        format!("a block of {block_size} tokens of this model overflows 64 bits of bytes")
    })?;
    let blocks = capacity_bytes / block_bytes.max(1);
    if blocks == 0 {
        return Err(format!(
            "{} holds no block of {block_size} tokens ({} = {block_bytes} bytes, all layers' K \
             and V); give at least that",
            format_bytes(capacity_bytes),
            format_bytes(block_bytes)
        ));
    }
    u32::try_from(blocks).map_err(|_| {
        format!(
            "{} holds {blocks} blocks of {block_size} tokens; a tier has at most {} slots",
            format_bytes(capacity_bytes),
            u32::MAX
        )
    })
}

/// Bytes of one block of `block_size` tokens (FP8 per-block scales priced at that size).
pub fn tier_block_bytes(shape: &ModelShape, block_size: u32) -> Option<u64> {
    let mut at = shape.clone();
    at.kv_scale = shape.kv_scale.map(|(g, _)| (g, block_size));
    at.checked_kv_bytes_per_token()?
        .checked_mul(block_size as u64)
}

impl Scenario {
    /// The tier keys. `shape` is `None` when the model is unsound (reported elsewhere): the
    /// sizes are still parsed, the block counts are not.
    pub(super) fn check_tiers(&self, shape: Option<&ModelShape>, p: &mut Vec<KeyProblem>) {
        let c = &self.cache;
        if let Some(h) = &c.host_tier {
            if !self.scheduler.prefix_cache {
                p.push(KeyProblem::new(
                    "cache.host_tier",
                    "a host tier keeps the blocks the prefix cache evicts; it needs \
                     scheduler.prefix_cache = true",
                ));
            }
            let key = "cache.host_tier.capacity";
            let caps = h.capacity.as_slice();
            if caps.is_empty() {
                p.push(KeyProblem::new(key, "the list is empty"));
            }
            for cap in caps {
                self.check_capacity(key, cap, shape, p);
            }
            // Each listed capacity is a cell of a suite and a search of a sweep, named by its
            // size: two spellings of one size would be one configuration run twice.
            let mut seen: Vec<(u64, &String)> = Vec::new();
            for cap in caps {
                let Ok(bytes) = parse_bytes(cap) else {
                    continue;
                };
                if let Some((_, first)) = seen.iter().find(|(b, _)| *b == bytes) {
                    p.push(KeyProblem::new(
                        key,
                        format!(
                            "{first:?} and {cap:?} are the same size ({bytes} bytes); list each \
                             capacity once"
                        ),
                    ));
                    break;
                }
                seen.push((bytes, cap));
            }
        }
        if let Some(d) = &c.disk_tier {
            if c.host_tier.is_none() {
                p.push(KeyProblem::new(
                    "cache.disk_tier",
                    "a disk tier keeps the blocks the host tier evicts; give [cache.host_tier] \
                     too",
                ));
            }
            self.check_capacity("cache.disk_tier.capacity", &d.capacity, shape, p);
            for (field, v) in [
                ("read_bytes_per_s", d.read_bytes_per_s),
                ("write_bytes_per_s", d.write_bytes_per_s),
            ] {
                if !within(v, ranges::DISK_BYTES_PER_S) {
                    p.push(KeyProblem::new(
                        format!("cache.disk_tier.{field}"),
                        format!(
                            "{} bytes per second",
                            ranges::range_message(ranges::DISK_BYTES_PER_S, v)
                        ),
                    ));
                }
            }
            if !within(d.latency_us, ranges::DISK_LATENCY_US) {
                p.push(KeyProblem::new(
                    "cache.disk_tier.latency_us",
                    format!(
                        "{} microseconds",
                        ranges::range_message(ranges::DISK_LATENCY_US, d.latency_us)
                    ),
                ));
            }
        }
    }

    fn check_capacity(
        &self,
        key: &str,
        cap: &str,
        shape: Option<&ModelShape>,
        p: &mut Vec<KeyProblem>,
    ) {
        let bytes = match parse_bytes(cap) {
            Ok(b) => b,
            Err(e) => {
                p.push(KeyProblem::new(key, e.to_string()));
                return;
            }
        };
        if bytes == 0 {
            p.push(KeyProblem::new(
                key,
                format!("{cap:?} is 0 bytes; a tier must hold at least one block"),
            ));
            return;
        }
        let Some(shape) = shape else { return };
        for &b in self.cache.block_size.as_slice() {
            // An unsound block size is reported by `check_cache`.
            // An overflowing model is reported by `check_model`.
            if b == 0
                || !b.is_power_of_two()
                || b > ranges::MAX_BLOCK_SIZE
                || tier_block_bytes(shape, b).is_none()
            {
                continue;
            }
            if let Err(why) = tier_capacity_blocks(shape, b, bytes) {
                p.push(KeyProblem::new(key, why));
                return;
            }
        }
    }

    /// The tiers' host memory alone (a cpu device's pools; slot records grow with use and are
    /// counted with the workload) against what this process can get: the estimate for a trace
    /// replay, whose lengths are unknown before it is read.
    pub(super) fn check_tier_host_memory(&self, shape: &ModelShape, p: &mut Vec<KeyProblem>) {
        let (host, disk) = self.tier_slots(shape);
        let slots = host.saturating_add(disk);
        if slots == 0 {
            return;
        }
        // Both pools are host memory on the cpu backend, FP8 held as f32 (4 bytes for 1).
        let held = if self.device == "cpu" {
            let f32_factor = if shape.kv_dtype.is_fp8() { 4 } else { 1 };
            tier_block_bytes(shape, self.block_size()).map_or(u64::MAX, |b| {
                b.saturating_mul(slots).saturating_mul(f32_factor)
            })
        } else {
            0
        };
        let need = held;
        if let Some((available, source)) = super::host::available_bytes() {
            if need > available {
                p.push(KeyProblem::new(
                    if disk > host {
                        "cache.disk_tier.capacity"
                    } else {
                        "cache.host_tier.capacity"
                    },
                    format!(
                        "the tiers' {slots} slots need about {} of host memory, and {} is \
                         available ({source})",
                        format_bytes(need),
                        format_bytes(available)
                    ),
                ));
            }
        }
    }

    /// Slots of each tier at the first block size (what a run uses), from its first capacity:
    /// `(host, disk)`, 0 where a tier is absent or unsound.
    pub fn tier_slots(&self, shape: &ModelShape) -> (u64, u64) {
        let b = self.block_size();
        let slots = |cap: Option<&String>| {
            cap.and_then(|c| parse_bytes(c).ok())
                .and_then(|bytes| tier_capacity_blocks(shape, b, bytes).ok())
                .map_or(0, u64::from)
        };
        let c = &self.cache;
        (
            slots(
                c.host_tier
                    .as_ref()
                    .and_then(|h| h.capacity.as_slice().first()),
            ),
            slots(c.disk_tier.as_ref().map(|d| &d.capacity)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_8b_block_of_16_tokens_is_2_mib_and_capacities_round_down() {
        let m = ModelShape::llama3_8b();
        assert_eq!(tier_block_bytes(&m, 16), Some(16 * 131_072));
        assert_eq!(tier_capacity_blocks(&m, 16, 64 << 30), Ok(32_768));
        assert_eq!(tier_capacity_blocks(&m, 16, (2 << 20) + 5), Ok(1));
        let err = tier_capacity_blocks(&m, 16, (2 << 20) - 1).expect_err("under a block");
        assert!(err.contains("holds no block of 16 tokens"), "{err}");
    }

    #[test]
    fn more_slots_than_32_bits_number_are_refused() {
        let m = ModelShape::tiny();
        let block = tier_block_bytes(&m, 1).expect("block bytes");
        let most = block * u32::MAX as u64;
        assert_eq!(tier_capacity_blocks(&m, 1, most), Ok(u32::MAX));
        let err = tier_capacity_blocks(&m, 1, most + block).expect_err("too many");
        assert!(err.contains("at most 4294967295 slots"), "{err}");
    }
    #[test]
    fn a_capacity_listed_twice_is_refused_however_it_is_spelled() {
        let scenario = |caps: &str| {
            format!(
                "name = \"t\"\n[model]\npreset = \"tiny\"\n[memory]\nkv_budget = \"1 MiB\"\n\
                 [cache]\nmax_seq_len = 256\n[cache.host_tier]\ncapacity = {caps}\n\
                 [traffic]\nrequests = 10\n[traffic.arrival]\nkind = \"burst\"\n\
                 [traffic.prompt_tokens]\ndist = \"uniform\"\nmin = 1\nmax = 8\n\
                 [traffic.output_tokens]\ndist = \"uniform\"\nmin = 1\nmax = 8\n\
                 [scheduler]\nprefix_cache = true\n"
            )
        };
        for caps in [r#"["4 MiB", "4 MiB"]"#, r#"["4 MiB", "8 MiB", "4096 KiB"]"#] {
            let e = crate::scenario::parse_str(&scenario(caps), None, &[]).expect_err(caps);
            let e = e.to_string();
            assert!(
                e.contains("cache.host_tier.capacity") && e.contains("are the same size"),
                "{caps}: {e}"
            );
        }
        crate::scenario::parse_str(&scenario(r#"["4 MiB", "8 MiB"]"#), None, &[])
            .expect("two sizes");
    }
}

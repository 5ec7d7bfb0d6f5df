//! One step's sequences packed into the kernels' arguments, on the host, with every index the
//! device will use checked here (the kernels do no bounds checks).
//!
//! Each new token is one row: its token id, its position's RoPE angles (formed in f64, as the
//! CPU model does), its KV slot, and one attention row attending positions `[0, pos]` of its
//! sequence — a decode is one row, a prefill chunk one row per token, and the row's length is
//! the causal mask. Paged sequences bring their block table (one row per sequence, padded to the
//! widest), contiguous ones their base slot.

use crate::error::CudaError;

/// Where a sequence's positions live (the cache manager's layout, as plain data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqAddr<'a> {
    /// Position `p` is at slot `blocks[p / block_size] * block_size + p % block_size`.
    Paged {
        block_size: usize,
        blocks: &'a [u32],
    },
    /// Position `p` is at slot `base_slot + p`, for `p < capacity_tokens`.
    Contiguous {
        base_slot: u64,
        capacity_tokens: u64,
    },
}

impl SeqAddr<'_> {
    /// The slot of position `pos`, checked against the layout and the cache's `num_slots`.
    pub fn slot_of(&self, pos: usize, num_slots: usize) -> Result<usize, CudaError> {
        let slot = match *self {
            SeqAddr::Paged { block_size, blocks } => {
                if block_size == 0 {
                    return Err(CudaError::Shape("block size 0".into()));
                }
                let b = blocks.get(pos / block_size).ok_or_else(|| {
                    CudaError::Shape(format!(
                        "position {pos} is past the {} mapped blocks of {block_size} tokens",
                        blocks.len()
                    ))
                })?;
                (*b as usize)
                    .checked_mul(block_size)
                    .and_then(|s| s.checked_add(pos % block_size))
            }
            SeqAddr::Contiguous {
                base_slot,
                capacity_tokens,
            } => {
                if pos as u64 >= capacity_tokens {
                    return Err(CudaError::Shape(format!(
                        "position {pos} is past the region's {capacity_tokens} tokens"
                    )));
                }
                usize::try_from(base_slot)
                    .ok()
                    .and_then(|b| b.checked_add(pos))
            }
        };
        match slot {
            Some(s) if s < num_slots => Ok(s),
            _ => Err(CudaError::Shape(format!(
                "position {pos} maps outside the cache ({num_slots} slots)"
            ))),
        }
    }

    /// Slot runs covering positions `[0, tokens)`, adjacent slots merged: `(first_slot, len)`.
    pub fn runs(&self, tokens: usize, num_slots: usize) -> Result<Vec<(usize, usize)>, CudaError> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for p in 0..tokens {
            let s = self.slot_of(p, num_slots)?;
            match out.last_mut() {
                Some((first, len)) if *first + *len == s => *len += 1,
                _ => out.push((s, 1)),
            }
        }
        Ok(out)
    }
}

/// New tokens of one sequence in a step: positions `start_pos .. start_pos + tokens.len()`.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    pub addr: SeqAddr<'a>,
    pub start_pos: usize,
    pub tokens: &'a [u32],
    /// Logits (and the greedy token) after the last of `tokens`.
    pub want_logits: bool,
}

/// The attention addressing of a packed step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackedAddr {
    /// `tables` is `[seqs, max_blocks]`, padded with block 0 (never read: row lengths stop
    /// before the padding).
    Paged {
        tables: Vec<i32>,
        max_blocks: usize,
        block_size: usize,
    },
    Contiguous {
        seq_base: Vec<i64>,
    },
}

/// A step as kernel arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct StepBatch {
    /// Per token row.
    pub tokens: Vec<i32>,
    pub slots: Vec<i64>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub row_seq: Vec<i32>,
    pub row_len: Vec<i32>,
    /// The longest attention row.
    pub max_len: usize,
    pub addr: PackedAddr,
    /// Token rows whose logits are wanted, and the chunk (index into the input) each is for.
    pub logit_rows: Vec<i32>,
    pub logit_seqs: Vec<usize>,
}

impl StepBatch {
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }
}

fn i32_of(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("{what} {n} exceeds i32")))
}

/// Packs `chunks` for a cache of `num_slots` slots and a model of `vocab` tokens; `inv_freq` are
/// the RoPE frequencies (`head_dim / 2` of them). All chunks must share one layout kind.
pub fn pack(
    chunks: &[SeqChunk<'_>],
    num_slots: usize,
    vocab: usize,
    inv_freq: &[f64],
) -> Result<StepBatch, CudaError> {
    let n: usize = chunks.iter().map(|c| c.tokens.len()).sum();
    let half = inv_freq.len();
    let mut b = StepBatch {
        tokens: Vec::with_capacity(n),
        slots: Vec::with_capacity(n),
        cos: Vec::with_capacity(n * half),
        sin: Vec::with_capacity(n * half),
        row_seq: Vec::with_capacity(n),
        row_len: Vec::with_capacity(n),
        max_len: 0,
        addr: PackedAddr::Contiguous {
            seq_base: Vec::new(),
        },
        logit_rows: Vec::new(),
        logit_seqs: Vec::new(),
    };
    let paged = match chunks.first().map(|c| c.addr) {
        Some(SeqAddr::Paged { .. }) | None => true,
        Some(SeqAddr::Contiguous { .. }) => false,
    };
    let mut block_size = 0usize;
    for (i, c) in chunks.iter().enumerate() {
        match (paged, c.addr) {
            (true, SeqAddr::Paged { block_size: bs, .. }) => {
                if block_size != 0 && bs != block_size {
                    return Err(CudaError::Shape(format!(
                        "sequences with block sizes {block_size} and {bs} in one step"
                    )));
                }
                crate::launch::log2_block_size(bs)?;
                block_size = bs;
            }
            (false, SeqAddr::Contiguous { .. }) => {}
            _ => {
                return Err(CudaError::Shape(
                    "paged and contiguous sequences in one step".into(),
                ))
            }
        }
        let seq = i32_of(i, "sequence index")?;
        for (j, &tok) in c.tokens.iter().enumerate() {
            if tok as usize >= vocab {
                return Err(CudaError::Shape(format!(
                    "token id {tok} is outside the vocabulary of {vocab}"
                )));
            }
            let pos = c.start_pos + j;
            b.tokens.push(tok as i32);
            b.slots.push(c.addr.slot_of(pos, num_slots)? as i64);
            for f in inv_freq {
                let (s, co) = (pos as f64 * f).sin_cos();
                b.cos.push(co as f32);
                b.sin.push(s as f32);
            }
            b.row_seq.push(seq);
            b.row_len.push(i32_of(pos + 1, "attention length")?);
            b.max_len = b.max_len.max(pos + 1);
        }
        if c.want_logits && !c.tokens.is_empty() {
            b.logit_rows.push(i32_of(b.tokens.len() - 1, "row")?);
            b.logit_seqs.push(i);
        }
    }
    b.addr = if paged {
        let need = |c: &SeqChunk<'_>| (c.start_pos + c.tokens.len()).div_ceil(block_size.max(1));
        let max_blocks = chunks.iter().map(need).max().unwrap_or(0).max(1);
        let mut tables = vec![0i32; chunks.len() * max_blocks];
        for (i, c) in chunks.iter().enumerate() {
            if let SeqAddr::Paged { blocks, .. } = c.addr {
                let len = c.start_pos + c.tokens.len();
                crate::launch::check_table(blocks, len, block_size, num_slots)?;
                for (k, &blk) in blocks[..need(c)].iter().enumerate() {
                    tables[i * max_blocks + k] = i32_of(blk as usize, "block")?;
                }
            }
        }
        PackedAddr::Paged {
            tables,
            max_blocks,
            block_size: block_size.max(1),
        }
    } else {
        let mut seq_base = Vec::with_capacity(chunks.len());
        for c in chunks {
            // Every attended position [0, len) must be inside the region and the cache.
            let len = c.start_pos + c.tokens.len();
            if len > 0 {
                c.addr.slot_of(len - 1, num_slots)?;
            }
            if let SeqAddr::Contiguous { base_slot, .. } = c.addr {
                seq_base.push(
                    i64::try_from(base_slot).map_err(|_| {
                        CudaError::Shape(format!("base slot {base_slot} exceeds i64"))
                    })?,
                );
            }
        }
        PackedAddr::Contiguous { seq_base }
    };
    Ok(b)
}

/// The query tiles of packed rows, as the attention kernel's `tile_row0` (one entry per tile
/// plus the end): a run of rows of one sequence at consecutive positions (a prefill chunk) is
/// cut into tiles of at most `tile_rows`; every other row is a tile of its own.
pub fn tiles(row_seq: &[i32], row_len: &[i32], tile_rows: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(row_seq.len() + 1);
    let mut r = 0usize;
    while r < row_seq.len() {
        out.push(r as i32);
        let mut e = r + 1;
        while e < row_seq.len()
            && e - r < tile_rows.max(1)
            && row_seq[e] == row_seq[e - 1]
            && row_len.get(e).copied() == row_len[e - 1].checked_add(1)
        {
            e += 1;
        }
        r = e;
    }
    out.push(row_seq.len() as i32);
    out
}

/// `(src, dst, len)` slot copies as the copy kernel's pairs, one list per launch: each list is
/// one copy op (so an op that reads what an earlier op wrote sees it: launches run in order),
/// split into lists of at most `per_launch` pairs, each checked by
/// [`crate::launch::check_copy_pairs`] (no destination read or written twice in one launch).
pub fn copy_launches(
    ops: &[(usize, usize, usize)],
    num_slots: usize,
    per_launch: usize,
) -> Result<Vec<Vec<i64>>, CudaError> {
    let mut out = Vec::new();
    for &op in ops {
        let pairs = crate::launch::copy_pairs(&[op]);
        for chunk in pairs.chunks(per_launch.max(1)) {
            crate::launch::check_copy_pairs(chunk, num_slots)?;
            out.push(chunk.iter().flat_map(|&(s, d)| [s, d]).collect());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INV: [f64; 2] = [1.0, 0.01];

    #[test]
    fn paged_rows_slots_and_tables() {
        let a = [5u32, 2];
        let b = [7u32];
        let chunks = [
            // Prefill positions 0..3 of sequence A (block size 2 -> blocks 5, 2).
            SeqChunk {
                addr: SeqAddr::Paged {
                    block_size: 2,
                    blocks: &a,
                },
                start_pos: 0,
                tokens: &[1, 2, 3],
                want_logits: true,
            },
            // Decode position 1 of sequence B.
            SeqChunk {
                addr: SeqAddr::Paged {
                    block_size: 2,
                    blocks: &b,
                },
                start_pos: 1,
                tokens: &[9],
                want_logits: false,
            },
        ];
        let p = pack(&chunks, 16, 10, &INV).expect("valid");
        assert_eq!(p.tokens, vec![1, 2, 3, 9]);
        assert_eq!(p.slots, vec![10, 11, 4, 15]);
        assert_eq!(p.row_seq, vec![0, 0, 0, 1]);
        assert_eq!(p.row_len, vec![1, 2, 3, 2]);
        assert_eq!(p.max_len, 3);
        assert_eq!(p.logit_rows, vec![2]);
        assert_eq!(p.logit_seqs, vec![0]);
        assert_eq!(
            p.addr,
            PackedAddr::Paged {
                tables: vec![5, 2, 7, 0],
                max_blocks: 2,
                block_size: 2
            }
        );
        // RoPE angles of row 2 (position 2), both frequencies.
        assert_eq!(p.cos[4], (2.0f64).cos() as f32);
        assert_eq!(p.sin[5], (0.02f64).sin() as f32);
    }

    #[test]
    fn contiguous_rows_use_base_slots() {
        let chunks = [SeqChunk {
            addr: SeqAddr::Contiguous {
                base_slot: 8,
                capacity_tokens: 4,
            },
            start_pos: 2,
            tokens: &[4, 4],
            want_logits: true,
        }];
        let p = pack(&chunks, 12, 10, &INV).expect("valid");
        assert_eq!(p.slots, vec![10, 11]);
        assert_eq!(p.row_len, vec![3, 4]);
        assert_eq!(p.addr, PackedAddr::Contiguous { seq_base: vec![8] });
        assert_eq!(p.logit_rows, vec![1]);
    }

    #[test]
    fn every_index_the_device_would_use_is_checked() {
        let blocks = [3u32];
        let paged = |tokens: &'static [u32], start| SeqChunk {
            addr: SeqAddr::Paged {
                block_size: 4,
                blocks: &blocks,
            },
            start_pos: start,
            tokens,
            want_logits: true,
        };
        // Block 3 of size 4 is slots 12..16: inside a 16-slot cache, past a 14-slot one.
        assert!(pack(&[paged(&[1, 1], 0)], 16, 10, &INV).is_ok());
        assert!(pack(&[paged(&[1, 1], 0)], 14, 10, &INV).is_err());
        // Position 4 needs a second block.
        assert!(pack(&[paged(&[1], 4)], 64, 10, &INV).is_err());
        // Token outside the vocabulary.
        assert!(pack(&[paged(&[10], 0)], 64, 10, &INV).is_err());
        // Past a contiguous region's capacity.
        let region = SeqChunk {
            addr: SeqAddr::Contiguous {
                base_slot: 0,
                capacity_tokens: 2,
            },
            start_pos: 2,
            tokens: &[1],
            want_logits: false,
        };
        assert!(pack(&[region], 64, 10, &INV).is_err());
        // Mixed layouts, and a block size that is not a power of two.
        let ok_region = SeqChunk {
            start_pos: 0,
            ..region
        };
        assert!(pack(&[paged(&[1], 0), ok_region], 64, 10, &INV).is_err());
        let odd = [0u32];
        let bad_bs = SeqChunk {
            addr: SeqAddr::Paged {
                block_size: 3,
                blocks: &odd,
            },
            start_pos: 0,
            tokens: &[1],
            want_logits: false,
        };
        assert!(pack(&[bad_bs], 64, 10, &INV).is_err());
    }

    #[test]
    fn tiles_cut_prefill_runs_and_keep_decode_rows_alone() {
        // Sequence 0: 5 prefill rows; sequence 1: a decode row; sequence 2: 2 rows.
        let seq = [0, 0, 0, 0, 0, 1, 2, 2];
        let len = [3, 4, 5, 6, 7, 10, 1, 2];
        assert_eq!(tiles(&seq, &len, 2), vec![0, 2, 4, 5, 6, 8]);
        assert_eq!(tiles(&seq, &len, 32), vec![0, 5, 6, 8]);
        // Rows of one sequence that are not consecutive positions are separate tiles.
        assert_eq!(tiles(&[0, 0], &[3, 5], 8), vec![0, 1, 2]);
        assert_eq!(tiles(&[], &[], 8), vec![0]);
    }

    #[test]
    fn runs_merge_adjacent_blocks() {
        let blocks = [2u32, 3, 7];
        let a = SeqAddr::Paged {
            block_size: 4,
            blocks: &blocks,
        };
        assert_eq!(a.runs(10, 64).expect("mapped"), vec![(8, 8), (28, 2)]);
        let c = SeqAddr::Contiguous {
            base_slot: 5,
            capacity_tokens: 10,
        };
        assert_eq!(c.runs(10, 64).expect("mapped"), vec![(5, 10)]);
        assert!(c.runs(11, 64).is_err());
    }

    #[test]
    fn copies_run_one_op_per_launch_split_at_the_pair_limit() {
        let l = copy_launches(&[(0, 16, 3), (32, 48, 1)], 64, 2).expect("valid");
        assert_eq!(l, vec![vec![0, 16, 1, 17], vec![2, 18], vec![32, 48]]);
        // An op overlapping itself (a chain inside one launch) is refused.
        assert!(copy_launches(&[(0, 1, 2)], 64, 16).is_err());
        assert!(copy_launches(&[(0, 70, 1)], 64, 16).is_err());
    }
}

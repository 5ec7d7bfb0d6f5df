//! Address translation: where logical token position `p` of a sequence lives.
//!
//! Attention never walks a block table in its inner loop. Each caller first turns its layout into
//! a list of [`Run`]s (maximal stretches of consecutive slots, in logical order), checked against
//! the cache size; the attention core then streams runs. A paged layout yields one run per block,
//! a contiguous one a single run, so the two kernels differ only in how runs are built.
//!
//! **Per layer.** A grouped layout gives each table of layers its own block table, so
//! [`TokenAddressing`] also answers per layer (`slot_of_layer`, `runs_layer_from`,
//! `table_of_layer`); the defaults delegate to the layer-agnostic methods, so [`PagedTable`]
//! and the contiguous region pay nothing. [`LayerAddr`] is one layer's view, for attention,
//! which knows nothing of layers. The forward pass translates a step's new positions once per
//! change of `table_of_layer` (once a step for a one-table layout), all layers before any
//! write; a sliding layer asks its runs from its first query's window start.

use crate::error::KernelError;

/// `len` consecutive slots starting at `first_slot`, holding consecutive logical positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first_slot: usize,
    pub len: usize,
}

/// A sequence's mapping from logical positions to cache slots.
pub trait TokenAddressing: Sync {
    /// Tokens the layout can address (positions `0..mapped_tokens()`).
    fn mapped_tokens(&self) -> usize;

    /// The slot holding logical position `pos` (unchecked against the cache size).
    fn slot_of(&self, pos: usize) -> Result<usize, KernelError>;

    /// Appends runs covering positions `[0, len)` in order, each checked against `num_slots`.
    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError>;

    /// Appends runs covering at least positions `[from, len)` in order, each checked against
    /// `num_slots`, and returns the logical position of the first run's first slot (at most
    /// `from`). A layout that releases positions behind a sliding window maps only the window:
    /// it starts at `from`. The default covers `[0, len)`, as [`runs`](Self::runs) does, so a
    /// layout that keeps every position pays nothing for the window.
    fn runs_from(
        &self,
        from: usize,
        len: usize,
        num_slots: usize,
        out: &mut Vec<Run>,
    ) -> Result<usize, KernelError> {
        let _ = from;
        self.runs(len, num_slots, out).map(|()| 0)
    }

    /// The slot holding position `pos` of layer `layer`. A layout that gives layers of
    /// different kinds tables of their own (a grouped cache: sliding, full and latent layers
    /// each in their own block table over one pool) answers per layer; the default is the
    /// layer-agnostic [`slot_of`](Self::slot_of).
    fn slot_of_layer(&self, layer: usize, pos: usize) -> Result<usize, KernelError> {
        let _ = layer;
        self.slot_of(pos)
    }

    /// [`runs_from`](Self::runs_from) for layer `layer` (see [`slot_of_layer`](Self::slot_of_layer)).
    fn runs_layer_from(
        &self,
        layer: usize,
        from: usize,
        len: usize,
        num_slots: usize,
        out: &mut Vec<Run>,
    ) -> Result<usize, KernelError> {
        let _ = layer;
        self.runs_from(from, len, num_slots, out)
    }

    /// Which of the layout's tables layer `layer` is addressed through: layers that answer the
    /// same share every slot, so a forward pass translates a step's positions once per change
    /// of table, not once per layer. The default layout has one table.
    fn table_of_layer(&self, layer: usize) -> usize {
        let _ = layer;
        0
    }
}

/// One layer's view of a per-layer layout: the layer-agnostic methods answer for layer
/// `layer`, so attention, which knows nothing of layers, reads through that layer's table.
#[derive(Debug, Clone, Copy)]
pub struct LayerAddr<'a, A> {
    pub addr: &'a A,
    pub layer: usize,
}

impl<A: TokenAddressing> TokenAddressing for LayerAddr<'_, A> {
    fn mapped_tokens(&self) -> usize {
        self.addr.mapped_tokens()
    }

    fn slot_of(&self, pos: usize) -> Result<usize, KernelError> {
        self.addr.slot_of_layer(self.layer, pos)
    }

    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError> {
        match self
            .addr
            .runs_layer_from(self.layer, 0, len, num_slots, out)?
        {
            0 => Ok(()),
            first => Err(KernelError::Unmapped {
                pos: first - 1,
                mapped_tokens: self.addr.mapped_tokens(),
            }),
        }
    }

    fn runs_from(
        &self,
        from: usize,
        len: usize,
        num_slots: usize,
        out: &mut Vec<Run>,
    ) -> Result<usize, KernelError> {
        self.addr
            .runs_layer_from(self.layer, from, len, num_slots, out)
    }
}

pub(crate) fn check_run(run: Run, num_slots: usize) -> Result<Run, KernelError> {
    match run.first_slot.checked_add(run.len) {
        Some(end) if end <= num_slots => Ok(run),
        _ => Err(KernelError::SlotOutOfRange {
            slot: run.first_slot as u64,
            len_tokens: run.len as u64,
            num_slots: num_slots as u64,
        }),
    }
}

/// A paged layout: logical block `i` lives in physical block `blocks[i]`; slot = block ×
/// block_size + offset.
#[derive(Debug, Clone, Copy)]
pub struct PagedTable<'a> {
    pub block_size: usize,
    pub blocks: &'a [u32],
}

impl TokenAddressing for PagedTable<'_> {
    fn mapped_tokens(&self) -> usize {
        self.blocks.len() * self.block_size
    }

    fn slot_of(&self, pos: usize) -> Result<usize, KernelError> {
        let bs = self.block_size.max(1);
        match self.blocks.get(pos / bs) {
            Some(&b) => Ok(b as usize * bs + pos % bs),
            None => Err(KernelError::Unmapped {
                pos,
                mapped_tokens: self.mapped_tokens(),
            }),
        }
    }

    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError> {
        if len > self.mapped_tokens() || self.block_size == 0 {
            return Err(KernelError::Unmapped {
                pos: len.saturating_sub(1),
                mapped_tokens: self.mapped_tokens(),
            });
        }
        let bs = self.block_size;
        for (i, &b) in self.blocks.iter().take(len.div_ceil(bs)).enumerate() {
            let run = Run {
                first_slot: b as usize * bs,
                len: bs.min(len - i * bs),
            };
            out.push(check_run(run, num_slots)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_runs_cover_in_logical_order_with_partial_last_block() {
        let t = PagedTable {
            block_size: 4,
            blocks: &[7, 2, 5],
        };
        let mut runs = Vec::new();
        t.runs(10, 32, &mut runs).expect("in range");
        assert_eq!(
            runs,
            vec![
                Run {
                    first_slot: 28,
                    len: 4
                },
                Run {
                    first_slot: 8,
                    len: 4
                },
                Run {
                    first_slot: 20,
                    len: 2
                }
            ]
        );
        assert_eq!(t.slot_of(9), Ok(21));
        assert!(t.slot_of(12).is_err());
    }

    /// Two tables over one store of 4-token blocks: layer 0 (sliding) reads through `sliding`,
    /// whose blocks before `first` are released, layer 1 (full) through `full`.
    struct TwoTables<'a> {
        first: usize,
        sliding: &'a [u32],
        full: PagedTable<'a>,
    }

    const BS: usize = 4;

    impl TwoTables<'_> {
        fn sliding_slot(&self, pos: usize) -> Result<usize, KernelError> {
            let unmapped = KernelError::Unmapped {
                pos,
                mapped_tokens: self.mapped_tokens(),
            };
            let i = (pos / BS).checked_sub(self.first).ok_or(unmapped.clone())?;
            let page = self.sliding.get(i).ok_or(unmapped)?;
            Ok(*page as usize * BS + pos % BS)
        }
    }

    impl TokenAddressing for TwoTables<'_> {
        fn mapped_tokens(&self) -> usize {
            (self.first + self.sliding.len()) * BS
        }
        fn slot_of(&self, _pos: usize) -> Result<usize, KernelError> {
            Err(KernelError::Config("addressed without a layer".into()))
        }
        fn runs(&self, _: usize, _: usize, _: &mut Vec<Run>) -> Result<(), KernelError> {
            Err(KernelError::Config("addressed without a layer".into()))
        }
        fn slot_of_layer(&self, layer: usize, pos: usize) -> Result<usize, KernelError> {
            match layer {
                0 => self.sliding_slot(pos),
                _ => self.full.slot_of(pos),
            }
        }
        fn runs_layer_from(
            &self,
            layer: usize,
            from: usize,
            len: usize,
            num_slots: usize,
            out: &mut Vec<Run>,
        ) -> Result<usize, KernelError> {
            if layer != 0 {
                return self.full.runs_from(from, len, num_slots, out);
            }
            let mut pos = from;
            while pos < len {
                let n = (BS - pos % BS).min(len - pos);
                let run = Run {
                    first_slot: self.sliding_slot(pos)?,
                    len: n,
                };
                out.push(check_run(run, num_slots)?);
                pos += n;
            }
            Ok(from)
        }
        fn table_of_layer(&self, layer: usize) -> usize {
            layer.min(1)
        }
    }

    fn two_layer_model() -> crate::Transformer {
        let cfg = crate::ModelConfig {
            layers: 2,
            q_heads: 4,
            kv_heads: 2,
            head_dim: 16,
            d_model: 64,
            ffn_dim: 128,
            vocab: 64,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
        };
        let kinds = vec![
            crate::LayerKind::Sliding { window: 6 },
            crate::LayerKind::Full,
        ];
        crate::Transformer::seeded_with_kinds(cfg, kinds, 11).expect("model")
    }

    /// A layer reads and writes through its own table: a run through two tables (the sliding
    /// layer's releasing the blocks its window left, their rows poisoned) gives the logits of
    /// one table bit for bit, touches no row of the other table's pages, and a table that
    /// released one block too many is an error, not a read of another slot.
    #[test]
    fn each_layer_reads_through_its_own_table_and_only_its_window() {
        let model = two_layer_model();
        let tokens: Vec<u32> = (0..20u32).map(|i| (i * 7 + 3) % 64).collect();
        let chunks = [(0, 8), (8, 16), (16, 20)];
        // One table for every layer: the reference.
        let one_blocks: Vec<u32> = (0..5).collect();
        let one = PagedTable {
            block_size: BS,
            blocks: &one_blocks,
        };
        let mut kv_one: crate::KvCache<f32> = model.new_cache(12 * BS);
        let mut want = None;
        for (a, b) in chunks {
            let seq = crate::StepSeq {
                addr: &one,
                start_pos: a,
                tokens: &tokens[a..b],
                want_logits: b == tokens.len(),
            };
            want = model.forward(&mut kv_one, &[seq]).expect("one table")[0].clone();
        }
        let want = want.expect("logits");

        let sliding_pages = [9u32, 2, 7, 0, 5];
        let full_blocks = [1u32, 3, 4, 6, 8];
        let mut kv: crate::KvCache<f32> = model.new_cache(12 * BS);
        let mut got = None;
        let mut too_many = None;
        for (a, b) in chunks {
            // Before each chunk the sliding table keeps the blocks touching its first query's
            // window (`a + 1 − 6`); what it released is poisoned.
            let first = (a + 1).saturating_sub(6) / BS;
            for &page in &sliding_pages[..first] {
                let rows = page as usize * BS * 32..(page as usize + 1) * BS * 32;
                kv.layers[0].k[rows.clone()].fill(f32::NAN);
                kv.layers[0].v[rows].fill(f32::NAN);
            }
            let two = TwoTables {
                first,
                sliding: &sliding_pages[first..],
                full: PagedTable {
                    block_size: BS,
                    blocks: &full_blocks,
                },
            };
            if a == 16 {
                let mut spoiled = kv.clone();
                let short = TwoTables {
                    first: first + 1,
                    sliding: &sliding_pages[first + 1..],
                    ..two
                };
                let seq = crate::StepSeq {
                    addr: &short,
                    start_pos: a,
                    tokens: &tokens[a..b],
                    want_logits: true,
                };
                too_many = Some(model.forward(&mut spoiled, &[seq]));
            }
            let seq = crate::StepSeq {
                addr: &two,
                start_pos: a,
                tokens: &tokens[a..b],
                want_logits: b == tokens.len(),
            };
            got = model.forward(&mut kv, &[seq]).expect("two tables")[0].clone();
        }
        assert_eq!(got.expect("logits"), want, "the logits of one table");
        // Layer 1 never wrote the sliding table's pages, layer 0 never the full table's.
        for (layer, pages) in [(1, &sliding_pages[..]), (0, &full_blocks[..])] {
            for &p in pages {
                let rows = p as usize * BS * 32..(p as usize + 1) * BS * 32;
                assert!(
                    kv.layers[layer].k[rows].iter().all(|x| x.is_nan()),
                    "layer {layer} wrote page {p} of the other table"
                );
            }
        }
        assert!(
            matches!(too_many, Some(Err(KernelError::Unmapped { .. }))),
            "a read before the table's first block: {too_many:?}"
        );
    }

    #[test]
    fn paged_runs_reject_out_of_range_blocks_and_unmapped_lengths() {
        let t = PagedTable {
            block_size: 4,
            blocks: &[1, 9],
        };
        let mut runs = Vec::new();
        assert!(matches!(
            t.runs(8, 32, &mut runs),
            Err(KernelError::SlotOutOfRange { slot: 36, .. })
        ));
        runs.clear();
        assert!(matches!(
            t.runs(9, 64, &mut runs),
            Err(KernelError::Unmapped { .. })
        ));
    }
}

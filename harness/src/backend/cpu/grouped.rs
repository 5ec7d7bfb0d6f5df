//! A grouped run on `cpu`: which block table each layer of the cpu model reads through, and
//! where a table's cell lives in the KV store.
//!
//! **Tables.** The grouped managers hand out one block table per table of the hybrid layout
//! ([`HybridLayout`]): the layer groups that cache per token, in the model's order, each cut
//! into tables of the layout's `layers_per_table` consecutive layers; a recurrent group has no
//! table (its state lives in [`super::CpuBackend`], one per sequence). The cpu model's layers
//! are the groups' layers one group after another (`layer_kinds`), so layer `l` of group `g`
//! reads through the `(l − first layer of g) / layers_per_table`-th table of `g`. The layout is
//! derived here from the model by the layout's own rule and checked, table by table, against
//! the shapes the manager hands out, so a disagreement fails the run instead of reading
//! another table's pages.
//!
//! **Slots.** Every layer's K/V array is indexed by pool page: cell `(page, offset)` of a layer
//! is slot `page × stride + offset`, `stride` the largest `block_tokens` of any table. So a page
//! copy is one slot-range copy of `stride` slots in every layer, and one slot index never names
//! two cells. What it costs in host memory: every layer keeps a row for every cell of every page
//! (`pages × stride` rows a layer), where the device holds a page in one table's layers only —
//! about the number of tables times the pool's bytes, more where a thin table's `block_tokens`
//! widens `stride`. The ledger keeps the manager's figures (slots × slot bytes); this store is
//! the cpu's, like its f32 FP8 values.

use kvbench_cache_api::TableShape;

use super::super::BackendError;
use crate::cache::hybrid::{HybridLayout, TableKind};
use crate::model::ModelShape;

/// How the cpu addresses a grouped layout: fixed for the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GroupedMap {
    /// Per model layer, the table it reads through (`None`: a recurrent layer).
    pub layer_tables: Vec<Option<usize>>,
    /// Slots a page spans in every layer's array: the largest `block_tokens`.
    pub stride: usize,
    /// Accounting slots a page counts for (a [`kvbench_cache_api::CopyOp`]'s unit).
    pub page_slots: u32,
}

impl GroupedMap {
    /// The map of `shape`'s layers onto the tables `shapes` of a layout with `page_slots`-slot
    /// pages, refused where the manager's tables are not the ones the model's groups make.
    pub fn new(
        shape: &ModelShape,
        page_slots: u32,
        shapes: &[TableShape],
    ) -> Result<GroupedMap, BackendError> {
        let refuse = |why: String| {
            BackendError::Step(format!(
                "the grouped layout of model {} on cpu: {why}",
                shape.name
            ))
        };
        // The tables do not depend on the budget: a page (a table's layers × the block size ×
        // the largest per-layer token bytes) is at most `page_slots × kv_bytes_per_token`, so
        // that budget holds at least one page and few enough to count.
        let budget = shape
            .kv_bytes_per_token()
            .checked_mul(u64::from(page_slots))
            .ok_or_else(|| refuse("the page bytes overflow".into()))?;
        let layout =
            HybridLayout::new(shape, page_slots, budget, 0).map_err(|e| refuse(e.to_string()))?;
        if layout.tables.len() != shapes.len() {
            return Err(refuse(format!(
                "the manager hands out {} tables, the model's groups make {}",
                shapes.len(),
                layout.tables.len()
            )));
        }
        for (t, (spec, got)) in layout.tables.iter().zip(shapes).enumerate() {
            let window = match spec.kind {
                TableKind::Sliding { window } => Some(window),
                TableKind::Full | TableKind::Mla => None,
            };
            if got.block_tokens != spec.block_tokens || got.window != window {
                return Err(refuse(format!(
                    "table {t} is {got:?}, the model's groups make {} tokens a page, window {window:?}",
                    spec.block_tokens
                )));
            }
        }
        let groups = shape.groups();
        let mut first_layer = Vec::with_capacity(groups.len());
        let mut at = 0u32;
        for g in &groups {
            first_layer.push(at);
            at = at
                .checked_add(g.layers())
                .ok_or_else(|| refuse("layer count overflows".into()))?;
        }
        let mut layer_tables = vec![None; at as usize];
        let per_table = layout.layers_per_table.max(1);
        let mut seen = vec![0u32; groups.len()];
        for (t, spec) in layout.tables.iter().enumerate() {
            let k = seen
                .get_mut(spec.group)
                .ok_or_else(|| refuse(format!("table {t} names no group")))?;
            let first = first_layer[spec.group] + *k * per_table;
            *k += 1;
            for l in first..first + spec.layers {
                let slot = layer_tables
                    .get_mut(l as usize)
                    .ok_or_else(|| refuse(format!("table {t} names layer {l}, past the model")))?;
                *slot = Some(t);
            }
        }
        let stride = shapes
            .iter()
            .map(|s| s.block_tokens.max(1) as usize)
            .max()
            .unwrap_or(1);
        Ok(GroupedMap {
            layer_tables,
            stride,
            page_slots: page_slots.max(1),
        })
    }

    /// Store slots a pool of at most `pages` pages needs in every layer.
    pub fn slots_for(&self, pages: u64) -> Option<usize> {
        usize::try_from(pages).ok()?.checked_mul(self.stride)
    }

    /// A page copy's `(first page, pages)` from a [`kvbench_cache_api::CopyOp`]'s slots.
    pub fn pages_of(&self, slot: u64, len_slots: u64) -> Result<(usize, usize), BackendError> {
        let ps = u64::from(self.page_slots);
        if !slot.is_multiple_of(ps) || !len_slots.is_multiple_of(ps) {
            return Err(BackendError::Step(format!(
                "a grouped copy of {len_slots} slots from slot {slot} is not whole pages of {ps} slots"
            )));
        }
        let page = usize::try_from(slot / ps)
            .map_err(|_| BackendError::Step(format!("copy from slot {slot}: too large")))?;
        let pages = usize::try_from(len_slots / ps)
            .map_err(|_| BackendError::Step(format!("copy of {len_slots} slots: too large")))?;
        Ok((page, pages))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layer_maps_to_its_groups_table_and_recurrent_layers_to_none() {
        let sliding = ModelShape::tiny_sliding();
        let shapes = HybridLayout::new(&sliding, 16, 1 << 20, 0)
            .expect("layout")
            .grouped_pool()
            .shapes;
        let m = GroupedMap::new(&sliding, 16, &shapes).expect("map");
        assert_eq!(m.layer_tables, vec![Some(0), Some(0), Some(1), Some(1)]);
        assert_eq!(m.stride, 16);
        let hybrid = ModelShape::tiny_hybrid();
        let shapes = HybridLayout::new(&hybrid, 16, 1 << 20, 4)
            .expect("layout")
            .grouped_pool()
            .shapes;
        let m = GroupedMap::new(&hybrid, 16, &shapes).expect("map");
        assert_eq!(m.layer_tables, vec![Some(0), Some(0), None, None]);
        // A manager whose tables are not the model's is refused.
        let mut wrong = shapes.clone();
        wrong[0].window = Some(3);
        assert!(GroupedMap::new(&hybrid, 16, &wrong).is_err());
        assert!(GroupedMap::new(&hybrid, 16, &[]).is_err());
        assert_eq!(m.pages_of(32, 16).expect("whole"), (2, 1));
        assert!(m.pages_of(8, 16).is_err());
    }
}

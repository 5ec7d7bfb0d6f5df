//! The flat shadow: the summed managers' layouts, one block table (paged) or one contiguous
//! region a stream over the device's slots, checked through the slot store and the grain reverse
//! index of [`Shadow`]. [`Flat`] is the layout it follows; `observe.rs` follows a stream's layout
//! between steps and queues what is new for checking, `write.rs` writes tags (own tokens, foreign
//! writes, copies, swaps), and `decode.rs` is the fused pass for a decode through an unchanged
//! table. Children of the shadow, for its private state.

use super::*;

mod decode;
mod observe;
mod write;

/// A layout the flat shadow follows: a block table or a contiguous region. Grouped layouts go to
/// `grouped/` before any of the flat paths sees a layout, so these have no arm for them.
#[derive(Debug, Clone, Copy)]
pub(super) enum Flat<'a> {
    Paged {
        block_size: u32,
        blocks: &'a Pages,
    },
    Contiguous {
        base_slot: u64,
        capacity_tokens: u32,
    },
}

impl<'a> Flat<'a> {
    /// The flat layout, or `None` for a grouped one.
    #[inline]
    fn of(layout: SeqLayout<'a>) -> Option<Flat<'a>> {
        match layout {
            SeqLayout::Paged { block_size, blocks } => Some(Flat::Paged { block_size, blocks }),
            SeqLayout::Contiguous {
                base_slot,
                capacity_tokens,
            } => Some(Flat::Contiguous {
                base_slot,
                capacity_tokens,
            }),
            SeqLayout::Grouped { .. } => None,
        }
    }

    /// Slot of position `pos`, if mapped.
    #[inline]
    fn slot_of(&self, pos: u32) -> Option<u64> {
        match *self {
            Flat::Paged { block_size, blocks } => {
                let b = *blocks.get((pos / block_size.max(1)) as usize)?;
                Some(u64::from(b) * u64::from(block_size) + u64::from(pos % block_size.max(1)))
            }
            Flat::Contiguous {
                base_slot,
                capacity_tokens,
            } => (pos < capacity_tokens).then(|| base_slot + u64::from(pos)),
        }
    }
}

//! The cell store of the grouped shadow: one [`Tag`] per cell `(page, offset)` of the pool (every
//! page as long as the largest table's `block_tokens`, so a page keeps its cells whichever
//! table maps it next), and one version per page, bumped by every write that changes a tag.
//! Allocated page by page on first touch, like the flat store.

use kvbench_cache_api::{GroupTable, TableShape};

use crate::backend::sim::shadow_store::{LazyArray, Tag, MAX_ENTRIES};

#[derive(Debug)]
pub(in crate::backend::sim) struct Cells {
    tags: LazyArray<Tag>,
    vers: LazyArray<u64>,
    /// Cells a page (the largest `block_tokens` of the run).
    stride: u32,
    page_slots: u32,
    pages: u64,
    /// The run's tables: every layout must have these.
    shapes: Vec<TableShape>,
}

impl Cells {
    /// A store for the run whose layouts have `shapes` over pages of `page_slots` slots, in a
    /// pool of at most `total_slots` slots (pages × page_slots never exceeds the manager's slot
    /// count, which also holds the recurrent state).
    pub fn new(page_slots: u32, shapes: &[TableShape], total_slots: u64) -> Result<Cells, String> {
        if page_slots == 0 {
            return Err("the grouped layout has pages of 0 slots; nothing is shadowed".into());
        }
        let stride = shapes.iter().map(|s| s.block_tokens).max().unwrap_or(0);
        if stride == 0 {
            return Err(
                "the grouped layout has no table of at least 1 token a block; nothing is \
                        shadowed"
                    .into(),
            );
        }
        let pages = total_slots / u64::from(page_slots);
        let cells = pages
            .checked_mul(u64::from(stride))
            .filter(|&n| n <= MAX_ENTRIES)
            .ok_or_else(|| {
                format!(
                    "the shadow payload tracks at most {MAX_ENTRIES} cells, the grouped pool has \
                     {pages} pages of up to {stride} tokens (run with --no-shadow)"
                )
            })?;
        let tags = LazyArray::new(cells, Tag::EMPTY).ok_or("cell store too large")?;
        let vers = LazyArray::new(pages, 0u64).ok_or("page versions too large")?;
        Ok(Cells {
            tags,
            vers,
            stride,
            page_slots,
            pages,
            shapes: shapes.to_vec(),
        })
    }

    pub fn page_slots(&self) -> u32 {
        self.page_slots
    }

    pub fn block_tokens(&self, table: u32) -> Option<u32> {
        self.shapes
            .get(table as usize)
            .map(|s| s.block_tokens.max(1))
    }

    /// Why a layout does not fit this run's store, if it does not.
    pub fn refuses(
        &self,
        page_slots: u32,
        shapes: &[TableShape],
        tables: &[GroupTable],
    ) -> Option<String> {
        if page_slots != self.page_slots || shapes != self.shapes.as_slice() {
            return Some(format!(
                "its grouped layout ({} tables, pages of {page_slots} slots) is not the run's \
                 ({} tables, pages of {} slots)",
                shapes.len(),
                self.shapes.len(),
                self.page_slots
            ));
        }
        if tables.len() != shapes.len() {
            return Some(format!(
                "its grouped layout has {} block tables for {} table shapes",
                tables.len(),
                shapes.len()
            ));
        }
        None
    }

    fn index(&self, page: u32, off: u32) -> Option<u64> {
        (u64::from(page) < self.pages && off < self.stride)
            .then(|| u64::from(page) * u64::from(self.stride) + u64::from(off))
    }

    /// The page's version, or `None` outside the pool.
    pub fn ver(&self, page: u32) -> Option<u64> {
        self.vers.get(u64::from(page)).copied()
    }

    pub fn get(&self, page: u32, off: u32) -> Option<Tag> {
        self.tags.get(self.index(page, off)?).copied()
    }

    /// Store `tag`; false outside the pool.
    pub fn write(&mut self, page: u32, off: u32, tag: Tag) -> bool {
        let Some(i) = self.index(page, off) else {
            return false;
        };
        let Some(t) = self.tags.get_mut(i) else {
            return false;
        };
        if *t == tag {
            return true;
        }
        *t = tag;
        self.bump(page);
        true
    }

    fn bump(&mut self, page: u32) {
        if let Some(v) = self.vers.get_mut(u64::from(page)) {
            *v = v.wrapping_add(1);
        }
    }

    /// Copy every cell of page `src` to page `dst`; the cells written, or `None` outside the
    /// pool.
    pub fn copy_page(&mut self, src: u32, dst: u32) -> Option<u64> {
        let (s0, d0) = (self.index(src, 0)?, self.index(dst, 0)?);
        let mut changed = false;
        for k in 0..u64::from(self.stride) {
            let tag = self.tags.get(s0 + k).copied().unwrap_or(Tag::EMPTY);
            if let Some(t) = self.tags.get_mut(d0 + k) {
                changed |= *t != tag;
                *t = tag;
            }
        }
        if changed {
            self.bump(dst);
        }
        Some(u64::from(self.stride))
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.tags.allocated_bytes() + self.vers.allocated_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<TableShape> {
        vec![
            TableShape {
                block_tokens: 4,
                window: None,
            },
            TableShape {
                block_tokens: 8,
                window: Some(8),
            },
        ]
    }

    fn tag(pos: u32) -> Tag {
        Tag {
            pos,
            token: 7,
            writer: 1,
        }
    }

    #[test]
    fn a_changing_write_or_copy_moves_the_page_version_and_the_same_tag_does_not() {
        let mut c = Cells::new(4, &shapes(), 4 * 10 + 3).expect("fits");
        assert_eq!(c.ver(9), Some(0));
        assert_eq!(c.ver(10), None, "10 pages: 43 slots hold 10 pages of 4");
        assert!(
            c.write(2, 7, tag(7)),
            "a page holds the largest block: 8 cells"
        );
        assert!(!c.write(2, 8, tag(8)), "offset past the largest block");
        assert!(!c.write(10, 0, tag(0)), "page past the pool");
        assert_eq!(c.ver(2), Some(1));
        assert!(c.write(2, 7, tag(7)));
        assert_eq!(c.ver(2), Some(1), "the same tag again changes nothing");
        assert_eq!(c.copy_page(2, 5), Some(8));
        assert_eq!(c.get(5, 7), Some(tag(7)));
        assert_eq!(c.get(5, 0), Some(Tag::EMPTY));
        assert_eq!(c.ver(5), Some(1));
        assert_eq!(c.copy_page(2, 5), Some(8));
        assert_eq!(
            c.ver(5),
            Some(1),
            "a copy of the same cells changes nothing"
        );
        assert_eq!(c.copy_page(2, 10), None);
    }

    #[test]
    fn a_layout_of_another_shape_is_refused_and_a_huge_pool_too() {
        let c = Cells::new(4, &shapes(), 64).expect("fits");
        assert!(c
            .refuses(
                4,
                &shapes(),
                &[GroupTable::default(), GroupTable::default()]
            )
            .is_none());
        assert!(c.refuses(8, &shapes(), &[]).is_some());
        assert!(c
            .refuses(4, &shapes()[..1], &[GroupTable::default()])
            .is_some());
        assert!(c.refuses(4, &shapes(), &[GroupTable::default()]).is_some());
        assert!(Cells::new(0, &shapes(), 64).is_err());
        assert!(Cells::new(1, &shapes(), MAX_ENTRIES).is_err());
    }
}

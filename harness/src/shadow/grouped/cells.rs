//! The cell store of the grouped shadow: one [`Tag`] per cell `(page, offset)` of the pool (every
//! page as long as the largest table's `block_tokens`, so a page keeps its cells whichever
//! table maps it next), allocated page by page on first touch like the flat store. A write
//! says whether it changed the cell: only a change can surprise a reader.

use kvbench_cache_api::{GroupTable, TableShape};

use crate::shadow::store::{LazyArray, Tag, MAX_ENTRIES, PAGE_ENTRIES};

#[derive(Debug)]
pub(in crate::shadow) struct Cells {
    t: CellTags,
    page_slots: u32,
    /// The run's tables: every layout must have these.
    shapes: Vec<TableShape>,
    /// The distinct shapes among `shapes`, in first-seen order, and each table's index into
    /// them: a decode does a shape's arithmetic once, not once a table (Gemma 3 has 31 tables
    /// of two shapes).
    distinct: Vec<TableShape>,
    class: Vec<u32>,
    /// Tables of each distinct shape.
    class_counts: Vec<u64>,
    /// Whether a page's cells lie in one page of the lazy store (the stride divides it), so
    /// that a stream's decodes may be kept pending in a page it wrote before
    /// (`pending.rs`): storing them later allocates nothing new.
    tails: bool,
}

/// The tags themselves, apart from the run's shapes so that a fused decode can store through
/// every table while it reads each table's shape class.
#[derive(Debug)]
pub(in crate::shadow) struct CellTags {
    tags: LazyArray<Tag>,
    /// Cells a page (the largest `block_tokens` of the run).
    stride: u32,
    pages: u64,
}

impl CellTags {
    #[inline(always)]
    fn index(&self, page: u32, off: u32) -> Option<u64> {
        (u64::from(page) < self.pages && off < self.stride)
            .then(|| u64::from(page) * u64::from(self.stride) + u64::from(off))
    }

    /// Store `tag` where nobody else reads the cell, so whether it changed does not matter:
    /// false outside the pool. The fused decode's store, once a table.
    #[inline(always)]
    pub fn store(&mut self, page: u32, off: u32, tag: Tag) -> bool {
        match self.index(page, off).and_then(|i| self.tags.get_mut(i)) {
            Some(t) => {
                *t = tag;
                true
            }
            None => false,
        }
    }

    /// Whether page `page`'s first cell is in the pool and its page of the lazy store allocated
    /// (where a page's cells lie in one page of the store, `Cells::tails`, all of its cells).
    #[inline(always)]
    pub fn allocated(&self, page: u32) -> bool {
        self.index(page, 0)
            .is_some_and(|i| self.tags.is_allocated(i))
    }

    /// Store `tags` into the cells from `(page, off)` on, within the page, where nobody else
    /// reads them (no cell is compared first), or `None` when they leave the page or the pool.
    /// A stream's pending tail, table by table: the tags are built once for every table.
    #[inline]
    pub fn store_tags(&mut self, page: u32, off: u32, tags: &[Tag]) -> Option<()> {
        let len = u32::try_from(tags.len()).ok()?;
        if off.checked_add(len)? > self.stride {
            return None;
        }
        self.store_tags_on(page, off, tags)
    }

    /// [`CellTags::store_tags`] running on into the pages after `page`: where a table's blocks
    /// are as long as a page's cells, blocks on consecutive pages hold consecutive positions in
    /// consecutive cells, and a prompt's blocks go in one copy. Checked against the pool first,
    /// so nothing is stored when it returns `None`.
    #[inline]
    pub fn store_tags_on(&mut self, page: u32, off: u32, tags: &[Tag]) -> Option<()> {
        let i = self.index(page, off)?;
        match self.tags.run_in_page_mut(i, tags.len()) {
            // Within one page of the lazy store, already allocated: one copy.
            Some(run) => {
                run.copy_from_slice(tags);
                Some(())
            }
            None => self.store_tags_across(i, tags),
        }
    }

    /// [`CellTags::store_tags_on`] for a run whose page of the lazy store is not allocated yet
    /// or that crosses into the next one: out of line, so that the common store inlines small.
    #[cold]
    #[inline(never)]
    fn store_tags_across(&mut self, i: u64, tags: &[Tag]) -> Option<()> {
        let n = tags.len() as u64;
        // The store holds exactly the pool's cells.
        if i.checked_add(n)? > self.tags.len() {
            return None;
        }
        let mut done = 0usize;
        while done < tags.len() {
            let run = self.tags.run_mut(i + done as u64, n - done as u64)?;
            let k = run.len();
            run.copy_from_slice(&tags[done..done + k]);
            done += k;
        }
        Some(())
    }
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
        let tags = LazyArray::zeroed(cells).ok_or("cell store too large")?;
        let mut distinct: Vec<TableShape> = Vec::new();
        let class: Vec<u32> = shapes
            .iter()
            .map(|s| {
                let at = distinct.iter().position(|d| d == s).unwrap_or_else(|| {
                    distinct.push(*s);
                    distinct.len() - 1
                });
                at as u32
            })
            .collect();
        let mut class_counts = vec![0u64; distinct.len()];
        for &c in &class {
            class_counts[c as usize] += 1;
        }
        Ok(Cells {
            t: CellTags {
                tags,
                stride,
                pages,
            },
            page_slots,
            shapes: shapes.to_vec(),
            distinct,
            class,
            class_counts,
            tails: PAGE_ENTRIES.is_multiple_of(u64::from(stride)),
        })
    }

    /// Whether decodes may be kept pending (see the field).
    pub fn tails(&self) -> bool {
        self.tails
    }

    pub fn page_slots(&self) -> u32 {
        self.page_slots
    }

    /// Cells a page (the largest `block_tokens` of the run).
    pub fn stride(&self) -> u32 {
        self.t.stride
    }

    pub fn block_tokens(&self, table: u32) -> Option<u32> {
        self.shapes
            .get(table as usize)
            .map(|s| s.block_tokens.max(1))
    }

    /// Table `table`'s shape.
    pub fn shape(&self, table: u32) -> Option<&TableShape> {
        self.shapes.get(table as usize)
    }

    /// The run's distinct table shapes, and each table's index into them.
    pub fn classes(&self) -> (&[TableShape], &[u32]) {
        (&self.distinct, &self.class)
    }

    /// How many tables each distinct shape has.
    pub fn class_counts(&self) -> &[u64] {
        &self.class_counts
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
        Cells::refuses_tables(shapes, tables)
    }

    /// Why a layout whose shapes are the run's does not fit, if it does not: a table per shape.
    pub fn refuses_tables(shapes: &[TableShape], tables: &[GroupTable]) -> Option<String> {
        (tables.len() != shapes.len()).then(|| {
            format!(
                "its grouped layout has {} block tables for {} table shapes",
                tables.len(),
                shapes.len()
            )
        })
    }

    /// Pages in the pool.
    pub fn pages(&self) -> u64 {
        self.t.pages
    }

    /// The number of tables of the run's layouts.
    pub fn tables(&self) -> u32 {
        self.shapes.len() as u32
    }

    pub fn has_page(&self, page: u32) -> bool {
        u64::from(page) < self.t.pages
    }

    pub fn get(&self, page: u32, off: u32) -> Option<Tag> {
        self.t.tags.get(self.t.index(page, off)?).copied()
    }

    /// Store `tag`: whether the cell changed, or `None` outside the pool.
    #[inline]
    pub fn write(&mut self, page: u32, off: u32, tag: Tag) -> Option<bool> {
        let t = self.t.tags.get_mut(self.t.index(page, off)?)?;
        let changed = *t != tag;
        *t = tag;
        Some(changed)
    }

    /// Each table's index into the distinct shapes, and the tags to store into meanwhile.
    pub fn classes_and_tags(&mut self) -> (&[u32], &mut CellTags) {
        (&self.class, &mut self.t)
    }

    /// Store the tags of positions `pos..` (tokens `tokens`, writer `writer`) from cell `(page,
    /// off)` on, within the page, where nobody else reads it (no cell is compared first), or
    /// `None` when the run leaves the page or the pool.
    #[inline(always)]
    pub fn store_run(
        &mut self,
        page: u32,
        off: u32,
        tokens: &[u32],
        pos: u32,
        writer: u32,
    ) -> Option<()> {
        let len = u32::try_from(tokens.len()).ok()?;
        if off.checked_add(len)? > self.t.stride {
            return None;
        }
        let mut i = self.t.index(page, off)?;
        let mut done = 0usize;
        while done < tokens.len() {
            // Within one page of cells a run may still cross a page of the lazy store.
            let run = self.t.tags.run_mut(i, (tokens.len() - done) as u64)?;
            let n = run.len();
            let from = pos + done as u32;
            // Equal lengths and a counter: a loop of plain stores (a three-way zip with a
            // range cost about 17 instructions a cell).
            let toks = &tokens[done..done + n];
            for (k, (t, &token)) in run.iter_mut().zip(toks).enumerate() {
                *t = Tag {
                    pos: from + k as u32,
                    token,
                    writer,
                };
            }
            done += n;
            i += n as u64;
        }
        Some(())
    }

    /// Copy every cell of page `src` to page `dst`, the offsets whose cell changed into
    /// `changed` (cleared first); the cells written, or `None` outside the pool.
    pub fn copy_page(&mut self, src: u32, dst: u32, changed: &mut Vec<u32>) -> Option<u64> {
        let (s0, d0) = (self.t.index(src, 0)?, self.t.index(dst, 0)?);
        changed.clear();
        for k in 0..self.t.stride {
            let tag = self
                .t
                .tags
                .get(s0 + u64::from(k))
                .copied()
                .unwrap_or(Tag::EMPTY);
            if let Some(t) = self.t.tags.get_mut(d0 + u64::from(k)) {
                if *t != tag {
                    *t = tag;
                    changed.push(k);
                }
            }
        }
        Some(u64::from(self.t.stride))
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.t.tags.allocated_bytes()
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
    fn a_write_or_copy_says_which_cells_changed_and_the_same_tag_changes_none() {
        let mut c = Cells::new(4, &shapes(), 4 * 10 + 3).expect("fits");
        assert!(c.has_page(9));
        assert!(!c.has_page(10), "10 pages: 43 slots hold 10 pages of 4");
        assert_eq!(
            c.write(2, 7, tag(7)),
            Some(true),
            "a page holds the largest block: 8 cells"
        );
        assert_eq!(c.write(2, 8, tag(8)), None, "offset past the largest block");
        assert_eq!(c.write(10, 0, tag(0)), None, "page past the pool");
        assert_eq!(
            c.write(2, 7, tag(7)),
            Some(false),
            "the same tag again changes nothing"
        );
        let mut changed = vec![99];
        assert_eq!(c.copy_page(2, 5, &mut changed), Some(8));
        assert_eq!(changed, vec![7]);
        assert_eq!(c.get(5, 7), Some(tag(7)));
        assert_eq!(c.get(5, 0), Some(Tag::EMPTY));
        assert_eq!(c.copy_page(2, 5, &mut changed), Some(8));
        assert!(
            changed.is_empty(),
            "a copy of the same cells changes nothing"
        );
        assert_eq!(c.copy_page(2, 10, &mut changed), None);
    }

    #[test]
    fn a_run_or_a_store_writes_within_its_page_and_the_pool() {
        let mut c = Cells::new(4, &shapes(), 4 * 10).expect("fits");
        assert_eq!(c.store_run(3, 2, &[5, 6], 10, 1), Some(()));
        assert_eq!(c.get(3, 2).map(|t| (t.pos, t.token)), Some((10, 5)));
        assert_eq!(c.get(3, 3).map(|t| (t.pos, t.token)), Some((11, 6)));
        assert_eq!(c.store_run(3, 2, &[5, 7], 10, 1), Some(()));
        assert_eq!(c.get(3, 3).map(|t| (t.pos, t.token)), Some((11, 7)));
        assert_eq!(
            c.store_run(3, 7, &[5, 6], 10, 1),
            None,
            "past the page's 8 cells"
        );
        assert_eq!(c.store_run(10, 0, &[5], 10, 1), None, "past the pool");
        assert_eq!(
            c.classes_and_tags().1.store_tags(4, 6, &[tag(1), tag(2)]),
            Some(())
        );
        assert_eq!(c.get(4, 7), Some(tag(2)));
        assert_eq!(
            c.classes_and_tags().1.store_tags(4, 7, &[tag(1), tag(2)]),
            None,
            "past the page"
        );
        assert_eq!(
            c.classes_and_tags().1.store_tags(10, 0, &[tag(1)]),
            None,
            "past the pool"
        );
        let three = [tag(1), tag(2), tag(3)];
        assert_eq!(c.classes_and_tags().1.store_tags_on(5, 7, &three), Some(()));
        assert_eq!(c.get(6, 0), Some(tag(2)), "on into the next page");
        assert_eq!(c.get(6, 1), Some(tag(3)));
        assert_eq!(
            c.classes_and_tags().1.store_tags_on(9, 7, &three),
            None,
            "past the pool's last page"
        );
        assert_eq!(c.get(9, 7), Some(Tag::EMPTY), "nothing stored when refused");
        assert!(c.classes_and_tags().1.store(3, 7, tag(9)));
        assert_eq!(c.get(3, 7), Some(tag(9)));
        assert!(
            !c.classes_and_tags().1.store(3, 8, tag(9)),
            "offset past the largest block"
        );
        assert!(
            !c.classes_and_tags().1.store(10, 0, tag(9)),
            "page past the pool"
        );
    }

    #[test]
    fn tables_of_one_shape_share_a_class() {
        let mut s = shapes();
        s.push(s[0]);
        let c = Cells::new(4, &s, 64).expect("fits");
        let (distinct, class) = c.classes();
        assert_eq!(distinct, &shapes()[..]);
        assert_eq!(class, &[0, 1, 0]);
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
        let mut other = shapes();
        other[1].window = None;
        assert!(c
            .refuses(4, &other, &vec![GroupTable::default(); 2])
            .is_some());
        other[1].window = Some(16);
        assert!(c
            .refuses(4, &other, &vec![GroupTable::default(); 2])
            .is_some());
        other[1].window = Some(8);
        other[1].block_tokens = 4;
        assert!(c
            .refuses(4, &other, &vec![GroupTable::default(); 2])
            .is_some());
        assert!(Cells::new(0, &shapes(), 64).is_err());
        assert!(Cells::new(1, &shapes(), MAX_ENTRIES).is_err());
    }
}

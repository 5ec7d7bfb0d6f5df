//! Tokens per Mooncake hash id, read from the trace itself.
//!
//! A row of `input_length` L with n ids says the block b satisfies (n − 1)·b < L ≤ n·b: the ids
//! cover the prompt and the last one is not empty. Every row narrows the integer range of b;
//! the published traces pin it exactly (512 for the FAST'25 release). A stated block outside a
//! row's range would make the ids cover only part of each prompt (the rest fresh tokens, its
//! reuse silently lost) or run past it, so it is refused naming the row; an absent one is
//! inferred from the range.

use serde::Serialize;

/// A row's constraint, to name it in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HashRow {
    pub line: u64,
    pub input_length: u32,
    pub ids: u32,
}

impl HashRow {
    /// The block sizes this row allows, `(lo, hi)` inclusive (`lo > hi`: none).
    fn range(self) -> (u64, u64) {
        let (l, n) = (self.input_length as u64, self.ids as u64);
        let lo = l.div_ceil(n).max(1);
        let hi = match (n, l) {
            (1, _) => u64::MAX,
            (_, 0) => 0,
            _ => (l - 1) / (n - 1),
        };
        (lo, hi)
    }

    fn describe(self) -> String {
        let (lo, hi) = self.range();
        let allows = if lo > hi {
            "no block size".to_string()
        } else if hi == u64::MAX {
            format!("{lo} tokens per id or more")
        } else if lo == hi {
            format!("exactly {lo} tokens per id")
        } else {
            format!("{lo}..={hi} tokens per id")
        };
        format!(
            "input_length {} with {} hash ids allows {allows}",
            self.input_length, self.ids
        )
    }
}

/// The range of blocks every row with ids allows, folded row by row, and the first row that
/// contradicts a stated block.
#[derive(Debug, Clone, Default)]
pub struct HashBlockFit {
    /// The block the scenario or flag states (None: infer).
    pub stated: Option<u32>,
    lo: Option<(u64, HashRow)>,
    hi: Option<(u64, HashRow)>,
    /// Rows with ids, their ids and input tokens (for the coverage).
    pub rows: u64,
    pub ids: u64,
    pub input_tokens: u64,
    first_contradiction: Option<HashRow>,
    first_empty: Option<HashRow>,
}

/// What the fit resolved to, for `trace stats` and the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HashBlock {
    /// Tokens per hash id used by the replay.
    pub tokens: u32,
    /// `true` when stated by the scenario or flag, `false` when inferred from the rows.
    pub stated: bool,
    /// The range every row allows, inclusive (`max` None: unbounded above).
    pub allowed_min: u64,
    pub allowed_max: Option<u64>,
    /// Rows with ids, their ids, and ids × block against the input tokens they describe.
    pub rows: u64,
    pub ids: u64,
    pub covered_tokens: u64,
    pub input_tokens: u64,
}

impl HashBlock {
    /// Ids × block over input tokens: 1 up to the last id's partial block.
    pub fn coverage(&self) -> f64 {
        self.covered_tokens as f64 / self.input_tokens.max(1) as f64
    }
}

impl HashBlockFit {
    pub fn new(stated: Option<u32>) -> HashBlockFit {
        HashBlockFit {
            stated,
            ..HashBlockFit::default()
        }
    }

    /// Fold one row (rows without ids say nothing about the block).
    pub fn push(&mut self, line: u64, input_length: u32, ids: usize) {
        if ids == 0 {
            return;
        }
        let row = HashRow {
            line,
            input_length,
            ids: u32::try_from(ids).unwrap_or(u32::MAX),
        };
        self.rows += 1;
        self.ids = self.ids.saturating_add(ids as u64);
        self.input_tokens = self.input_tokens.saturating_add(input_length as u64);
        let (lo, hi) = row.range();
        if lo > hi {
            self.first_empty.get_or_insert(row);
            return;
        }
        if self.lo.is_none_or(|(l, _)| lo > l) {
            self.lo = Some((lo, row));
        }
        if self.hi.is_none_or(|(h, _)| hi < h) {
            self.hi = Some((hi, row));
        }
        if let Some(b) = self.stated {
            if !(lo..=hi).contains(&(b as u64)) {
                self.first_contradiction.get_or_insert(row);
            }
        }
    }

    /// The block to replay with, or why none: `(line, message)` naming the row at fault.
    /// `None` when no row has ids.
    pub fn resolve(&self) -> Result<Option<HashBlock>, (u64, String)> {
        if let Some(row) = self.first_empty {
            return Err((
                row.line,
                format!(
                    "{}: no block of tokens per id covers it (each id is one block of the prompt)",
                    row.describe()
                ),
            ));
        }
        if let Some(row) = self.first_contradiction {
            let b = self.stated.unwrap_or_default();
            let covered = (row.ids as u64).saturating_mul(b as u64);
            return Err((
                row.line,
                format!(
                    "hash_block_tokens = {b} contradicts the trace: {}, so {} ids × {b} = \
                     {covered} tokens for {} input tokens{}; leave hash_block_tokens out to \
                     infer it",
                    row.describe(),
                    row.ids,
                    row.input_length,
                    self.range_words()
                        .map_or(String::new(), |w| format!(" (the whole trace allows {w})")),
                ),
            ));
        }
        let (Some((lo, lo_row)), Some((hi, hi_row))) = (self.lo, self.hi) else {
            return Ok(None);
        };
        if lo > hi {
            return Err((
                hi_row.line,
                format!(
                    "no one block of tokens per id fits every row: {}, but line {}: {}",
                    hi_row.describe(),
                    lo_row.line,
                    lo_row.describe()
                ),
            ));
        }
        let tokens = match self.stated {
            Some(b) => b,
            None => infer(lo, hi),
        };
        Ok(Some(HashBlock {
            tokens,
            stated: self.stated.is_some(),
            allowed_min: lo,
            allowed_max: (hi != u64::MAX).then_some(hi),
            rows: self.rows,
            ids: self.ids,
            covered_tokens: self.ids.saturating_mul(tokens as u64),
            input_tokens: self.input_tokens,
        }))
    }

    fn range_words(&self) -> Option<String> {
        let ((lo, _), (hi, _)) = (self.lo?, self.hi?);
        Some(if lo > hi {
            "no one block size".into()
        } else if hi == u64::MAX {
            format!("{lo} or more")
        } else if lo == hi {
            format!("exactly {lo}")
        } else {
            format!("{lo}..={hi}")
        })
    }
}

/// Within the allowed range: the published block (512) when allowed, else the smallest power of
/// two, else the smallest block. Blocks within the range replay each row's ids over the whole
/// prompt; a trace whose rows pin the range leaves no choice.
fn infer(lo: u64, hi: u64) -> u32 {
    let fit = |b: u64| (lo..=hi).contains(&b);
    let b = if fit(512) {
        512
    } else {
        let p = lo.checked_next_power_of_two().unwrap_or(u64::MAX);
        if fit(p) {
            p
        } else {
            lo
        }
    };
    u32::try_from(b).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(stated: Option<u32>, rows: &[(u32, usize)]) -> Result<Option<HashBlock>, (u64, String)> {
        let mut f = HashBlockFit::new(stated);
        for (i, &(l, n)) in rows.iter().enumerate() {
            f.push(i as u64 + 1, l, n);
        }
        f.resolve()
    }

    #[test]
    fn rows_pin_the_block_and_a_contradiction_names_its_row() {
        // 40,160 tokens in 79 ids and 36,640 in 72 (the published trace's first rows): 512.
        let b = fit(None, &[(40_160, 79), (36_640, 72)]).unwrap().unwrap();
        assert_eq!(
            (b.tokens, b.allowed_min, b.allowed_max),
            (512, 509, Some(514))
        );
        assert!(!b.stated);
        let (line, m) = fit(Some(64), &[(50, 1), (40_160, 79)]).unwrap_err();
        assert_eq!(line, 2, "{m}");
        assert!(
            m.contains("hash_block_tokens = 64") && m.contains("40160"),
            "{m}"
        );
        assert!(m.contains("79 ids × 64 = 5056 tokens"), "{m}");
        // A stated block inside the range is kept.
        assert_eq!(
            fit(Some(510), &[(40_160, 79)]).unwrap().unwrap().tokens,
            510
        );
        // No ids: nothing to infer.
        assert_eq!(fit(None, &[(100, 0)]).unwrap(), None);
    }

    #[test]
    fn rows_that_no_block_fits_are_refused() {
        // Ids for an empty prompt.
        let (line, m) = fit(None, &[(64, 1), (0, 2)]).unwrap_err();
        assert_eq!(line, 2, "{m}");
        // 64 tokens in 4 ids (16) and 64 tokens in 2 ids (32..=63): disjoint.
        let (_, m) = fit(None, &[(64, 4), (64, 2)]).unwrap_err();
        assert!(m.contains("no one block"), "{m}");
    }

    #[test]
    fn an_open_range_prefers_the_published_block_then_a_power_of_two() {
        assert_eq!(infer(100, u64::MAX), 512);
        assert_eq!(infer(50, 66), 64);
        assert_eq!(infer(65, 66), 65);
        assert_eq!(infer(16, 16), 16);
    }
}

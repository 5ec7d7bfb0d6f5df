//! Maps between dotted key paths and places in a TOML text, so every error can name both the
//! line and column a user should look at and the key they would pass to `--set`.

use std::ops::Range;

use toml_edit::{ImDocument, Item, TableLike, Value};

/// One key in the document: its dotted path, where its key starts, and the span of key + value.
#[derive(Debug, Clone)]
struct Entry {
    path: String,
    key_start: usize,
    span: Range<usize>,
}

/// Every key of a parsed TOML text with its position.
#[derive(Debug, Clone)]
pub struct SourceMap {
    text: String,
    entries: Vec<Entry>,
}

impl SourceMap {
    /// `Err` carries the parser's message and byte offset for a syntax error.
    pub fn parse(text: &str) -> Result<SourceMap, (String, usize)> {
        let doc = ImDocument::parse(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            (e.message().trim().to_string(), offset)
        })?;
        let mut entries = Vec::new();
        walk_table(doc.as_table(), "", &mut entries);
        Ok(SourceMap {
            text: text.to_string(),
            entries,
        })
    }

    /// 1-based line and column of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        line_col(&self.text, offset)
    }

    /// Position of `path`, or of its nearest ancestor present in the text; line 1 column 1 when
    /// none is (a key left at its default).
    pub fn position_of(&self, path: &str) -> (usize, usize) {
        let mut p = path;
        loop {
            if let Some(e) = self.entries.iter().find(|e| e.path == p) {
                return self.line_col(e.key_start);
            }
            match p.rfind('.') {
                Some(i) => p = &p[..i],
                None => return (1, 1),
            }
        }
    }

    /// Whether `path` is written in the text.
    pub fn contains(&self, path: &str) -> bool {
        self.entries.iter().any(|e| e.path == path)
    }

    /// A key named `field` (last path segment) written inside `span`, e.g. the unknown key an
    /// error's span encloses.
    pub fn field_in(&self, span: &Range<usize>, field: &str) -> Option<String> {
        self.entries
            .iter()
            .filter(|e| span.contains(&e.key_start))
            .find(|e| e.path.rsplit('.').next() == Some(field))
            .map(|e| e.path.clone())
    }

    /// The deepest table whose span encloses all of `span` (empty for the top level): the
    /// parent of a key reported missing there. Unlike [`SourceMap::key_at`], a span over the whole
    /// document is not mistaken for its first key.
    pub fn key_enclosing(&self, span: &Range<usize>) -> String {
        self.entries
            .iter()
            .filter(|e| e.span.start <= span.start && span.end <= e.span.end.max(e.span.start + 1))
            .max_by_key(|e| (e.path.matches('.').count(), e.key_start))
            .map(|e| e.path.clone())
            .unwrap_or_default()
    }

    /// The deepest key whose key-and-value span holds `offset` (empty for the top level).
    pub fn key_at(&self, offset: usize) -> String {
        self.entries
            .iter()
            .filter(|e| e.span.contains(&offset) || e.key_start == offset)
            .max_by_key(|e| (e.path.matches('.').count(), e.key_start))
            .map(|e| e.path.clone())
            .unwrap_or_default()
    }
}

pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let col = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, col)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Records every key under `table` — a `[table]` or an inline `{ ... }` one alike — with its span.
fn walk_table(table: &dyn TableLike, prefix: &str, out: &mut Vec<Entry>) {
    for (name, _) in table.iter() {
        let Some((key, item)) = table.get_key_value(name) else {
            continue;
        };
        let path = join(prefix, name);
        let key_span = key.span();
        let item_span = item_span(item);
        let start = key_span
            .as_ref()
            .map(|s| s.start)
            .or_else(|| item_span.as_ref().map(|s| s.start));
        if let Some(start) = start {
            let end = item_span
                .as_ref()
                .map(|s| s.end)
                .or_else(|| key_span.as_ref().map(|s| s.end))
                .unwrap_or(start);
            // A `[table]` header's span starts at its `[`, before the key: errors about the
            // table as a whole (a missing key) point there.
            let span_start = item_span.as_ref().map_or(start, |s| s.start.min(start));
            out.push(Entry {
                path: path.clone(),
                key_start: start,
                span: span_start..end.max(start),
            });
        }
        let first_child = out.len();
        match item {
            Item::Table(t) => walk_table(t, &path, out),
            Item::Value(Value::InlineTable(t)) => walk_table(t, &path, out),
            // `[[a.b]]` tables are `a.b.0`, `a.b.1`...: the keys errors name them by.
            Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    let at = join(&path, &i.to_string());
                    if let Some(span) = t.span() {
                        out.push(Entry {
                            path: at.clone(),
                            key_start: span.start,
                            span: span.clone(),
                        });
                    }
                    let first = out.len();
                    walk_table(t, &at, out);
                    let end = out[first..].iter().map(|e| e.span.end).max();
                    if let (Some(end), Some(entry)) = (end, out.get_mut(first.wrapping_sub(1))) {
                        if entry.path == at {
                            entry.span.end = entry.span.end.max(end);
                        }
                    }
                }
            }
            _ => {}
        }
        // A `[table]`'s own span is its header; let it also cover the keys beneath it.
        if start.is_some() {
            let children_end = out[first_child..].iter().map(|e| e.span.end).max();
            if let (Some(end), Some(entry)) = (children_end, out.get_mut(first_child - 1)) {
                entry.span.end = entry.span.end.max(end);
            }
        }
    }
}

fn item_span(item: &Item) -> Option<Range<usize>> {
    match item {
        Item::Value(v) => v.span(),
        Item::Table(t) => t.span(),
        Item::ArrayOfTables(a) => a.span(),
        Item::None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "name = \"x\"\n\n[traffic]\nrequests = 5\nprompt_tokens = { dist = \"fixed\", value = 3 }\n\n[traffic.arrival]\nkind = \"burst\"\n";

    #[test]
    fn finds_keys_in_tables_and_inline_tables() {
        let map = SourceMap::parse(TEXT).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(map.position_of("name"), (1, 1));
        assert_eq!(map.position_of("traffic.requests"), (4, 1));
        assert_eq!(map.position_of("traffic.prompt_tokens.value"), (5, 35));
        assert_eq!(map.position_of("traffic.arrival.kind"), (8, 1));
        // Absent key: nearest ancestor.
        assert_eq!(map.position_of("traffic.output_tokens"), (3, 2));
    }

    #[test]
    fn key_at_offset_is_the_deepest() {
        let map = SourceMap::parse(TEXT).unwrap_or_else(|e| panic!("{e:?}"));
        let off = TEXT.find("value = 3").unwrap_or(0);
        assert_eq!(map.key_at(off), "traffic.prompt_tokens.value");
        let off = TEXT.find("\"burst\"").unwrap_or(0);
        assert_eq!(map.key_at(off), "traffic.arrival.kind");
    }

    #[test]
    fn a_span_over_the_whole_document_is_the_top_level() {
        let text = "a = 1\nb = 2\n";
        let map = SourceMap::parse(text).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(map.key_enclosing(&(0..text.len())), "");
        assert_eq!(map.key_at(0), "a");
        let map = SourceMap::parse(TEXT).unwrap_or_else(|e| panic!("{e:?}"));
        let header = TEXT.find("[traffic.arrival]").unwrap_or(0);
        assert_eq!(map.key_enclosing(&(header..header + 17)), "traffic.arrival");
    }

    #[test]
    fn syntax_error_has_an_offset() {
        let err = SourceMap::parse("a = 1\nb = = 2\n").err();
        let (_, off) = err.unwrap_or_default();
        assert_eq!(line_col("a = 1\nb = = 2\n", off).0, 2);
    }
}

//! Empirical length distributions: a column of a CSV file with a header row.

use std::io::Read;
use std::path::Path;

/// Largest length CSV read (a few million rows); a path like `/dev/zero` would otherwise be
/// read without end.
pub const MAX_CSV_BYTES: u64 = 64 << 20;

/// Reads the non-empty cells of `column` as token counts. The error text names the file and,
/// for a bad cell, its line. Only regular files of at most [`MAX_CSV_BYTES`] are read.
pub fn read_lengths(path: &Path, column: &str) -> Result<Vec<u32>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    if meta.len() > MAX_CSV_BYTES {
        return Err(format!(
            "{}: {} bytes, more than the {MAX_CSV_BYTES} bytes a length CSV may have",
            path.display(),
            meta.len()
        ));
    }
    // The bound holds even if the file grows while it is read.
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(file.take(MAX_CSV_BYTES));
    let headers = reader
        .headers()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .clone();
    let index = headers.iter().position(|h| h == column).ok_or_else(|| {
        let known: Vec<&str> = headers.iter().collect();
        format!(
            "{}: no column `{column}` (columns: {})",
            path.display(),
            known.join(", ")
        )
    })?;
    let mut lengths = Vec::new();
    for (row, record) in reader.records().enumerate() {
        let record = record.map_err(|e| format!("{}: {e}", path.display()))?;
        let cell = record.get(index).unwrap_or("");
        if cell.is_empty() {
            continue;
        }
        let value: u32 = cell.parse().map_err(|_| {
            format!(
                "{}:{}: `{cell}` in column `{column}` is not a token count",
                path.display(),
                row + 2
            )
        })?;
        lengths.push(value);
    }
    if lengths.is_empty() {
        return Err(format!(
            "{}: column `{column}` has no values",
            path.display()
        ));
    }
    Ok(lengths)
}

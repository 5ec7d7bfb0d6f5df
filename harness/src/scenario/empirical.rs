//! Empirical length distributions: a column of a CSV file with a header row.

use std::path::Path;

/// Reads the non-empty cells of `column` as token counts. The error text names the file and,
/// for a bad cell, its line.
pub fn read_lengths(path: &Path, column: &str) -> Result<Vec<u32>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
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

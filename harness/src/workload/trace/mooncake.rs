//! Mooncake JSONL: one object a line, `timestamp` (ms), `input_length`, `output_length`,
//! `hash_ids` (one id per block of prompt content; equal ids, equal content).

use serde::Deserialize;

use super::{RowError, TraceRow};

#[derive(Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

pub fn parse(line: &str) -> Result<TraceRow<'static>, RowError> {
    let r: Row = serde_json::from_str(line).map_err(|e| RowError {
        col: e.column().max(1),
        message: {
            let m = e.to_string();
            m.rsplit_once(" at line ")
                .map_or(m.clone(), |(head, _)| head.to_string())
        },
    })?;
    if !(r.timestamp.is_finite() && r.timestamp >= 0.0) {
        return Err(RowError {
            col: line.find("timestamp").map_or(1, |i| i + 1),
            message: format!("timestamp {} is not ms >= 0", r.timestamp),
        });
    }
    Ok(TraceRow {
        time_ns: (r.timestamp * 1e6).round() as u64,
        prompt_tokens: r.input_length,
        output_tokens: r.output_length,
        model: None,
        log_type: None,
        session: None,
        tenant: None,
        prefix_group: None,
        hash_ids: r.hash_ids,
    })
}

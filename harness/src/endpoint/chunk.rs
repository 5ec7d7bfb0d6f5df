//! One streamed completion chunk read for what the client measures: per choice, how many tokens
//! it carries, their ids where the server sends them, and its finish reason; the usage counters.
//!
//! Tokens in a chunk, per the wire contract (it must hold against third-party servers too):
//! `len(token_ids)` when present, else the increase of `usage.completion_tokens` when present
//! (the chunk's one choice takes it), else 1 per non-empty `text`. A chunk with several tokens
//! is one arrival of all of them.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChoiceDelta {
    pub index: u32,
    pub tokens: u32,
    pub token_ids: Vec<u32>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunk {
    pub choices: Vec<ChoiceDelta>,
    /// `usage.prompt_tokens_details.cached_tokens`, where the server reports its prefix hit.
    pub cached_prompt_tokens: Option<u64>,
}

/// Counts carried from chunk to chunk: the last `usage.completion_tokens` seen.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageState {
    completion_tokens: Option<u64>,
}

/// Choices a chunk may name (`n` is a u32 in the request; more is a malformed event).
pub const MAX_CHOICES: u32 = 1 << 16;

/// Read one event's data (not `[DONE]`); an error is a sentence about what is malformed.
pub fn parse(data: &str, usage: &mut UsageState) -> Result<Chunk, String> {
    let v: Value = serde_json::from_str(data)
        .map_err(|e| format!("event is not JSON ({e}): {}", excerpt(data)))?;
    if let Some(err) = v.get("error") {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| err.to_string(), str::to_string);
        return Err(format!("the server sent an error event: {}", excerpt(&msg)));
    }
    let choices = match v.get("choices") {
        Some(Value::Array(a)) => a.as_slice(),
        None | Some(Value::Null) => &[],
        Some(other) => {
            return Err(format!(
                "\"choices\" is not a list: {}",
                excerpt(&other.to_string())
            ))
        }
    };
    let u = v.get("usage").filter(|u| !u.is_null());
    let completion = match u.map(|u| u.get("completion_tokens")) {
        Some(Some(c)) => Some(
            c.as_u64()
                .ok_or_else(|| format!("usage.completion_tokens is not a count: {c}"))?,
        ),
        _ => None,
    };
    let cached_prompt_tokens = u
        .and_then(|u| u.get("prompt_tokens_details"))
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64);
    let usage_delta = match (completion, usage.completion_tokens) {
        (Some(now), Some(before)) if now < before => {
            return Err(format!(
                "usage.completion_tokens went back from {before} to {now}"
            ))
        }
        (Some(now), before) => Some(now - before.unwrap_or(0)),
        (None, _) => None,
    };
    if completion.is_some() {
        usage.completion_tokens = completion;
    }
    let mut out = Chunk {
        choices: Vec::with_capacity(choices.len()),
        cached_prompt_tokens,
    };
    for c in choices {
        let index = match c.get("index") {
            None => 0,
            Some(i) => i
                .as_u64()
                .filter(|&i| i < u64::from(MAX_CHOICES))
                .ok_or_else(|| format!("choices[].index is not a choice number: {i}"))?
                as u32,
        };
        let finish_reason = match c.get("finish_reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(format!("finish_reason is not a string: {other}")),
        };
        let ids = match c.get("token_ids") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| {
                        "token_ids holds something that is not a token id".to_string()
                    })?,
            ),
            Some(other) => {
                return Err(format!(
                    "token_ids is not a list: {}",
                    excerpt(&other.to_string())
                ))
            }
        };
        let text = match c.get("text") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(format!(
                    "text is not a string: {}",
                    excerpt(&other.to_string())
                ))
            }
        };
        let tokens = match (&ids, usage_delta) {
            (Some(ids), _) => u32::try_from(ids.len()).unwrap_or(u32::MAX),
            (None, Some(d)) if choices.len() == 1 => u32::try_from(d).unwrap_or(u32::MAX),
            _ => u32::from(!text.is_empty()),
        };
        out.choices.push(ChoiceDelta {
            index,
            tokens,
            token_ids: ids.unwrap_or_default(),
            finish_reason,
        });
    }
    Ok(out)
}

/// At most 120 characters of `s`, for messages.
pub fn excerpt(s: &str) -> String {
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_then_usage_then_text() {
        let mut u = UsageState::default();
        let c = parse(
            r#"{"choices":[{"index":0,"text":" a b","token_ids":[5,6],"finish_reason":null}],"usage":{"completion_tokens":2}}"#,
            &mut u,
        )
        .unwrap();
        assert_eq!(
            (c.choices[0].tokens, c.choices[0].token_ids.clone()),
            (2, vec![5, 6])
        );
        // No ids: the usage counter's increase.
        let c = parse(
            r#"{"choices":[{"text":"xyz"}],"usage":{"completion_tokens":5}}"#,
            &mut u,
        )
        .unwrap();
        assert_eq!(c.choices[0].tokens, 3);
        // Neither: one per non-empty text.
        let c = parse(
            r#"{"choices":[{"text":"q"},{"index":1,"text":""}]}"#,
            &mut u,
        )
        .unwrap();
        assert_eq!((c.choices[0].tokens, c.choices[1].tokens), (1, 0));
        let c = parse(r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":{"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":16}}}"#, &mut u).unwrap();
        assert_eq!(c.choices[0].finish_reason.as_deref(), Some("length"));
        assert_eq!(c.cached_prompt_tokens, Some(16));
    }

    #[test]
    fn malformed_chunks_are_sentences() {
        let mut u = UsageState::default();
        assert!(parse("{not json", &mut u).unwrap_err().contains("not JSON"));
        assert!(parse(r#"{"choices":3}"#, &mut u)
            .unwrap_err()
            .contains("not a list"));
        assert!(parse(r#"{"choices":[{"token_ids":[-1]}]}"#, &mut u).is_err());
        assert!(parse(r#"{"error":{"message":"boom"}}"#, &mut u)
            .unwrap_err()
            .contains("boom"));
        parse(r#"{"usage":{"completion_tokens":9}}"#, &mut u).unwrap();
        assert!(parse(r#"{"usage":{"completion_tokens":3}}"#, &mut u)
            .unwrap_err()
            .contains("went back"));
    }
}

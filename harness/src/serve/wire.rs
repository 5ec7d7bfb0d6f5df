//! The completions request as the server reads it, checked before it reaches the engine, and
//! the request bodies a client sends for a scenario's request list (OpenAI's completions API as
//! vLLM serves it; the `kvbench` object is an optional extension).
//!
//! Every refusal is a [`WireError`]: an HTTP status and a message naming the field, answered as
//! `{"error":{"message":...,"type":"invalid_request_error"}}`.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::workload::{Prompt, Request, Workload};

/// The most parallel samples one request may ask for.
pub const MAX_SAMPLES: u32 = 64;
/// OpenAI's default `max_tokens` for completions.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// A refusal: the status and what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct WireError {
    pub status: u16,
    pub message: String,
}

impl WireError {
    pub fn bad(message: impl Into<String>) -> WireError {
        WireError {
            status: 400,
            message: message.into(),
        }
    }

    /// The JSON error body OpenAI's API answers with.
    pub fn body(&self) -> String {
        let kind = match self.status {
            400 | 404 | 413 | 422 => "invalid_request_error",
            429 | 503 => "server_busy",
            _ => "server_error",
        };
        json!({"error": {"message": self.message, "type": kind, "code": self.status}}).to_string()
    }
}

#[derive(Debug, Deserialize)]
struct Body {
    model: Option<String>,
    prompt: Option<Value>,
    max_tokens: Option<i64>,
    min_tokens: Option<i64>,
    #[serde(default)]
    #[allow(dead_code)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    stream: Option<bool>,
    n: Option<i64>,
    seed: Option<i64>,
    stream_options: Option<StreamOptions>,
    kvbench: Option<Extension>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Extension {
    tenant: Option<u32>,
    request_id: Option<u64>,
}

/// What the server serves: the model's name and limits.
#[derive(Debug, Clone)]
pub struct ModelLimits {
    pub name: String,
    pub max_seq_len: u32,
    pub vocab: u32,
}

/// A checked completions request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub samples: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub tenant: u32,
    /// The client's id for the request (`kvbench.request_id`), if it gave one.
    pub request_id: Option<u64>,
    /// The client's sampling identity (`seed`): decoding on the cpu backend is greedy, so it
    /// changes nothing there; kept for the record.
    pub seed: Option<i64>,
}

impl Completion {
    /// The engine's request (`id` names it in the results folder).
    pub fn request(&self, id: u64) -> Request {
        Request {
            id,
            tenant: self.tenant,
            arrival_ms: 0.0,
            prompt: Prompt::Explicit(self.prompt.clone()),
            prefix_group: None,
            output_tokens: self.max_tokens,
            samples: self.samples,
            cancel: None,
            session: None,
        }
    }
}

fn count(v: Option<i64>, field: &str, default: u32) -> Result<u32, WireError> {
    match v {
        None => Ok(default),
        Some(n) => u32::try_from(n)
            .map_err(|_| WireError::bad(format!("{field}: {n} is not a count (0 to 2^32-1)"))),
    }
}

/// Read and check a completions body against the model's limits.
pub fn parse(bytes: &[u8], model: &ModelLimits) -> Result<Completion, WireError> {
    let body: Body = serde_json::from_slice(bytes)
        .map_err(|e| WireError::bad(format!("request body is not a completions request: {e}")))?;
    if let Some(m) = &body.model {
        if *m != model.name {
            return Err(WireError::bad(format!(
                "model: {m:?} is not served here (this server serves {:?})",
                model.name
            )));
        }
    }
    let prompt = match body.prompt {
        None => return Err(WireError::bad("prompt: missing (a list of token ids)")),
        Some(Value::Array(ids)) => ids
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .filter(|&t| t < model.vocab)
                    .ok_or_else(|| {
                        WireError::bad(format!(
                            "prompt[{i}]: {v} is not a token id of this model (0 to {})",
                            model.vocab.saturating_sub(1)
                        ))
                    })
            })
            .collect::<Result<Vec<u32>, _>>()?,
        Some(Value::String(_)) => {
            return Err(WireError::bad(
                "prompt: text prompts are not served (no tokenizer): send a list of token ids",
            ))
        }
        Some(other) => {
            return Err(WireError::bad(format!(
                "prompt: expected a list of token ids, got {other}"
            )))
        }
    };
    if prompt.is_empty() {
        return Err(WireError::bad("prompt: empty"));
    }
    let max_tokens = count(body.max_tokens, "max_tokens", DEFAULT_MAX_TOKENS)?;
    if max_tokens == 0 {
        return Err(WireError::bad("max_tokens: must be at least 1"));
    }
    let min_tokens = count(body.min_tokens, "min_tokens", 0)?;
    if min_tokens > max_tokens {
        return Err(WireError::bad(format!(
            "min_tokens: {min_tokens} is more than max_tokens {max_tokens}"
        )));
    }
    let samples = count(body.n, "n", 1)?;
    if samples == 0 || samples > MAX_SAMPLES {
        return Err(WireError::bad(format!(
            "n: {samples} samples (1 to {MAX_SAMPLES})"
        )));
    }
    let total = prompt.len() as u64 + u64::from(max_tokens);
    if total > u64::from(model.max_seq_len) {
        return Err(WireError::bad(format!(
            "prompt ({} tokens) + max_tokens ({max_tokens}) = {total} is more than this model's \
             maximum context length {}",
            prompt.len(),
            model.max_seq_len
        )));
    }
    let ext = body.kvbench.as_ref();
    Ok(Completion {
        prompt,
        max_tokens,
        samples,
        stream: body.stream.unwrap_or(false),
        include_usage: body
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        tenant: ext.and_then(|e| e.tenant).unwrap_or(0),
        request_id: ext.and_then(|e| e.request_id),
        seed: body.seed,
    })
}

/// The completions body a client sends for `req` (every output length exact: `min_tokens =
/// max_tokens` and `ignore_eos`).
pub fn completion_body(req: &Request, model: &str, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": req.prompt.tokens().as_ref(),
        "max_tokens": req.output_tokens,
        "min_tokens": req.output_tokens,
        "ignore_eos": true,
        "stream": stream,
        "n": req.samples.max(1),
        "seed": req.id,
        "kvbench": {"tenant": req.tenant, "request_id": req.id},
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    }
    body
}

/// The bodies for every request of `workload`, in its order.
pub fn completion_bodies(workload: &Workload, model: &str, stream: bool) -> Vec<Value> {
    workload
        .requests
        .iter()
        .map(|r| completion_body(r, model, stream))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ModelLimits {
        ModelLimits {
            name: "tiny".into(),
            max_seq_len: 64,
            vocab: 512,
        }
    }

    #[test]
    fn a_body_from_the_request_list_reads_back_as_the_request() {
        let req = Completion {
            prompt: vec![1, 2, 3],
            max_tokens: 5,
            samples: 2,
            stream: true,
            include_usage: true,
            tenant: 3,
            request_id: Some(9),
            seed: Some(9),
        }
        .request(9);
        let body = completion_body(&req, "tiny", true).to_string();
        let back = parse(body.as_bytes(), &model()).expect("valid");
        assert_eq!(back.request(9), req);
    }

    #[test]
    fn bad_bodies_are_refused_naming_the_field() {
        let m = model();
        for (body, field) in [
            (r#"{"prompt": [1], "max_tokens": 0}"#, "max_tokens"),
            (r#"{"prompt": "hi"}"#, "prompt"),
            (r#"{"prompt": []}"#, "prompt"),
            (r#"{"prompt": [512]}"#, "prompt[0]"),
            (
                r#"{"prompt": [1], "max_tokens": 64}"#,
                "maximum context length",
            ),
            (r#"{"prompt": [1], "model": "other"}"#, "model"),
            (r#"{"prompt": [1], "n": 0}"#, "n:"),
            (r#"{"prompt": [1], "max_tokens": -1}"#, "max_tokens"),
            (
                r#"{"prompt": [1], "max_tokens": 2, "min_tokens": 3}"#,
                "min_tokens",
            ),
            (r#"{"prompt": [1"#, "not a completions request"),
        ] {
            let e = parse(body.as_bytes(), &m).expect_err(body);
            assert_eq!(e.status, 400, "{body}");
            assert!(e.message.contains(field), "{body}: {}", e.message);
        }
    }
}

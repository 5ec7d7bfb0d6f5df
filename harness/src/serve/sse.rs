//! The answer's bytes: server-sent events for a streamed completion (one event per token, a
//! last chunk per choice with its finish reason, then `data: [DONE]`), or one JSON object for a
//! complete one. Pure formatting over [`Answer`], the state one request's answer accumulates.

use serde_json::{json, Value};

use crate::engine::StreamStatus;

/// One request's answer as it accumulates.
#[derive(Debug, Clone)]
pub struct Answer {
    pub id: String,
    pub model: String,
    pub created_s: u64,
    pub prompt_tokens: u32,
    /// Prompt tokens the prefix cache supplied at the first admission, once known.
    pub cached_tokens: u32,
    pub include_usage: bool,
    /// Per choice: its token ids so far and its finish reason once done.
    pub choices: Vec<(Vec<u32>, Option<&'static str>)>,
}

/// OpenAI's finish reason for a stream's end.
pub fn finish_reason(status: StreamStatus) -> &'static str {
    match status {
        StreamStatus::Completed => "length",
        StreamStatus::Cancelled | StreamStatus::Rejected => "abort",
    }
}

fn text_of(tokens: &[u32]) -> String {
    tokens.iter().map(|t| format!(" {t}")).collect()
}

impl Answer {
    pub fn new(
        id: String,
        model: String,
        prompt_tokens: u32,
        samples: u32,
        include_usage: bool,
    ) -> Answer {
        let created_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Answer {
            id,
            model,
            created_s,
            prompt_tokens,
            cached_tokens: 0,
            include_usage,
            choices: vec![(Vec::new(), None); samples.max(1) as usize],
        }
    }

    /// Tokens generated so far over every choice.
    pub fn completion_tokens(&self) -> u64 {
        self.choices.iter().map(|(t, _)| t.len() as u64).sum()
    }

    fn usage(&self) -> Value {
        let c = self.completion_tokens();
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": c,
            "total_tokens": u64::from(self.prompt_tokens) + c,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn chunk(&self, index: usize, tokens: &[u32], finish: Option<&str>) -> String {
        let mut v = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created_s,
            "model": self.model,
            "choices": [{
                "index": index,
                "text": text_of(tokens),
                "token_ids": tokens,
                "finish_reason": finish,
            }],
        });
        if self.include_usage {
            v["usage"] = self.usage();
        }
        format!("data: {v}\n\n")
    }

    /// Choice `index` produced `token`: its event. An index beyond the choices is ignored.
    pub fn token(&mut self, index: usize, token: u32) -> Option<String> {
        self.choices.get_mut(index)?.0.push(token);
        Some(self.chunk(index, &[token], None))
    }

    /// Choice `index` ended with `reason`: its last chunk (once).
    pub fn finish(&mut self, index: usize, reason: &'static str) -> Option<String> {
        let c = self.choices.get_mut(index)?;
        if c.1.is_some() {
            return None;
        }
        c.1 = Some(reason);
        Some(self.chunk(index, &[], Some(reason)))
    }

    /// The end of the stream: a last chunk for every choice not finished yet (`abort`: the
    /// server stopped it), then `[DONE]`.
    pub fn done(&mut self) -> String {
        let mut out = String::new();
        for i in 0..self.choices.len() {
            if let Some(c) = self.finish(i, "abort") {
                out.push_str(&c);
            }
        }
        out.push_str("data: [DONE]\n\n");
        out
    }

    /// The whole answer as one object (`stream: false`).
    pub fn complete(&self) -> String {
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, (tokens, finish))| {
                json!({
                    "index": i,
                    "text": text_of(tokens),
                    "token_ids": tokens,
                    "finish_reason": finish.unwrap_or("abort"),
                })
            })
            .collect();
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created_s,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_one_event_a_token_then_a_last_chunk_a_choice_then_done() {
        let mut a = Answer::new("cmpl-3".into(), "tiny".into(), 4, 2, true);
        let e = a.token(0, 17).expect("choice 0");
        assert!(e.starts_with("data: {") && e.ends_with("}\n\n"), "{e}");
        let v: Value = serde_json::from_str(e.trim_start_matches("data: ").trim()).expect("json");
        assert_eq!(v["choices"][0]["token_ids"], json!([17]));
        assert_eq!(v["choices"][0]["text"], " 17");
        assert_eq!(v["usage"]["completion_tokens"], 1);
        a.token(1, 5).expect("choice 1");
        assert!(a.token(2, 5).is_none(), "no third choice");
        let last = a.finish(0, "length").expect("first finish");
        assert!(last.contains("\"finish_reason\":\"length\""), "{last}");
        assert!(a.finish(0, "length").is_none(), "a choice finishes once");
        let end = a.done();
        assert!(
            end.contains("\"finish_reason\":\"abort\""),
            "choice 1 never finished: {end}"
        );
        assert!(end.ends_with("data: [DONE]\n\n"));
        let whole: Value = serde_json::from_str(&a.complete()).expect("json");
        assert_eq!(whole["usage"]["total_tokens"], 6);
    }
}

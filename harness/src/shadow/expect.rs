//! What a reader of the shadow payload expects to find at a position, and, when a tag is
//! something else, the words for why (the violation messages of `summary.json`); the one check
//! the flat and grouped shadows share.

use kvbench_cache_api::{ReuseScope, ScopeKey};

use super::ids::Writers;
use super::store::Tag;

/// Scope ids at or above this are private to one root stream (no prefix sharing allowed).
pub(crate) const PRIVATE_SCOPE: u32 = 1 << 31;

/// Whether `tag` is what a reader with token history `history` and reuse scope `scope` must
/// find at `pos`: its own token at that position, written under its own scope (the scope of the
/// tag's writer, from `writers`).
#[inline]
pub(crate) fn expects(history: &[u32], scope: u32, pos: u32, tag: &Tag, writers: &Writers) -> bool {
    tag.pos == pos
        && history.get(pos as usize) == Some(&tag.token)
        && writers.scope(tag.writer) == Some(scope)
}

/// Why `tag` is not what the reader expects at `pos`, or `None` when it is.
pub(crate) fn mismatch(
    history: &[u32],
    scope: u32,
    pos: u32,
    tag: &Tag,
    writers: &Writers,
    scopes: &[ScopeKey],
) -> Option<String> {
    if *tag == Tag::EMPTY {
        return Some("the slot was never written".into());
    }
    let writer = match writers.id(tag.writer) {
        Some(id) => format!("stream {id}"),
        None => format!("unknown writer #{}", tag.writer),
    };
    if tag.pos != pos {
        return Some(format!("it holds {writer}'s position {}", tag.pos));
    }
    let Some(&want) = history.get(pos as usize) else {
        return Some("no token is known at that position".into());
    };
    if tag.token != want {
        return Some(format!(
            "it holds {writer}'s token {} there, expected {want}",
            tag.token
        ));
    }
    let Some(theirs) = writers.scope(tag.writer) else {
        return Some(format!(
            "it holds {writer}'s data, of no known reuse scope (tokens match)"
        ));
    };
    if theirs != scope {
        return Some(format!(
            "it holds {writer}'s data of reuse scope {}, the reader's scope is {} (tokens match)",
            scope_name(theirs, scopes),
            scope_name(scope, scopes)
        ));
    }
    None
}

fn scope_name(id: u32, scopes: &[ScopeKey]) -> String {
    if id >= PRIVATE_SCOPE {
        return format!("private to stream {}", id - PRIVATE_SCOPE);
    }
    match scopes.get(id as usize).map(|k| k.reuse) {
        Some(ReuseScope::Tenant(t)) => format!("tenant:{t}"),
        Some(ReuseScope::Global) => "global".into(),
        Some(ReuseScope::None) => "none".into(),
        None => format!("#{id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_field_of_a_wrong_tag_is_named() {
        let scopes = [ScopeKey {
            model: "m".into(),
            tokenizer: "t".into(),
            reuse: ReuseScope::Tenant(3),
        }];
        let history = [10, 11, 12];
        let mut writers = Writers::default();
        // Writer 1: stream 4 under scope 0; writer 2: stream 4 again, private to stream 5.
        assert_eq!(writers.add(4, 0), Some(1));
        assert_eq!(writers.add(4, PRIVATE_SCOPE | 5), Some(2));
        let good = Tag {
            pos: 1,
            token: 11,
            writer: 1,
        };
        assert!(expects(&history, 0, 1, &good, &writers));
        assert_eq!(mismatch(&history, 0, 1, &good, &writers, &scopes), None);
        let why = |t: Tag| mismatch(&history, 0, 1, &t, &writers, &scopes).unwrap_or_default();
        assert!(!expects(&history, 0, 1, &Tag::EMPTY, &writers));
        assert_eq!(why(Tag::EMPTY), "the slot was never written");
        assert_eq!(
            why(Tag { pos: 2, ..good }),
            "it holds stream 4's position 2"
        );
        assert_eq!(
            why(Tag { token: 9, ..good }),
            "it holds stream 4's token 9 there, expected 11"
        );
        let other = Tag { writer: 2, ..good };
        assert!(!expects(&history, 0, 1, &other, &writers));
        assert_eq!(
            why(other),
            "it holds stream 4's data of reuse scope private to stream 5, the reader's scope is \
             tenant:3 (tokens match)"
        );
        let unknown = Tag { writer: 3, ..good };
        assert!(!expects(&history, 0, 1, &unknown, &writers));
        assert_eq!(
            why(unknown),
            "it holds unknown writer #3's data, of no known reuse scope (tokens match)"
        );
        assert_eq!(
            why(Tag { pos: 2, ..unknown }),
            "it holds unknown writer #3's position 2"
        );
        let past = Tag { pos: 7, ..good };
        assert!(!expects(&history, 0, 7, &past, &writers));
        assert_eq!(
            mismatch(&history, 0, 7, &past, &writers, &scopes).unwrap_or_default(),
            "no token is known at that position"
        );
    }
}

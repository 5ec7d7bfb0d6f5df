//! A request's prompt as a recipe: explicit token ids, or for a replayed trace row a recipe the
//! ids are a pure function of.
//!
//! A real trace holds millions of rows of thousands of tokens each; holding every id for the
//! whole run would cost gigabytes, while what a row's ids *mean* is a few numbers: the replay's
//! seed, the row's request id and its content identity (Mooncake hash ids, a CSV prefix group,
//! the CSV session it continues). The engine makes a recipe's ids at its request's first start
//! attempt — not at arrival, so a wait queue holds descriptors — and drops them when the request
//! resolves (`engine/lifecycle.rs`, `ensure_prompt`), so memory follows the requests in flight.
//! `len_tokens` never makes them. The workload hash encodes the recipe, not its ids.

use std::borrow::Cow;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The prompt of one request. Serialized as its token ids (a recipe reads back as `Explicit`).
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Token ids held as they are: synthetic scenarios (whose bytes and workload hash this keeps
    /// unchanged), a session turn's new user tokens, tests.
    Explicit(Vec<u32>),
    /// A replayed trace row: ids made on demand.
    Recipe(Recipe),
}

/// `len_tokens` ids: the head's (content shared with other rows), then the row's own fresh ids,
/// drawn from a ChaCha20 stream of (seed, key). Everything here is what the ids depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    /// The replay's seed.
    pub seed: u64,
    /// The row's own stream of fresh ids (its request id).
    pub key: u64,
    pub len_tokens: u32,
    /// Ids are drawn from `0..vocab`.
    pub vocab: u32,
    pub head: Head,
}

/// What a trace row's prompt starts with.
#[derive(Debug, Clone, PartialEq)]
pub enum Head {
    /// Nothing shared. `opens_session`: later rows of its CSV session start with this prompt.
    Fresh { opens_session: bool },
    /// A CSV `prefix_group`: the group's first `tokens` ids, the ones a synthetic shared prefix
    /// of that group uses ([`crate::workload::prefix_tokens`]).
    PrefixGroup {
        group: u32,
        tokens: u32,
        opens_session: bool,
    },
    /// Mooncake: `block_tokens` ids per hash id ([`hash_block_tokens`]), the last block cut at
    /// the prompt's length; fresh ids past the last hash id.
    HashIds { block_tokens: u32, ids: Box<[u64]> },
    /// A CSV session row: its session's previous row's prompt, as much of it as fits
    /// (`min(len_tokens, prev_len_tokens)` tokens).
    Continues(Continuation),
}

/// A session row's link to the content it continues. `from` is not necessarily the previous
/// row: it is the nearest earlier row of the session whose first `min(len_tokens,
/// prev_len_tokens)` tokens are the previous row's, and which still adds ids of its own below
/// that length; rows in between add ids only past it. That keeps a session's chain as short as
/// its distinct contributions, so making a row's ids walks at most one link per run of its own
/// ids: a session of n equal-length turns costs O(1) links a row, not O(n) (the replay builds
/// these links with one monotone stack a session, `replay.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Continuation {
    pub from: Arc<Recipe>,
    /// The previous row of the session, by how many request ids before this row it is (its key
    /// is `key - prev_back`; 4 bytes, so a recipe stays 48) and its prompt length: what the
    /// workload hash names, and what caps the continued prefix.
    pub prev_back: u32,
    pub prev_len_tokens: u32,
}

impl Prompt {
    pub fn len_tokens(&self) -> u32 {
        match self {
            Prompt::Explicit(t) => u32::try_from(t.len()).unwrap_or(u32::MAX),
            Prompt::Recipe(r) => r.len_tokens,
        }
    }

    /// The token ids: borrowed when held, made now from the recipe otherwise.
    pub fn tokens(&self) -> Cow<'_, [u32]> {
        match self {
            Prompt::Explicit(t) => Cow::Borrowed(t),
            Prompt::Recipe(r) => Cow::Owned(r.tokens()),
        }
    }

    /// The ids when they are held (no recipe to run).
    pub fn explicit(&self) -> Option<&[u32]> {
        match self {
            Prompt::Explicit(t) => Some(t),
            Prompt::Recipe(_) => None,
        }
    }

    /// Leading tokens other requests may share (the rest are fresh ids no other request holds).
    /// Bounds what an ideal-reuse count must remember.
    pub fn content_tokens(&self) -> u32 {
        match self {
            Prompt::Explicit(t) => u32::try_from(t.len()).unwrap_or(u32::MAX),
            Prompt::Recipe(r) => r.content_tokens(),
        }
    }

    /// Heap bytes this prompt holds besides its own size (ids or hash ids).
    pub fn heap_bytes(&self) -> usize {
        match self {
            Prompt::Explicit(t) => t.capacity() * 4,
            Prompt::Recipe(r) => match &r.head {
                Head::HashIds { ids, .. } => ids.len() * 8,
                // The link is its own request's recipe (counted there) plus the Arc's counts.
                Head::Continues(_) => std::mem::size_of::<Recipe>() + 16,
                _ => 0,
            },
        }
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(t: Vec<u32>) -> Prompt {
        Prompt::Explicit(t)
    }
}

impl FromIterator<u32> for Prompt {
    fn from_iter<I: IntoIterator<Item = u32>>(ids: I) -> Prompt {
        Prompt::Explicit(ids.into_iter().collect())
    }
}

impl Serialize for Prompt {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.tokens().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Prompt, D::Error> {
        Vec::<u32>::deserialize(d).map(Prompt::Explicit)
    }
}

/// Domain of the fresh-id streams (distinct from the hash-id streams' key).
const FRESH_KEY: &[u8] = b"kvbench-trace-fresh-v1";
const HASH_ID_KEY: &[u8] = b"kvbench-trace-hash-id-v1";

fn keyed_rng(domain: &[u8], seed: u64, stream: u64) -> ChaCha20Rng {
    let mut key = blake3::Hasher::new();
    key.update(domain);
    key.update(&seed.to_le_bytes());
    let mut r = ChaCha20Rng::from_seed(*key.finalize().as_bytes());
    r.set_stream(stream);
    r
}

/// The tokens of Mooncake hash id `id`: `len` ids drawn from `vocab`, a fixed function of
/// (seed, id, vocab); a shorter block is a prefix of a longer one.
pub fn hash_block_tokens(seed: u64, id: u64, len: u32, vocab: u32) -> Vec<u32> {
    let mut r = keyed_rng(HASH_ID_KEY, seed, id);
    (0..len).map(|_| r.gen_range(0..vocab.max(1))).collect()
}

impl Recipe {
    pub fn tokens(&self) -> Vec<u32> {
        // A session row continues a chain of earlier rows; walk it without recursion (a long
        // session would otherwise recurse once per row). need[j]: tokens of chain[j] wanted.
        let mut chain: Vec<&Recipe> = Vec::new();
        let mut need: Vec<u32> = Vec::new();
        let mut at = self;
        let mut want = self.len_tokens;
        loop {
            chain.push(at);
            need.push(want);
            match &at.head {
                Head::Continues(c) => {
                    want = want.min(c.prev_len_tokens);
                    at = &c.from;
                }
                _ => break,
            }
        }
        let last = chain.len() - 1;
        let mut out = Vec::with_capacity(self.len_tokens as usize);
        chain[last].write_root(need[last], &mut out);
        for j in (0..last).rev() {
            // `out` holds chain[j + 1]'s first need[j + 1] tokens, which chain[j] starts with;
            // when it wants more they are its own fresh ids, from its first fresh position.
            let more = (need[j] as usize).saturating_sub(out.len());
            chain[j].fresh_into(more, &mut out);
        }
        out
    }

    /// How many recipes `tokens()` visits: 1 plus the links of a session row's chain. The work
    /// of making a session row's ids, besides the ids themselves.
    pub fn chain_links(&self) -> usize {
        let mut n = 1;
        let mut at = self;
        while let Head::Continues(c) = &at.head {
            n += 1;
            at = &c.from;
        }
        n
    }

    /// The first `n` tokens of a recipe whose head is not `Continues`.
    fn write_root(&self, n: u32, out: &mut Vec<u32>) {
        let n = n as usize;
        match &self.head {
            Head::Fresh { .. } | Head::Continues(_) => {}
            Head::PrefixGroup { group, tokens, .. } => {
                let take = (*tokens as usize).min(n) as u32;
                out.extend(super::prefix_tokens(self.seed, *group, take, self.vocab));
            }
            Head::HashIds { block_tokens, ids } => {
                let block = (*block_tokens).max(1) as usize;
                for &id in ids.iter() {
                    if out.len() >= n {
                        break;
                    }
                    let take = (n - out.len()).min(block) as u32;
                    let mut r = keyed_rng(HASH_ID_KEY, self.seed, id);
                    out.extend((0..take).map(|_| r.gen_range(0..self.vocab.max(1))));
                }
            }
        }
        let more = n.saturating_sub(out.len());
        self.fresh_into(more, out);
    }

    fn fresh_into(&self, n: usize, out: &mut Vec<u32>) {
        if n == 0 {
            return;
        }
        let mut r = keyed_rng(FRESH_KEY, self.seed, self.key);
        out.extend((0..n).map(|_| r.gen_range(0..self.vocab.max(1))));
    }

    fn content_tokens(&self) -> u32 {
        let all = self.len_tokens;
        match &self.head {
            Head::Fresh { opens_session } => {
                if *opens_session {
                    all
                } else {
                    0
                }
            }
            Head::PrefixGroup {
                tokens,
                opens_session,
                ..
            } => {
                if *opens_session {
                    all
                } else {
                    (*tokens).min(all)
                }
            }
            Head::HashIds { block_tokens, ids } => {
                let covered = (ids.len() as u64).saturating_mul(*block_tokens as u64);
                covered.min(all as u64) as u32
            }
            Head::Continues(_) => all,
        }
    }

    /// The recipe's bytes for the workload hash: what its ids depend on. A continued row is
    /// named by its parent's key and length (the parent is a request of the same list, hashed
    /// there), so a long session hashes in linear time.
    pub(super) fn hash_into(&self, h: &mut blake3::Hasher) {
        h.update(b"recipe-v1");
        h.update(&self.seed.to_le_bytes());
        h.update(&self.key.to_le_bytes());
        h.update(&self.len_tokens.to_le_bytes());
        h.update(&self.vocab.to_le_bytes());
        match &self.head {
            Head::Fresh { opens_session } => {
                h.update(&[0, *opens_session as u8]);
            }
            Head::PrefixGroup {
                group,
                tokens,
                opens_session,
            } => {
                h.update(&[1, *opens_session as u8]);
                h.update(&group.to_le_bytes()).update(&tokens.to_le_bytes());
            }
            Head::HashIds { block_tokens, ids } => {
                h.update(&[2]).update(&block_tokens.to_le_bytes());
                h.update(&(ids.len() as u64).to_le_bytes());
                for id in ids.iter() {
                    h.update(&id.to_le_bytes());
                }
            }
            Head::Continues(c) => {
                let prev_key = self.key.wrapping_sub(u64::from(c.prev_back));
                h.update(&[3]).update(&prev_key.to_le_bytes());
                h.update(&c.prev_len_tokens.to_le_bytes());
            }
        }
    }
}

impl Drop for Recipe {
    /// Unlink a session chain iteratively: dropping the last reference to a long chain would
    /// otherwise recurse once per row.
    fn drop(&mut self) {
        let mut next = std::mem::replace(
            &mut self.head,
            Head::Fresh {
                opens_session: false,
            },
        );
        while let Head::Continues(c) = next {
            match Arc::try_unwrap(c.from) {
                Ok(mut inner) => {
                    next = std::mem::replace(
                        &mut inner.head,
                        Head::Fresh {
                            opens_session: false,
                        },
                    );
                }
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(key: u64, len: u32, head: Head) -> Recipe {
        Recipe {
            seed: 7,
            key,
            len_tokens: len,
            vocab: 1000,
            head,
        }
    }

    #[test]
    fn descriptors_stay_small() {
        // What a trace request costs besides its hash ids: the request and its inline recipe.
        assert!(
            std::mem::size_of::<Recipe>() <= 48,
            "{}",
            std::mem::size_of::<Recipe>()
        );
        assert!(
            std::mem::size_of::<Prompt>() <= 48,
            "{}",
            std::mem::size_of::<Prompt>()
        );
        let r = Prompt::Recipe(recipe(
            1,
            40_000,
            Head::Fresh {
                opens_session: false,
            },
        ));
        assert_eq!(r.heap_bytes(), 0);
        assert_eq!(r.len_tokens(), 40_000);
        assert_eq!(r.tokens().len(), 40_000);
    }

    #[test]
    fn hash_id_recipes_follow_their_ids() {
        let ids = |v: &[u64]| Head::HashIds {
            block_tokens: 16,
            ids: v.to_vec().into_boxed_slice(),
        };
        let a = recipe(0, 40, ids(&[1, 2, 3])).tokens();
        let b = recipe(1, 40, ids(&[1, 2, 4])).tokens();
        assert_eq!(a.len(), 40);
        assert_eq!(a[..32], b[..32]);
        assert_ne!(a[32..], b[32..]);
        assert_eq!(a[..16], hash_block_tokens(7, 1, 16, 1000)[..]);
        assert_eq!(a[32..], hash_block_tokens(7, 3, 8, 1000)[..]);
        // Past the last id: the row's own fresh ids.
        let c = recipe(2, 50, ids(&[1])).tokens();
        let d = recipe(3, 50, ids(&[1])).tokens();
        assert_eq!(c[..16], d[..16]);
        assert_ne!(c[16..], d[16..]);
    }

    #[test]
    fn prefix_group_recipes_start_with_the_synthetic_group_ids() {
        let head = |opens_session| Head::PrefixGroup {
            group: 3,
            tokens: 24,
            opens_session,
        };
        let a = recipe(0, 40, head(false)).tokens();
        let b = recipe(1, 40, head(true)).tokens();
        // The same ids a synthetic shared prefix of group 3 uses; fresh ids after them.
        assert_eq!(a[..24], crate::workload::prefix_tokens(7, 3, 24, 1000)[..]);
        assert_eq!(a[..24], b[..24]);
        assert_ne!(a[24..], b[24..]);
        // Shorter than the group prefix: its first ids.
        assert_eq!(recipe(2, 10, head(false)).tokens()[..], a[..10]);
        let (p, q) = (
            Prompt::Recipe(recipe(0, 40, head(false))),
            Prompt::Recipe(recipe(1, 40, head(true))),
        );
        assert_eq!((p.content_tokens(), q.content_tokens()), (24, 40));
    }

    #[test]
    fn session_chains_continue_their_parent_and_drop_without_recursion() {
        let root = recipe(
            0,
            30,
            Head::Fresh {
                opens_session: true,
            },
        );
        let root_t = root.tokens();
        let cont = |r: &Recipe| {
            Head::Continues(Continuation {
                from: Arc::new(r.clone()),
                prev_back: 1,
                prev_len_tokens: r.len_tokens,
            })
        };
        let mid = recipe(1, 20, cont(&root));
        let mid_t = mid.tokens();
        assert_eq!(mid_t[..], root_t[..20]);
        let leaf = recipe(2, 45, cont(&mid));
        let leaf_t = leaf.tokens();
        assert_eq!(leaf_t[..20], mid_t[..]);
        // Its own ids start where its parent ends.
        let own = recipe(
            2,
            25,
            Head::Fresh {
                opens_session: false,
            },
        )
        .tokens();
        assert_eq!(leaf_t[20..], own[..]);
        // A chain of 200,000 rows drops (and materializes) without deep recursion.
        let mut p = Arc::new(recipe(
            0,
            4,
            Head::Fresh {
                opens_session: true,
            },
        ));
        for k in 1..200_000 {
            p = Arc::new(recipe(
                k,
                4,
                Head::Continues(Continuation {
                    from: p,
                    prev_back: 1,
                    prev_len_tokens: 4,
                }),
            ));
        }
        assert_eq!(
            p.tokens()[..],
            recipe(
                0,
                4,
                Head::Fresh {
                    opens_session: true
                }
            )
            .tokens()[..]
        );
        drop(p);
    }
}

//! The tenant side channel: how well a probing tenant tells a prefix-cache hit from a miss by the
//! only thing it sees, its own time to first token.

pub mod auc;
pub mod noise;
pub mod probe;
pub mod write;

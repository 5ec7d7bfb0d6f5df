//! The simple alternative kvbench keeps honest: a contiguous KV cache (one reserved region per
//! sequence, first-fit, no sharing) and attention over it, structured like the paged kernels so
//! the two differ only in address translation.

pub mod attention;
pub mod manager;

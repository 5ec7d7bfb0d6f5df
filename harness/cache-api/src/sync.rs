//! Synchronisation primitives, switched to loom's under `cfg(loom)` so the fence protocol can be
//! model-checked (`RUSTFLAGS="--cfg loom" cargo test -p kvbench-cache-api --release loom`).

#[cfg(loom)]
pub use loom::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex,
};

#[cfg(not(loom))]
pub use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex,
};

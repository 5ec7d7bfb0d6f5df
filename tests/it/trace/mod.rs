//! Trace replay: formats, errors, hostile traces, eviction bounds and sessions.

mod errors;
mod eviction;
mod hostile;
mod replay;
mod sessions_linear;

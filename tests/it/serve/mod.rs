//! `kvbench serve` for real: the built binary on 127.0.0.1 (a free port), driven over HTTP by a
//! small std-only client (`client.rs`), stopped with SIGTERM; and the engine's live path fed by
//! a scripted source (`live.rs`).

mod client;
mod endpoint;
mod http;
mod live;

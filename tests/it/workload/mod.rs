//! The workload generator and multi-turn sessions.

mod props;
mod sessions_conversation;

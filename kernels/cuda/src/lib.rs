//! CUDA kernels for kvbench: decode and chunked-prefill attention over the paged cache and the
//! contiguous baseline, KV writes by slot mapping, slot copies and swaps, written in CUDA C and
//! compiled at run time by NVRTC through cudarc. No CUDA library is linked at build time; where
//! one is missing, callers get an error value naming it ([`libs`]).
//!
//! **Layouts** are the CPU backend's: per layer K and V are `[num_slots, kv_heads, head_dim]`
//! (NHD) and a paged slot is block × block_size + offset, so one slot index addresses the same
//! bytes on both backends.
//!
//! **Architecture invariant:** like `kvbench-kernels`, this crate knows nothing of cache
//! managers, scenarios or the harness; it takes plain block tables, base slots and lengths.
//!
//! **Invariants:** no CUDA failure panics into the caller — cudarc's panics are caught where
//! they can happen ([`libs::guarded`]) and every index and copy range is checked on the host
//! first ([`launch`], `model/batch.rs`, the emulated device's copies). Everything above
//! [`runtime`] is written once and runs on the GPU and on the emulated device alike; the host
//! reads pinned memory only after an event recorded after the copies into it, and frees pinned
//! memory only once no queued copy uses it.

pub mod libs;
pub mod nvrtc;
pub mod nvrtc_cache;
pub mod source;

pub use libs::{CudaLib, LibError};
pub use source::{KvDtype, ProgramId};
pub mod device;
pub mod emu;
pub mod error;
pub mod launch;
pub mod runtime;

pub use error::CudaError;
pub mod bench;
pub mod check;
pub mod model;
/// The cudarc this crate is built on (the harness records events on the same stream).
pub use cudarc;
pub mod probe;
pub mod reference;
pub mod rng;

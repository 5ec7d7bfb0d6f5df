//! The emulated CUDA device (`--backend cuda-emu`): the real kernels built for the host.
//!
//! It exists to run the `cuda` backend's host code — the same `model`, the same fences, swaps
//! and ledger — on any machine, with device memory that is checked ([`memory`]) and a stream
//! that is asynchronous for real ([`stream`]). What it cannot tell: real timings (its event
//! times are the CPU's), real driver behaviour beyond the semantics emulated here, and the
//! numerics of the device's math libraries (its GEMM is a plain f32 loop, not cuBLAS).
pub mod blas;
pub mod device;
pub mod kernels;
pub mod memory;
pub mod stream;

pub use device::{EmuConfig, EmuDevice};

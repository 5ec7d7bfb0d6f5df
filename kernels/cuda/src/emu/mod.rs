//! The emulated CUDA device (`--backend cuda-emu`): the real kernels built for the host.
pub mod kernels;

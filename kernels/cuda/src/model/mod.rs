//! The seeded decoder-only transformer on the GPU, for the harness's `cuda` scenario backend:
//! the same computation as `kvbench-kernels`' CPU model (embedding, RMSNorm, Q/K/V with GQA,
//! NeoX RoPE, attention over the cache, output projection, SiLU-gated MLP, final norm,
//! vocabulary projection, greedy argmax) with GEMMs through cuBLAS and the attention kernels of
//! this crate over the cache manager's layouts.
//!
//! Host-side rules are pure functions with tests that need no GPU: [`batch`] packs a step's
//! sequences into kernel arguments, [`sizes`] plans weight uploads and workspace. [`blas`] and
//! [`forward`] touch the device.
//!
//! **Batch invariance.** The paged and contiguous runs schedule different batches, yet their
//! greedy token streams must be identical, so a token's logits may not depend on which other
//! tokens share its step. Element-wise kernels and attention are per row by construction;
//! cuBLAS picks its algorithm (and split-K) from the problem shape, so every GEMM is issued in
//! fixed tiles of [`sizes::ROW_TILE`] rows: each call has the same shape whatever the batch.
//! Attention uses fixed 512-token partitions (not planned from the batch), and its kernel sums
//! token groups in a fixed order, so a row's output depends on its own data only, bit for bit.

pub mod batch;
pub mod blas;
pub mod forward;
pub(crate) mod ops;
pub mod sizes;

/// The model's shape and constants (plain data: the harness builds it from its own shape type).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelDims {
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub d_model: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    pub norm_eps: f32,
}

impl ModelDims {
    pub fn q_dim(&self) -> usize {
        self.q_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    pub fn attn_shape(&self) -> crate::launch::AttnShape {
        crate::launch::AttnShape {
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
}

/// How the weight matrices are stored on the device. Embeddings and norm gains stay f32; the
/// projections are f32 (`cublasGemmEx` with 32F compute, no TF32) or bf16 with f32 accumulation
/// (activations rounded to bf16 on the way in, f32 out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    F32,
    Bf16,
}

impl WeightDtype {
    pub fn bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
        }
    }
}

/// One layer's weights on the host, row-major `[in, out]` (the product is `x · W`), as
/// `kvbench-kernels` draws them.
#[derive(Debug, Clone, Copy)]
pub struct HostLayer<'a> {
    pub attn_norm: &'a [f32],
    pub wq: &'a [f32],
    pub wk: &'a [f32],
    pub wv: &'a [f32],
    pub wo: &'a [f32],
    pub mlp_norm: &'a [f32],
    pub w_gate: &'a [f32],
    pub w_up: &'a [f32],
    pub w_down: &'a [f32],
}

/// The whole model's weights on the host.
#[derive(Debug, Clone)]
pub struct HostWeights<'a> {
    /// `[vocab, d_model]`
    pub embed: &'a [f32],
    pub layers: Vec<HostLayer<'a>>,
    pub final_norm: &'a [f32],
    /// `[d_model, vocab]`
    pub lm_head: &'a [f32],
}

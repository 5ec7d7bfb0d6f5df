//! CPU compute for kvbench: attention that reads K/V through a block table, KV writes by slot
//! mapping, and a tiny decoder-only transformer with seeded weights that runs over them.
//!
//! **Architecture invariant:** this crate knows nothing of cache managers, scenarios or the
//! harness. It takes plain configs and an address translation ([`TokenAddressing`]); the paged
//! layout lives here, the contiguous one in `kvbench-baselines`, and both feed the same attention
//! core. KV layout: see [`kv`].

pub mod addressing;
pub mod attention;
pub mod attention_mla;
pub mod elem;
pub mod error;
pub mod fp8;
pub mod gemm;
pub mod kv;
pub mod kv_buf;
pub mod kv_quant;
pub mod model;

pub use addressing::{PagedTable, Run, TokenAddressing};
pub use attention::{attention, attention_windowed, AttnDims, QuerySpan};
pub use elem::KvElem;
pub use error::KernelError;
pub use fp8::Fp8Format;
pub use kv::{write_kv, KvCache, LayerKv};
pub use kv_buf::KvBuf;
pub use kv_quant::{KvQuant, ScaleGranularity};
pub use model::{
    rank_token, LayerKind, MlaWeights, ModelConfig, ModelWeights, RecurrentWeights, StepSeq,
    Transformer,
};

/// bf16 storage element, re-exported so callers need not depend on `half`.
pub use half::bf16;

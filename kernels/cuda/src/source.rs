//! The CUDA C programs (`kernels/cuda/cu/*.cu`, compiled at run time by NVRTC) and the names of
//! the kernels each defines. Every program is `common.cuh` followed by its own text; the
//! attention programs also carry `attention.cu`, whose macros instantiate one kernel per
//! (layout, head dim, group size).

/// Head dims the attention kernels are instantiated for (tiny model 32, Llama-3 64/128).
pub const HEAD_DIMS: [usize; 3] = [32, 64, 128];
/// Query heads per KV head (1 = MHA; Llama-3-8B 4, 70B 8).
pub const GROUPS: [usize; 4] = [1, 2, 4, 8];

const COMMON: &str = include_str!("../cu/common.cuh");
const ATTENTION: &str = include_str!("../cu/attention.cu");

/// KV storage element type on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    Bf16,
}

impl KvDtype {
    pub const ALL: [KvDtype; 2] = [KvDtype::F32, KvDtype::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
        }
    }

    pub fn parse(s: &str) -> Option<KvDtype> {
        Self::ALL.into_iter().find(|d| d.name() == s)
    }
}

/// One NVRTC compilation unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProgramId {
    KvOps,
    Attention(KvDtype),
    /// The transformer's element-wise kernels (the `cuda` scenario backend).
    ModelOps,
}

impl ProgramId {
    pub const ALL: [ProgramId; 4] = [
        ProgramId::KvOps,
        ProgramId::Attention(KvDtype::F32),
        ProgramId::Attention(KvDtype::Bf16),
        ProgramId::ModelOps,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ProgramId::KvOps => "kv_ops",
            ProgramId::Attention(KvDtype::F32) => "attention_f32",
            ProgramId::Attention(KvDtype::Bf16) => "attention_bf16",
            ProgramId::ModelOps => "model_ops",
        }
    }

    /// The full source NVRTC compiles.
    pub fn source(self) -> String {
        match self {
            ProgramId::KvOps => [COMMON, include_str!("../cu/kv_ops.cu")].concat(),
            ProgramId::Attention(KvDtype::F32) => {
                [COMMON, ATTENTION, include_str!("../cu/attention_f32.cu")].concat()
            }
            ProgramId::Attention(KvDtype::Bf16) => {
                [COMMON, ATTENTION, include_str!("../cu/attention_bf16.cu")].concat()
            }
            ProgramId::ModelOps => [COMMON, include_str!("../cu/model_ops.cu")].concat(),
        }
    }

    /// Every kernel the program defines (`extern "C"` names).
    pub fn kernels(self) -> Vec<String> {
        match self {
            ProgramId::KvOps => [
                "kv_write_f32",
                "kv_write_bf16",
                "copy_slots",
                "attn_merge",
                "fill_words",
                "read_ceiling",
            ]
            .map(String::from)
            .to_vec(),
            ProgramId::ModelOps => MODEL_OPS_KERNELS.map(String::from).to_vec(),
            ProgramId::Attention(dtype) => {
                let mut v = Vec::new();
                for paged in [true, false] {
                    for d in HEAD_DIMS {
                        for g in GROUPS {
                            v.push(attn_kernel_name(paged, dtype, d, g));
                        }
                    }
                }
                v
            }
        }
    }
}

/// The kernels of `model_ops.cu`.
pub const MODEL_OPS_KERNELS: [&str; 8] = [
    "embed_rows",
    "rms_norm",
    "rms_norm_gather",
    "rope",
    "silu_mul",
    "add_in_place",
    "to_bf16",
    "argmax_rows",
];

/// The attention kernel for one layout, storage type, head dim and group size.
pub fn attn_kernel_name(paged: bool, dtype: KvDtype, head_dim: usize, group: usize) -> String {
    format!(
        "attn_{}_{}_d{head_dim}_g{group}",
        if paged { "paged" } else { "contig" },
        dtype.name()
    )
}

/// The KV write kernel for a storage type.
pub fn kv_write_kernel_name(dtype: KvDtype) -> &'static str {
    match dtype {
        KvDtype::F32 => "kv_write_f32",
        KvDtype::Bf16 => "kv_write_bf16",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_defined_by_its_program_text() {
        // The attention names come from macros: check the pieces they paste are there.
        for p in ProgramId::ALL {
            let src = p.source();
            assert!(
                src.contains("Vec16"),
                "{} lacks the common header",
                p.name()
            );
            for k in p.kernels() {
                if k.starts_with("attn_paged_") || k.starts_with("attn_contig_") {
                    let dtype = k.split('_').nth(2).expect("dtype");
                    assert!(
                        src.contains(&format!(", {dtype})\n")),
                        "{k} in {}",
                        p.name()
                    );
                } else {
                    assert!(src.contains(&format!("void {k}(")), "{k} in {}", p.name());
                }
            }
        }
    }
}

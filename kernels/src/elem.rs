//! Element types a KV cache can be stored in. Arithmetic is always f32; storage may be bf16 to
//! halve the bytes a decode step has to stream.

/// A KV storage element: converted to f32 on every read and rounded on every write.
pub trait KvElem: Copy + Send + Sync + Default + std::fmt::Debug + 'static {
    const NAME: &'static str;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    /// How the bits are stored, for hand-vectorized loads ([`Storage::Other`]: portable code
    /// only).
    const STORAGE: Storage = Storage::Other;
}

/// Storage formats the hand-vectorized kernels can load eight at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    F32,
    /// The top 16 bits of an f32.
    Bf16,
    Other,
}

impl KvElem for f32 {
    const NAME: &'static str = "f32";
    const STORAGE: Storage = Storage::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl KvElem for half::bf16 {
    const NAME: &'static str = "bf16";
    const STORAGE: Storage = Storage::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // bf16 is the top half of an f32: a shift, which vectorizes (half's own conversion may
        // take a runtime-dispatched path per element).
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        // Round to nearest even, as hardware does on store.
        half::bf16::from_f32(x)
    }
}

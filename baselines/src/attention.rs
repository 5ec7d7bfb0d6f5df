//! Contiguous attention (in progress).

//! Contiguous cache manager (in progress).

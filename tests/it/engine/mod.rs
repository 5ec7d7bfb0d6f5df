//! The engine on hand-built request lists: lifecycle, admission, cancellation, duration and the
//! backend seam.

mod admission_reserve;
mod backend_seam;
mod cancel;
mod duration;
mod lifecycle;

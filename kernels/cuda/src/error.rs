//! The crate's one error type: every failure is a value naming what is missing or wrong.

use crate::libs::LibError;
use crate::nvrtc::CompileError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(transparent)]
    Lib(#[from] LibError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The driver loaded but has no usable device (no GPU, driver/library mismatch...).
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    /// A driver call failed on a device that was working.
    #[error("CUDA {call}: {message}")]
    Driver { call: &'static str, message: String },
    /// A shape, layout or index the kernels do not take.
    #[error("{0}")]
    Shape(String),
}

impl CudaError {
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |e| CudaError::Driver {
            call,
            message: format!("{e:?}"),
        }
    }
}

//! `kvbench calibrate`: the fit and the profile validation, and the command end to end.

mod cli;
mod fit;

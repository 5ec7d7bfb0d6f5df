//! `kvbench isolation` end to end on `sim`, with and without a host tier.

mod cli;
mod tier;

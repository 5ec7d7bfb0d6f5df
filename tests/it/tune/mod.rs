//! `kvbench tune`: the search against synthetic evaluators, and the command end to end.

mod cli;
mod search;
mod seeds;

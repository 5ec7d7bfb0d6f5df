//! `kvbench plan`: the essay's calculator. (in progress)

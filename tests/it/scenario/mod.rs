//! Scenario files: loading, `validate` and `scenario show`, and every shipped scenario mutated
//! as hostile input.

mod cli;
mod hostile_input;
mod load;

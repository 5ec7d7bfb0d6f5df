//! What catches a wrong cache: the shadow payload on `sim`, the oracle on `cpu`, the invariant
//! checks, and the planted faults each must catch.

mod cpu_checks;
mod faults_sim;
mod run_checks;
mod shadow_grouped;
mod shadow_settled;
mod shadow_table_version;

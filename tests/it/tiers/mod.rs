//! Lower tiers (host and disk): the tiered manager, real K/V moves on `cpu`, the shadow through
//! the tiers, `sim`'s transfer cost, and the tiers in a run's files, suites and sweeps.

mod cpu;
mod manager;
mod results;
mod runs;
mod shadow;
mod shadow_run;
mod sim_cost;
mod sim_scenario;
mod suite_capacities;
mod sweep_capacities;

//! The history checker (DESIGN §9, Jepsen's way): a seeded, bounded workload of concurrent
//! clients through the real `idemgate` binary against a fault-injecting fake downstream, every
//! answer and every effect recorded in a history file, and a checker that reads the history
//! afterwards. Test support only (`publish = false`); docs/history.md is the manual.

pub mod check;
pub mod fake;
pub mod history;
pub mod mutate;
pub mod run;

//! idemgate's deterministic simulator.
//!
//! (Tour written once the pieces are wired; see the modules.)

pub mod authorizer;
pub mod checker;
pub mod choices;
pub mod downstream;
pub mod history;
pub mod runtime;
pub mod store;

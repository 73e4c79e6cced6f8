//! A tool's contract, from the decorator's arguments or from a contract file: the in-process
//! faces' one reader (`idemgate_app::in_process`), in Python's words.

use idemgate_app::in_process::{self, PYTHON};
pub use idemgate_app::in_process::{Finding, Refused};
use idemgate_core::contract::Contract;
use serde_json::Value;

/// The contract the decorator's arguments describe.
pub fn from_arguments(name: &str, spec: &Value) -> Result<Contract, Refused> {
    in_process::from_arguments(&PYTHON, name, spec)
}

/// A contract file, read as the gateway reads it, with the linter's findings.
pub fn from_file(path: &str) -> Result<(Contract, Vec<Finding>), String> {
    in_process::from_file(&PYTHON, path)
}

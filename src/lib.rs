//! cuflow: compose GPU work as lazy DAGs and run it fast and safely.
pub use cuflow_runtime as runtime;

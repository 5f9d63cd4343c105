//! cuflow's lazy device ops, combinators and execution.

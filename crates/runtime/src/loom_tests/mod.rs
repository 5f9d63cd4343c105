//! loom models of the runtime's concurrency core, the access tracker (see [`crate::sync`]).
//!
//! Built only with `--cfg loom`, where the core's primitives are loom's:
//! `RUSTFLAGS="--cfg loom" cargo test --release -p cuflow-runtime --lib loom_tests`.
//! Each model is explored exhaustively, within a second; `LOOM_MAX_PREEMPTIONS=N` bounds the
//! preemptions per interleaving, for a quicker run while a model grows.

mod access;

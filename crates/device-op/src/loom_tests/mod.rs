//! loom models of the crate's concurrency cores: the completion handoff behind `.await` and
//! the run-once state machine of `shared` (see `cuflow_runtime::sync`).
//!
//! Built only with `--cfg loom`, where the cores' primitives are loom's:
//! `RUSTFLAGS="--cfg loom" cargo test --release -p cuflow-device-op --lib loom_tests`.
//! Each model is explored exhaustively, within seconds; `LOOM_MAX_PREEMPTIONS=N` bounds the
//! preemptions per interleaving, for a quicker run while a model grows.

mod completion;
mod shared;

//! cuflow's record-and-replay: capture an op into a CUDA graph and replay it.

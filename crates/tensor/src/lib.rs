//! cuflow's tensors, constructors and kernels.

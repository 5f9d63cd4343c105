//! cuflow's scheduling policies: which stream each part of an op runs on.

//! The two backends. Each lives in its own folder and is reached only through the
//! backend-neutral types of the runtime (`Device`, `Stream`, `Event`, `DeviceBuffer`, `Kernel`,
//! `Graph`), which dispatch on an enum; nothing above the runtime sees a backend.

pub(crate) mod cuda;
pub(crate) mod host;

//! Host memory: a word vector (8-byte aligned, so every element type aligned to at most 8
//! bytes can be viewed in place; the runtime refuses views of more-aligned types) behind a
//! reader-writer lock.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{DeviceError, Result};
use crate::memory::Memory;

fn words_for(bytes: usize) -> usize {
    bytes.div_ceil(8)
}

fn try_zeroed_words(bytes: usize, device: &str) -> Result<Vec<u64>> {
    let words = words_for(bytes);
    let mut v: Vec<u64> = Vec::new();
    v.try_reserve_exact(words)
        .map_err(|_| DeviceError::OutOfMemory {
            bytes,
            device: device.to_string(),
        })?;
    v.resize(words, 0);
    Ok(v)
}

pub(crate) struct HostMemory {
    data: RwLock<Vec<u64>>,
}

impl HostMemory {
    pub(crate) fn alloc(bytes: usize, device: &str) -> Result<HostMemory> {
        Ok(HostMemory {
            data: RwLock::new(try_zeroed_words(bytes, device)?),
        })
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Vec<u64>> {
        self.data.read_recursive()
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Vec<u64>> {
        self.data.write()
    }
}

/// The host storage of `mem`, for a stream of the host backend.
pub(crate) fn host_mem(mem: &Memory) -> Result<&HostMemory> {
    mem.backend.host().ok_or_else(|| {
        DeviceError::internal("a buffer of another backend reached the host backend")
    })
}

/// Host-backend "pinned" memory: ordinary memory shared with the stream worker. Its words
/// never move while it lives (nothing resizes the vector), so a view checked once stays valid.
pub(crate) struct HostPinned {
    data: Arc<Mutex<Vec<u64>>>,
}

impl HostPinned {
    pub(crate) fn new(bytes: usize) -> Result<HostPinned> {
        Ok(HostPinned {
            data: Arc::new(Mutex::new(try_zeroed_words(bytes, "host (pinned)")?)),
        })
    }

    pub(crate) fn shared(&self) -> Arc<Mutex<Vec<u64>>> {
        self.data.clone()
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Vec<u64>> {
        self.data.lock()
    }
}

//! [`LaunchConfig`]: the grid, block and dynamic shared memory of a launch, and its check
//! against a device's limits.

use crate::device::DeviceLimits;
use crate::error::{DeviceError, Result};

/// Grid and block dimensions and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LaunchConfig {
    /// Blocks along x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block along x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A launch of `grid` blocks of `block` threads (each along x, y, z), without dynamic
    /// shared memory (add it with [`with_shared_mem`](Self::with_shared_mem)).
    #[must_use]
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> Self {
        LaunchConfig {
            grid,
            block,
            shared_mem_bytes: 0,
        }
    }

    /// A one-dimensional launch of `grid` blocks of `block` threads.
    #[must_use]
    pub fn linear(grid: u32, block: u32) -> Self {
        LaunchConfig {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Enough 256-thread blocks to give every one of `n` elements a thread (at least one block).
    #[must_use]
    pub fn for_num_elems(n: usize) -> Self {
        let blocks = n.div_ceil(256).clamp(1, i32::MAX as usize) as u32;
        Self::linear(blocks, 256)
    }

    /// The same launch with `bytes` of dynamic shared memory.
    #[must_use]
    pub fn with_shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem_bytes = bytes;
        self
    }

    /// Total threads per block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.0 as u64 * self.block.1 as u64 * self.block.2 as u64
    }

    /// Total blocks.
    pub fn block_count(&self) -> u64 {
        self.grid.0 as u64 * self.grid.1 as u64 * self.grid.2 as u64
    }

    /// Checks the configuration against `limits`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidLaunch`] naming the limit that is exceeded.
    pub fn validate(&self, kernel: &str, limits: &DeviceLimits) -> Result<()> {
        if self.fits(limits) {
            return Ok(());
        }
        self.refusal(kernel, limits)
    }

    /// Whether the configuration is within `limits`: the checks of [`Self::validate`] as one
    /// branch-free expression, for the launch path.
    #[inline]
    fn fits(&self, limits: &DeviceLimits) -> bool {
        let (g, b) = (self.grid, self.block);
        let at_least_one =
            (g.0 != 0) & (g.1 != 0) & (g.2 != 0) & (b.0 != 0) & (b.1 != 0) & (b.2 != 0);
        let [bx, by, bz] = limits.max_block_dim;
        let [gx, gy, gz] = limits.max_grid_dim;
        let within =
            (b.0 <= bx) & (b.1 <= by) & (b.2 <= bz) & (g.0 <= gx) & (g.1 <= gy) & (g.2 <= gz);
        at_least_one
            & within
            & (self.threads_per_block() <= u64::from(limits.max_threads_per_block))
            & (self.shared_mem_bytes <= limits.max_shared_mem_per_block_optin)
    }

    /// The error of a configuration outside `limits`, naming the first limit it exceeds.
    #[cold]
    #[inline(never)]
    fn refusal(&self, kernel: &str, limits: &DeviceLimits) -> Result<()> {
        let bad = |reason: String| {
            Err(DeviceError::InvalidLaunch {
                kernel: kernel.to_string(),
                reason,
            })
        };
        let g = [self.grid.0, self.grid.1, self.grid.2];
        let b = [self.block.0, self.block.1, self.block.2];
        if g.contains(&0) || b.contains(&0) {
            return bad(format!(
                "grid {:?} and block {:?} must be at least 1 in every dimension",
                self.grid, self.block
            ));
        }
        for (axis, name) in ["x", "y", "z"].iter().enumerate() {
            if b[axis] > limits.max_block_dim[axis] {
                return bad(format!(
                    "block.{name} = {} exceeds the device's limit of {}",
                    b[axis], limits.max_block_dim[axis]
                ));
            }
            if g[axis] > limits.max_grid_dim[axis] {
                return bad(format!(
                    "grid.{name} = {} exceeds the device's limit of {}",
                    g[axis], limits.max_grid_dim[axis]
                ));
            }
        }
        if self.threads_per_block() > limits.max_threads_per_block as u64 {
            return bad(format!(
                "{} threads per block exceed the device's limit of {}",
                self.threads_per_block(),
                limits.max_threads_per_block
            ));
        }
        if self.shared_mem_bytes > limits.max_shared_mem_per_block_optin {
            return bad(format!(
                "{} bytes of shared memory exceed the device's limit of {}",
                self.shared_mem_bytes, limits.max_shared_mem_per_block_optin
            ));
        }
        Ok(())
    }
}

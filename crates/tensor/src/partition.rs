//! Partitions: an output tensor split into equal tiles, one block of the launch each.

use std::fmt;

use cuflow_runtime::DeviceError;

use crate::dtype::DType;
use smallvec::SmallVec;

use crate::tensor::{Shape, Tensor};

/// An output tensor split into equal tiles: `tile` is the shape of one tile, which must
/// divide the tensor's shape axis by axis. Each tile is one block of the launch, so the
/// partition sets the launch decomposition.
///
/// Built with [`PartitionExt::partition`] on a `Tensor<T>` (owned; the kernel gives it back)
/// or a `&mut Tensor<T>` (the kernel writes in place).
pub struct Partition<P> {
    inner: P,
    tile: Shape,
}

impl<P> Partition<P> {
    /// The shape of one tile.
    pub fn tile(&self) -> &[usize] {
        &self.tile
    }

    /// The partitioned tensor (or borrow) back.
    pub fn unpartition(self) -> P {
        self.inner
    }

    /// The partitioned value.
    pub fn get(&self) -> &P {
        &self.inner
    }
}

impl<P: fmt::Debug> fmt::Debug for Partition<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partition")
            .field("tile", &self.tile)
            .field("tensor", &self.inner)
            .finish()
    }
}

/// `.partition([..])` on `Tensor<T>` and `&mut Tensor<T>`.
pub trait PartitionExt: Sized {
    /// Splits the tensor into tiles of shape `tile` (checked when the kernel runs).
    fn partition<const N: usize>(self, tile: [usize; N]) -> Partition<Self>;
}

impl<T: DType> PartitionExt for Tensor<T> {
    fn partition<const N: usize>(self, tile: [usize; N]) -> Partition<Self> {
        Partition {
            inner: self,
            tile: SmallVec::from_slice(&tile),
        }
    }
}

impl<T: DType> PartitionExt for &mut Tensor<T> {
    fn partition<const N: usize>(self, tile: [usize; N]) -> Partition<Self> {
        Partition {
            inner: self,
            tile: SmallVec::from_slice(&tile),
        }
    }
}

/// The launch decomposition a partition describes, over the tensor flattened to
/// `rows × cols` (cols = the last axis): tiles of `tile_rows × tile_cols`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tiling {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) tile_rows: usize,
    pub(crate) tile_cols: usize,
}

impl Tiling {
    pub(crate) fn tiles(&self) -> usize {
        if self.tile_rows == 0 || self.tile_cols == 0 {
            0
        } else {
            (self.rows / self.tile_rows) * (self.cols / self.tile_cols)
        }
    }
}

/// Checks that `tile` divides `shape` and returns the tiling. Tiles may split the first and
/// the last axis freely; axes in between are taken whole.
pub(crate) fn tiling(
    op: &'static str,
    shape: &[usize],
    tile: &[usize],
) -> Result<Tiling, DeviceError> {
    let bad = |reason: String| DeviceError::InvalidPartition { op, reason };
    if tile.len() != shape.len() {
        return Err(bad(format!(
            "the tile {tile:?} has {} axes but the tensor {shape:?} has {}",
            tile.len(),
            shape.len()
        )));
    }
    for (axis, (t, s)) in tile.iter().zip(shape).enumerate() {
        if *t == 0 {
            let hint = if *s == 0 {
                format!("an empty tensor {shape:?} takes tiles of length 1 along its empty axes")
            } else {
                format!("axis {axis} of {shape:?} holds {s}; give a length that divides it")
            };
            return Err(bad(format!(
                "the tile {tile:?} has length 0 along axis {axis}; every axis of a tile must \
                 hold at least one element ({hint})"
            )));
        }
        if s % t != 0 {
            return Err(bad(format!(
                "the tile {tile:?} does not divide the tensor {shape:?} along axis {axis} \
                 ({s} is not a multiple of {t})"
            )));
        }
    }
    let r = shape.len();
    if r == 0 {
        return Ok(Tiling {
            rows: 1,
            cols: 1,
            tile_rows: 1,
            tile_cols: 1,
        });
    }
    for axis in 1..r.saturating_sub(1) {
        if tile[axis] != shape[axis] {
            return Err(bad(format!(
                "the tile {tile:?} splits the middle axis {axis} of {shape:?}; only the first \
                 and the last axis may be split"
            )));
        }
    }
    let cols = shape[r - 1];
    let product = |dims: &[usize]| {
        dims.iter()
            .try_fold(1usize, |n, d| n.checked_mul(*d))
            .ok_or_else(|| bad(format!("the rows of {shape:?} overflow usize")))
    };
    let rows = product(&shape[..r - 1])?;
    let tile_cols = tile[r - 1];
    let tile_rows = if r == 1 { 1 } else { product(&tile[..r - 1])? };
    Ok(Tiling {
        rows,
        cols,
        tile_rows,
        tile_cols,
    })
}

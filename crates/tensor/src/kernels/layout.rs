//! Data movement: 2-D transpose and embedding gather.

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig};

use super::{alloc, TensorResult};
use crate::dtype::{cuda_prelude, DType};
use crate::op::{cached_kernel, kernel_op, kernel_op2, TensorOp};
use crate::tensor::TensorInput;

fn transpose_kernel<T: DType>() -> Kernel {
    cached_kernel("transpose", T::NAME, || {
        let fname = format!("transpose_{}", T::NAME);
        let source = format!(
            r#"{prelude}
typedef unsigned long long u64;
extern "C" __global__ void {fname}(T* out, const T* x, u64 rows, u64 cols) {{
  __shared__ T tile[32][33];
  u64 c0 = (u64)blockIdx.x * 32, r0 = (u64)blockIdx.y * 32;
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {{
    u64 r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = x[r * cols + c];
  }}
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {{
    u64 c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
  }}
}}
"#,
            prelude = cuda_prelude::<T>()
        );
        crate::op::builtin_kernel(fname, source).with_host(|args| {
            let x = args.input::<T>(1)?;
            let rows = args.scalar::<u64>(2)? as usize;
            let cols = args.scalar::<u64>(3)? as usize;
            let out = args.output::<T>(0)?;
            for r in 0..rows {
                for c in 0..cols {
                    out[c * rows + r] = x[r * cols + c];
                }
            }
            Ok(())
        })
    })
}

/// The transpose of a matrix: `[rows, cols] → [cols, rows]`, through 32 × 32 shared-memory
/// tiles on CUDA.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `transpose` for a tensor that is not 2-D.
pub fn transpose<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    kernel_op("transpose", x, move |stream, x| {
        let &[rows, cols] = x.shape() else {
            return Err(DeviceError::InvalidShape {
                op: "transpose",
                reason: format!("expects a matrix [rows, cols], got {:?}", x.shape()),
            });
        };
        // The kernel takes a block per 32 × 32 tile, the rows' tiles along the grid's second
        // dimension: a matrix taller than that dimension holds is copied from its transposed
        // view by the strided kernel, which loops over its tiles.
        let [grid_x, grid_y, _] = stream.device().limits().max_grid_dim;
        if rows.div_ceil(32) > grid_y as usize || cols.div_ceil(32) > grid_x as usize {
            return super::strided::gather("transpose", stream, &x.transpose(0, 1)?);
        }
        let out = alloc::<T>("transpose", stream, &[cols, rows])?;
        if rows > 0 && cols > 0 {
            let config = LaunchConfig::new(
                (cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1),
                (32, 8, 1),
            );
            transpose_kernel::<T>().launch(
                stream,
                config,
                KernelArgs::new()
                    .output(out.view("transpose")?)
                    .input(x.view("transpose")?)
                    .scalar(rows as u64)
                    .scalar(cols as u64),
            )?;
        }
        Ok(out)
    })
}

fn embedding_kernel<T: DType>() -> Kernel {
    cached_kernel("embedding", T::NAME, || {
        let fname = format!("embedding_{}", T::NAME);
        let source = format!(
            r#"{prelude}
typedef unsigned long long u64;
extern "C" __global__ void {fname}(T* out, const T* table, const unsigned* ids, u64 n, u64 vocab,
                                  u64 dim) {{
  for (u64 r = blockIdx.x; r < n; r += gridDim.x) {{
    unsigned id = ids[r];
    for (u64 c = threadIdx.x; c < dim; c += blockDim.x) {{
      out[r * dim + c] = id < vocab ? table[(u64)id * dim + c] : (T)0;
    }}
  }}
}}
"#,
            prelude = cuda_prelude::<T>()
        );
        crate::op::builtin_kernel(fname, source).with_host(|args| {
            let table = args.input::<T>(1)?;
            let ids = args.input::<u32>(2)?;
            let vocab = args.scalar::<u64>(4)? as usize;
            let dim = args.scalar::<u64>(5)? as usize;
            let out = args.output::<T>(0)?;
            for (row, id) in out.chunks_mut(dim.max(1)).zip(ids) {
                let id = *id as usize;
                if id < vocab {
                    row.copy_from_slice(&table[id * dim..(id + 1) * dim]);
                } else {
                    row.fill(T::default());
                }
            }
            Ok(())
        })
    })
}

/// Embedding gather: the rows of `table` (`[vocab, dim]`) named by `ids` (`u32`, any shape):
/// `ids.shape + [dim]`. An id outside the table gives a row of zeros on both backends (the
/// check happens on the device, so the op stays capturable into a graph).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `embedding` for a table that is not 2-D.
pub fn embedding<T: DType, W: TensorInput<T>, I: TensorInput<u32>>(
    table: W,
    ids: I,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    kernel_op2("embedding", (table, ids), move |stream, table, ids| {
        let &[vocab, dim] = table.shape() else {
            return Err(DeviceError::InvalidShape {
                op: "embedding",
                reason: format!("expects a table [vocab, dim], got {:?}", table.shape()),
            });
        };
        let mut shape = ids.shape().to_vec();
        shape.push(dim);
        let out = alloc::<T>("embedding", stream, &shape)?;
        let n = ids.len();
        if n > 0 && dim > 0 {
            let grid = n.clamp(1, 65_535) as u32;
            let block = dim.next_power_of_two().clamp(32, 256) as u32;
            embedding_kernel::<T>().launch(
                stream,
                LaunchConfig::linear(grid, block),
                KernelArgs::new()
                    .output(out.view("embedding")?)
                    .input(table.view("embedding")?)
                    .input(ids.view("embedding")?)
                    .scalar(n as u64)
                    .scalar(vocab as u64)
                    .scalar(dim as u64),
            )?;
        }
        Ok(out)
    })
}

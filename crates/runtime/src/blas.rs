//! Dense matrix multiplication (GEMM), enqueued on a stream like a kernel.
//!
//! [`gemm`] computes `C = alpha · op(A) · op(B) + beta · C` over dense row-major matrices, as
//! PyTorch's `addmm` does, optionally over a batch of matrices at fixed strides. It runs in
//! stream order: after the work enqueued before it on the stream, before the work enqueued after
//! it. It records the buffers it uses as a kernel launch does, so frees are ordered after it and
//! a capture keeps them alive; it never allocates on the stream it runs on, so it can be
//! captured into a graph.
//!
//! - **cuda**: cuBLAS (`cublasGemmEx` / `cublasGemmStridedBatchedEx`), loaded at run time; a
//!   missing library is [`DeviceError::NoBlas`]. f16 and bf16 accumulate in f32; f32 is computed
//!   in full f32 precision (TF32 is never enabled); f64 in f64. f16 and bf16 inputs may write an
//!   f32 output (mixed precision, [`GemmOutput`]): the f32 accumulation is stored unrounded.
//! - **host**: a blocked GEMM over CPU threads with the same accumulation types, rounding each
//!   result once.
//!
//! Semantics shared by both backends, as in BLAS: with `beta == 0`, `C` is not read (whatever it
//! holds, NaN included, is overwritten); with `k == 0`, `C` becomes `beta · C`; with `m`, `n` or
//! `batch` zero nothing is enqueued.

use std::sync::Arc;

use smallvec::smallvec;

use crate::access::{ordered_traced, Access, Accesses};
use crate::error::{DeviceError, Result};
use crate::memory::{BufferView, DeviceCopy, Memory};
use crate::stream::Stream;
use crate::trace::Work;

/// The element types [`gemm`] supports, as the backends name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GemmDtype {
    /// IEEE binary16 (`half::f16`), accumulated in f32.
    F16,
    /// bfloat16 (`half::bf16`), accumulated in f32.
    BF16,
    /// IEEE binary32, accumulated in f32.
    F32,
    /// IEEE binary64, accumulated in f64.
    F64,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// Element types [`gemm`] supports: `f32`, `f64`, `half::f16` and `half::bf16`. Sealed.
pub trait GemmElem: DeviceCopy + sealed::Sealed {
    /// The type's tag.
    const DTYPE: GemmDtype;
}

impl GemmElem for f32 {
    const DTYPE: GemmDtype = GemmDtype::F32;
}

impl GemmElem for f64 {
    const DTYPE: GemmDtype = GemmDtype::F64;
}

impl GemmElem for half::f16 {
    const DTYPE: GemmDtype = GemmDtype::F16;
}

impl GemmElem for half::bf16 {
    const DTYPE: GemmDtype = GemmDtype::BF16;
}

/// The output element types of a [`gemm`] over inputs of type `I`: `I` itself, and `f32` for
/// `f16` and `bf16` inputs (mixed precision: half inputs, accumulated in `f32`, stored in
/// `f32` without rounding to half). On CUDA, cuBLAS's `GemmEx` with `CUBLAS_COMPUTE_32F`.
pub trait GemmOutput<I: GemmElem>: GemmElem {}

impl<T: GemmElem> GemmOutput<T> for T {}
impl GemmOutput<half::f16> for f32 {}
impl GemmOutput<half::bf16> for f32 {}

/// The shape and scaling of a [`gemm`]: `C[m×n] = alpha · op(A)[m×k] · op(B)[k×n] + beta · C`
/// for each of `batch` matrix triples.
///
/// All matrices are dense and row-major. `A` is stored `m×k`, or `k×m` when `trans_a` (then
/// `op(A)` is its transpose); `B` is stored `k×n`, or `n×k` when `trans_b`; `C` is `m×n`.
/// Matrix `i` of a batch starts `i · stride_a` elements into `A` (likewise `B`, `C`); a stride of
/// 0 for `A` or `B` uses one matrix for the whole batch. `alpha` and `beta` are converted to
/// the accumulation type (f64 for f64 GEMMs, else f32).
///
/// # Examples
///
/// ```
/// use cuflow_runtime::{gemm, Device, DeviceBuffer, GemmConfig};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// // [1 2 3]   [1 0]   [ 4  5]
/// // [4 5 6] · [0 1] = [10 11]
/// //           [1 1]
/// let a = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
/// let b = DeviceBuffer::from_host(&stream, &[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0])?;
/// let c = DeviceBuffer::<f32>::alloc(&stream, 4)?;
/// gemm(&stream, GemmConfig::new(2, 2, 3), a.view(), b.view(), c.view())?;
/// assert_eq!(c.to_host_vec(&stream)?, vec![4.0, 5.0, 10.0, 11.0]);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct GemmConfig {
    /// Rows of `op(A)` and of `C`.
    pub m: usize,
    /// Columns of `op(B)` and of `C`.
    pub n: usize,
    /// Columns of `op(A)`, rows of `op(B)`: the length of the dot products.
    pub k: usize,
    /// `A` is stored `k×m` and used transposed.
    pub trans_a: bool,
    /// `B` is stored `n×k` and used transposed.
    pub trans_b: bool,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of `C`'s previous contents; 0 overwrites `C` without reading it.
    pub beta: f32,
    /// Number of matrix triples.
    pub batch: usize,
    /// Elements between consecutive `A` matrices of a batch (0: the same `A` for all).
    pub stride_a: usize,
    /// Elements between consecutive `B` matrices of a batch (0: the same `B` for all).
    pub stride_b: usize,
    /// Elements between consecutive `C` matrices of a batch (at least `m · n` when `batch > 1`).
    pub stride_c: usize,
}

impl GemmConfig {
    /// `C = A · B` for one `m×k` by `k×n` product: no transposes, `alpha = 1`, `beta = 0`.
    #[must_use]
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        GemmConfig {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            batch: 1,
            stride_a: m.saturating_mul(k),
            stride_b: k.saturating_mul(n),
            stride_c: m.saturating_mul(n),
        }
    }

    /// The same product with `A` and/or `B` stored transposed.
    #[must_use]
    pub fn transpose(mut self, trans_a: bool, trans_b: bool) -> Self {
        self.trans_a = trans_a;
        self.trans_b = trans_b;
        self
    }

    /// The same product with `C = alpha · op(A) · op(B) + beta · C`.
    #[must_use]
    pub fn scale(mut self, alpha: f32, beta: f32) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }

    /// The same product over `batch` densely packed matrix triples (strides `m·k`, `k·n`,
    /// `m·n`).
    #[must_use]
    pub fn batched(mut self, batch: usize) -> Self {
        self.batch = batch;
        self.stride_a = self.m.saturating_mul(self.k);
        self.stride_b = self.k.saturating_mul(self.n);
        self.stride_c = self.m.saturating_mul(self.n);
        self
    }

    /// The same batch with explicit strides, in elements.
    #[must_use]
    pub fn strides(mut self, stride_a: usize, stride_b: usize, stride_c: usize) -> Self {
        self.stride_a = stride_a;
        self.stride_b = stride_b;
        self.stride_c = stride_c;
        self
    }

    /// `A` as stored: `(rows, cols)`.
    pub(crate) fn a_dims(&self) -> (usize, usize) {
        if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        }
    }

    /// `B` as stored: `(rows, cols)`.
    pub(crate) fn b_dims(&self) -> (usize, usize) {
        if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        }
    }
}

fn shape_err(reason: String) -> DeviceError {
    DeviceError::InvalidShape { op: "gemm", reason }
}

/// Elements a view must hold for `batch` matrices of `rows × cols` at `stride`.
fn span(batch: usize, stride: usize, rows: usize, cols: usize) -> Option<usize> {
    let one = rows.checked_mul(cols)?;
    if batch == 0 {
        return Some(0);
    }
    (batch - 1).checked_mul(stride)?.checked_add(one)
}

fn check_operand<T>(
    name: &str,
    view: &BufferView<'_, T>,
    cfg: &GemmConfig,
    (rows, cols): (usize, usize),
    stride: usize,
    transposed: bool,
) -> Result<()> {
    let shape = format!(
        "{name} is stored {rows}×{cols}{} (m={}, n={}, k={}), batch {} at stride {stride}",
        if transposed { ", used transposed" } else { "" },
        cfg.m,
        cfg.n,
        cfg.k,
        cfg.batch,
    );
    let need = span(cfg.batch, stride, rows, cols)
        .ok_or_else(|| shape_err(format!("{shape}: the sizes overflow the address space")))?;
    // An empty batch reads nothing; one matrix shared by every batch (stride 0) may still be
    // given whole, as it is for a batch of any other size.
    let shared_whole = cfg.batch == 0 && stride == 0 && Some(view.len) == rows.checked_mul(cols);
    if view.len != need && !shared_whole {
        return Err(shape_err(format!(
            "{shape}: it needs a view of {need} elements, the view has {}",
            view.len
        )));
    }
    Ok(())
}

/// The byte range `[start, end)` of `view` within its allocation.
fn byte_range<T>(view: &BufferView<'_, T>) -> (usize, usize) {
    let size = std::mem::size_of::<T>();
    (view.offset * size, (view.offset + view.len) * size)
}

fn overlaps<X, Y>(x: &BufferView<'_, X>, y: &BufferView<'_, Y>) -> bool {
    let ((xs, xe), (ys, ye)) = (byte_range(x), byte_range(y));
    Arc::ptr_eq(x.mem, y.mem) && xs < xe && ys < ye && xs < ye && ys < xe
}

fn validate<I: GemmElem, O: GemmElem>(
    stream: &Stream,
    cfg: &GemmConfig,
    a: &BufferView<'_, I>,
    b: &BufferView<'_, I>,
    c: &BufferView<'_, O>,
) -> Result<()> {
    for (name, mem) in [("A", a.mem), ("B", b.mem), ("C", c.mem)] {
        mem.check_device(stream, "gemm", name)?;
    }
    check_operand("A", a, cfg, cfg.a_dims(), cfg.stride_a, cfg.trans_a)?;
    check_operand("B", b, cfg, cfg.b_dims(), cfg.stride_b, cfg.trans_b)?;
    check_operand("C", c, cfg, (cfg.m, cfg.n), cfg.stride_c, false)?;
    let c_size = cfg
        .m
        .checked_mul(cfg.n)
        .ok_or_else(|| shape_err(format!("C is {}×{}: that overflows usize", cfg.m, cfg.n)))?;
    if cfg.batch > 1 && c_size > 0 && cfg.stride_c < c_size {
        return Err(shape_err(format!(
            "C is {}×{} (m×n) and the batch of {} is at stride {}: the output matrices would \
             overlap; stride_c must be at least m·n = {c_size}",
            cfg.m, cfg.n, cfg.batch, cfg.stride_c
        )));
    }
    for (index, name, input) in [(0, "A", a), (1, "B", b)] {
        if overlaps(c, input) {
            return Err(DeviceError::InvalidArgument {
                kernel: "gemm".into(),
                index: 2,
                reason: format!(
                    "C overlaps {name} (argument {index}) in the same buffer; the output must \
                     not alias an input"
                ),
            });
        }
    }
    Ok(())
}

/// Enqueues `C = alpha · op(A) · op(B) + beta · C` on `stream`, for dense row-major matrices
/// described by `cfg` (see [`GemmConfig`] for the layout and the batch strides).
///
/// The views must hold exactly the elements the product addresses: `(batch − 1) · stride + rows ·
/// cols` for each operand (`m·k`, `k·n` and `m·n` for one product). `C` must not overlap `A` or
/// `B`. The call is stream-ordered and may be captured into a graph; it does not wait.
///
/// `C` has the inputs' element type, or `f32` for `f16` and `bf16` inputs (see
/// [`GemmOutput`]): the `f32` accumulation is then stored as it is, without rounding to half.
///
/// # Examples
///
/// ```
/// use cuflow_runtime::{gemm, Device, DeviceBuffer, GemmConfig};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let x = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0, 3.0, 4.0])?; // 2×2
/// let acc = DeviceBuffer::from_host(&stream, &[1.0f32; 4])?;
/// // acc = 0.5 · x · xᵀ + acc
/// let cfg = GemmConfig::new(2, 2, 2).transpose(false, true).scale(0.5, 1.0);
/// gemm(&stream, cfg, x.view(), x.view(), acc.view())?;
/// assert_eq!(acc.to_host_vec(&stream)?, vec![3.5, 6.5, 6.5, 13.5]);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] (naming `gemm` and the shapes) when a view's length does not
/// match `cfg`, or the output matrices of a batch overlap; [`DeviceError::InvalidArgument`] when
/// `C` overlaps `A` or `B`; [`DeviceError::DeviceMismatch`] for a view of another device than
/// the stream's; on CUDA, [`DeviceError::NoBlas`] when libcublas cannot be loaded,
/// [`DeviceError::Unsupported`] for a dimension cuBLAS cannot address (over `i32::MAX`), and
/// [`DeviceError::Blas`] when cuBLAS refuses the call. Errors of the computation itself on the
/// host backend come back from the stream's next synchronization, as for kernels.
pub fn gemm<I: GemmElem, O: GemmOutput<I>>(
    stream: &Stream,
    cfg: GemmConfig,
    a: BufferView<'_, I>,
    b: BufferView<'_, I>,
    c: BufferView<'_, O>,
) -> Result<()> {
    validate(stream, &cfg, &a, &b, &c)?;
    if cfg.m == 0 || cfg.n == 0 || cfg.batch == 0 {
        return Ok(());
    }
    // During a capture, the workspace the capture gave this stream (see `capture_workspace`):
    // the GEMM writes it, and the graph keeps it. Host streams never get one.
    let captured_workspace = stream
        .capture_session()
        .map(|session| session.blas_workspace(stream.id()));
    let mut accesses = gemm_accesses(&a, &b, &c);
    if let Some(Some(mem)) = &captured_workspace {
        accesses.push((mem, Access::Write));
    }
    let work = || Work::Gemm {
        m: cfg.m,
        n: cfg.n,
        k: cfg.k,
    };
    ordered_traced(stream, "gemm", work, accesses, || {
        stream.backend().gemm(
            (I::DTYPE, O::DTYPE),
            &cfg,
            [a.region(), b.region(), c.region()],
            captured_workspace.as_ref().map(Option::as_ref),
        )
    })
}

/// A GEMM reads `A` and `B` and writes `C`.
fn gemm_accesses<'v, I, O>(
    a: &BufferView<'v, I>,
    b: &BufferView<'v, I>,
    c: &BufferView<'v, O>,
) -> Accesses<'v> {
    smallvec![
        (a.mem, Access::Read),
        (b.mem, Access::Read),
        (c.mem, Access::Write)
    ]
}

/// The cuBLAS workspace a capture gives `stream` (which is about to begin or join it): cuBLAS
/// kernels captured into a graph keep their workspace's address, so each stream of a capture
/// gets one of its own, allocated before it starts capturing and kept by the graph when a
/// captured GEMM used it. `None` on the host backend, and on devices where no GEMM ran yet (a
/// GEMM captured there runs without a workspace: correct, possibly slower). Like any buffer a
/// graph uses, the workspace is allocated in `stream`'s order: replaying the graph on another
/// stream assumes that what `stream` had queued before the capture has been ordered before the
/// replay, as the allocation of the graph's other buffers does.
pub(crate) fn capture_workspace(stream: &Stream) -> Option<Arc<Memory>> {
    let bytes = stream.backend().blas_capture_workspace_bytes()?;
    // An allocation failure is not the capture's failure: its GEMMs run without a workspace.
    Memory::alloc(stream, bytes).ok()
}

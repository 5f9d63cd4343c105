//! User kernels: CUDA C source with an optional host implementation, launched over tensors as
//! an op exactly like the built-in kernels.

use std::fmt;

use cuflow_device_op::{DeviceOp, ExecutionContext};
use cuflow_runtime::{DeviceCopy, DeviceError, Kernel, KernelArgs, LaunchConfig};

use crate::dtype::DType;
use crate::kernels::check_device;
use crate::tensor::{tiling, Partition, TensorMut, TensorRef};

/// One argument of a [`Launch`], in kernel-parameter order.
enum Arg<'a> {
    Input(Box<dyn ErasedInput + 'a>),
    Scalar(Box<dyn Fn(&mut KernelArgs<'_>) + Send + 'a>),
}

/// An input tensor of any dtype, type-erased so a launch can hold several.
trait ErasedInput: Send {
    fn check(&self, stream: &cuflow_runtime::Stream, name: &'static str)
        -> Result<(), DeviceError>;
    fn push<'b>(&'b self, args: &mut KernelArgs<'b>) -> Result<(), DeviceError>;
    /// The tensor's element count.
    fn len(&self) -> usize;
}

struct Input<T, V>(V, std::marker::PhantomData<fn() -> T>);

impl<T: DType, V: TensorRef<T>> ErasedInput for Input<T, V> {
    fn check(
        &self,
        stream: &cuflow_runtime::Stream,
        name: &'static str,
    ) -> Result<(), DeviceError> {
        check_device(name, stream, self.0.tensor())?;
        self.0.tensor().view(name).map(|_| ())
    }
    fn push<'b>(&'b self, args: &mut KernelArgs<'b>) -> Result<(), DeviceError> {
        args.input(self.0.tensor().view("Launch")?);
        Ok(())
    }
    fn len(&self) -> usize {
        self.0.tensor().len()
    }
}

/// A launch of a user [`Kernel`] over a partitioned output: the kernel's first parameter is
/// the output (`T*`), then the inputs and scalars in the order they were added, then, added by
/// the launch itself, one `unsigned long long` per tensor: the output's element count, then
/// each input's, in the order the inputs were added. The launch has one block per tile of the
/// partition and `block_threads` threads per block (256 unless set), so the kernel finds its
/// tile from `blockIdx.x`; pass the shapes it needs as scalars. On the host backend the
/// kernel's host implementation runs over the same arguments.
///
/// The element counts are the ones the kernel bounds its accesses by: everything else a launch
/// is given (the tile, the block size, the scalars, which tensors) is chosen by safe code that
/// may get it wrong, so a kernel that indexed by those alone could not keep the promise of
/// [`Kernel::new`] (to stay within the buffers passed to it, for every launch). A kernel that
/// does not declare the counts is refused at launch with [`DeviceError::InvalidArgument`]
/// (where its signature can be read), before it runs.
///
/// Every tensor is passed as a pointer to its first element, its elements packed in
/// row-major order after it: the output and the inputs must be contiguous and start at a
/// 16-byte boundary of their buffer, so that vector accesses are aligned (a
/// [`narrow`](crate::Tensor::narrow) of the first axis over rows of a multiple of 16 bytes is
/// passed from its first element). Any other view is refused with
/// [`DeviceError::InvalidShape`] rather than copied, since the kernel cannot say how it
/// indexes its arguments; pass [`kernels::contiguous`](crate::kernels::contiguous) of it
/// instead.
///
/// The op yields the output partition back.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::{Device, Kernel};
/// use cuflow_tensor::{api, Launch, PartitionExt};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// // out[i] = x[i] * x[i] + c, one 64-element tile per block.
/// // SAFETY: every access is below the element counts the launch appends (`n_out`, `n_x`),
/// // whatever the tile, block size or scalars.
/// let square_plus = unsafe {
///     Kernel::new(
///         "square_plus",
///         r#"extern "C" __global__ void square_plus(float* out, const float* x, float c,
///                                                   unsigned long long n_out,
///                                                   unsigned long long n_x) {
///             unsigned long long i = blockIdx.x * 64ull + threadIdx.x;
///             if (threadIdx.x < 64 && i < n_out && i < n_x) out[i] = x[i] * x[i] + c;
///         }"#,
///     )
/// }
/// .with_host(|args| {
///     let x = args.input::<f32>(1)?;
///     let c = args.scalar::<f32>(2)?;
///     for (o, x) in args.output::<f32>(0)?.iter_mut().zip(x) {
///         *o = x * x + c;
///     }
///     Ok(())
/// });
/// let stream = Device::host().new_stream()?;
/// let x = api::arange::<f32>(0.0, 256.0, 1.0).sync_on(&stream)?;
/// let mut out = api::zeros::<f32>(&[256]).sync_on(&stream)?;
/// Launch::new(&square_plus, (&mut out).partition([64]))
///     .block_threads(64)
///     .input(&x)
///     .scalar(1.0f32)
///     .sync_on(&stream)?;
/// assert_eq!(out.to_host_vec()?[3], 10.0);
/// # Ok(()) }
/// ```
#[must_use = "device ops do nothing until synced or awaited"]
pub struct Launch<'a, T, P> {
    kernel: Kernel,
    _dtype: std::marker::PhantomData<fn() -> T>,
    out: Partition<P>,
    args: Vec<Arg<'a>>,
    block: u32,
    shared_mem: u32,
}

impl<'a, T: DType, P: TensorMut<T>> Launch<'a, T, P> {
    /// A launch of `kernel` writing `out`.
    pub fn new(kernel: &Kernel, out: Partition<P>) -> Self {
        Launch {
            kernel: kernel.clone(),
            _dtype: std::marker::PhantomData,
            out,
            args: Vec::new(),
            block: 256,
            shared_mem: 0,
        }
    }

    /// Adds an input tensor (`Tensor<U>`, `Arc<Tensor<U>>` or `&Tensor<U>`), passed as
    /// `const U*`.
    pub fn input<U: DType, V: TensorRef<U> + 'a>(mut self, x: V) -> Self {
        self.args.push(Arg::Input(Box::new(Input::<U, V>(
            x,
            std::marker::PhantomData,
        ))));
        self
    }

    /// Adds a scalar parameter.
    pub fn scalar<S: DeviceCopy>(mut self, v: S) -> Self {
        self.args
            .push(Arg::Scalar(Box::new(move |a: &mut KernelArgs<'_>| {
                a.scalar(v);
            })));
        self
    }

    /// Threads per block (checked against the device's limit when launched).
    pub fn block_threads(mut self, n: u32) -> Self {
        self.block = n;
        self
    }

    /// Bytes of dynamic shared memory per block.
    pub fn shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem = bytes;
        self
    }
}

impl<T: DType, P: TensorMut<T>> DeviceOp for Launch<'_, T, P> {
    type Output = Partition<P>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Partition<P>, DeviceError> {
        let stream = ctx.stream()?;
        let out = self.out.get().tensor();
        check_device("Launch", stream, out)?;
        out.out_view("Launch")?;
        let t = tiling("Launch", out.shape(), self.out.tile())?;
        for a in &self.args {
            if let Arg::Input(i) = a {
                i.check(stream, "Launch")?;
            }
        }
        let grid = u32::try_from(t.tiles()).map_err(|_| DeviceError::InvalidPartition {
            op: "Launch",
            reason: format!("{} tiles are more blocks than a launch can have", t.tiles()),
        })?;
        if grid > 0 {
            let mut args = KernelArgs::new();
            args.output(out.view("Launch")?);
            for a in &self.args {
                match a {
                    Arg::Input(i) => i.push(&mut args)?,
                    Arg::Scalar(f) => f(&mut args),
                }
            }
            // The counts every access of the kernel is bounded by (see the type's docs).
            args.scalar(out.len() as u64);
            for a in &self.args {
                if let Arg::Input(i) = a {
                    args.scalar(i.len() as u64);
                }
            }
            self.kernel.launch(
                stream,
                LaunchConfig::linear(grid, self.block).with_shared_mem(self.shared_mem),
                &args,
            )?;
        }
        Ok(self.out)
    }
}

impl<T, P> fmt::Debug for Launch<'_, T, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("kernel", &self.kernel.name())
            .field("tile", &self.out.tile())
            .field("args", &self.args.len())
            .field("block_threads", &self.block)
            .finish()
    }
}

impl<T, P> std::future::IntoFuture for Launch<'static, T, P>
where
    Launch<'static, T, P>: DeviceOp + 'static,
{
    type Output = Result<<Self as DeviceOp>::Output, DeviceError>;
    type IntoFuture = cuflow_device_op::DeviceFuture<<Self as DeviceOp>::Output>;

    fn into_future(self) -> Self::IntoFuture {
        cuflow_device_op::DeviceFuture::lazy(self)
    }
}

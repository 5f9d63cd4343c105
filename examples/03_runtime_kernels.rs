//! The runtime underneath the tensors: device buffers, a kernel from CUDA C with a host
//! implementation, and a hand-written op.
//!
//! Runs on CUDA device 0 when one is usable, else on the host backend
//! (`CUFLOW_DEVICE=host|cuda|cuda:N` chooses explicitly).

use std::sync::Arc;

use cuflow::prelude::*;

/// `y = a * x + y` over `n` elements, on the GPU and on the host.
fn saxpy_kernel() -> Kernel {
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let kernel = unsafe {
        Kernel::new(
            "saxpy",
            r#"extern "C" __global__ void saxpy(float* y, const float* x, float a, unsigned n) {
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                 i += blockDim.x * gridDim.x) {
                y[i] = a * x[i] + y[i];
            }
        }"#,
        )
    };
    kernel.with_host(|args| {
        let x = args.input::<f32>(1)?;
        let a = args.scalar::<f32>(2)?;
        let y = args.output::<f32>(0)?;
        for (y, x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
        Ok(())
    })
}

/// An op that runs saxpy on buffers it owns and hands `y` back.
struct Saxpy {
    y: Arc<DeviceBuffer<f32>>,
    x: Arc<DeviceBuffer<f32>>,
    a: f32,
}

impl DeviceOp for Saxpy {
    type Output = Arc<DeviceBuffer<f32>>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let n = self.y.len();
        saxpy_kernel().launch(
            ctx.stream()?,
            LaunchConfig::for_num_elems(n),
            KernelArgs::new()
                .output(&*self.y)
                .input(&*self.x)
                .scalar(self.a)
                .scalar(n as u32),
        )?;
        Ok(self.y)
    }
}

/// Refuses arguments (it takes none); prints an error of the run with its `Display` form,
/// which says what went wrong and how to fix it (a missing driver names the host backend as
/// the way out), and exits with status 1.
fn main() {
    if let Some(arg) = std::env::args().nth(1) {
        eprintln!("error: unexpected argument {arg:?}; 03_runtime_kernels takes no arguments");
        std::process::exit(1);
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    println!("device: {device}");
    let stream = device.new_stream()?;

    // Buffers: copy in, run a kernel on the stream, read back (the read waits for the kernel).
    let n = 256;
    let z = DeviceBuffer::<f32>::zeroed(&stream, n)?;
    let x = DeviceBuffer::from_host(&stream, &vec![1.0f32; n])?;
    saxpy_kernel().launch(
        &stream,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new()
            .output(&z)
            .input(&x)
            .scalar(2.0f32)
            .scalar(n as u32),
    )?;
    assert_eq!(z.to_host_vec(&stream)?, vec![2.0f32; n]);
    println!("saxpy: z = 2 * x + 0 = {:?}", &z.to_host_vec(&stream)?[..4]);

    // Ops: nothing runs until sync. Two independent saxpys may run on different streams.
    let make = |v: f32| -> Result<Saxpy, DeviceError> {
        Ok(Saxpy {
            y: Arc::new(DeviceBuffer::from_host(&stream, &vec![v; n])?),
            x: Arc::new(DeviceBuffer::from_host(&stream, &vec![1.0f32; n])?),
            a: 10.0,
        })
    };
    stream.synchronize()?;
    let (a, b) = zip!(make(1.0)?, make(2.0)?).sync()?;
    let (a, b) = (a.to_host_vec(&stream)?, b.to_host_vec(&stream)?);
    assert!(a.iter().all(|v| *v == 11.0) && b.iter().all(|v| *v == 12.0));
    println!("zip!: {} and {}", a[0], b[0]);

    // Host-only transforms and chaining.
    let n = value(21).map(|v| v * 2).sync()?;
    println!("value(21).map(|v| v * 2) = {n}");
    Ok(())
}

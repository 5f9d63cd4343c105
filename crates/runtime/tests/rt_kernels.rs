//! Kernels: one source, two implementations. A kernel gives the same values on the device
//! under test and on the host backend, and both match a float64 reference.

use std::sync::OnceLock;

use cuflow_runtime::{
    BackendKind, Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig,
};
use cuflow_testing::{
    device::{device, stream},
    kernels::{launch_add_one, prefix, prefix_mut, saxpy},
    measure::{assert_close_in_norm, assert_close_to_magnitude, rel_err_in_norm},
    rng::{random_f32, rng},
    ODD_SIZES, POISON, POISON_U32,
};
use rand::Rng;

const TOL: f64 = 1e-6;

/// Runs saxpy on `device` and returns `y` afterwards.
fn run_saxpy(
    device: &Device,
    a: f32,
    x: &[f32],
    y: &[f32],
    config: LaunchConfig,
) -> Result<Vec<f32>, DeviceError> {
    let s = device.new_stream()?;
    let xb = DeviceBuffer::from_host(&s, x)?;
    let yb = DeviceBuffer::from_host(&s, y)?;
    saxpy().launch(
        &s,
        config,
        KernelArgs::new()
            .output(&yb)
            .input(&xb)
            .scalar(a)
            .scalar(x.len() as u32),
    )?;
    yb.to_host_vec(&s)
}

#[test]
fn saxpy_matches_the_host_backend_and_a_float64_reference() -> Result<(), DeviceError> {
    let device = device();
    let host = Device::host();
    let mut rng = rng();
    for n in ODD_SIZES {
        // Same signs throughout: `a·x + y` never cancels, so float32 stays within a few ulps of
        // the float64 reference even at n = 1 (with mixed signs a single element can lose
        // most of its digits, and the test would fail on correct results).
        let x: Vec<f32> = random_f32(&mut rng, n).iter().map(|v| v.abs()).collect();
        let y: Vec<f32> = random_f32(&mut rng, n).iter().map(|v| v.abs()).collect();
        let a: f32 = rng.gen_range(0.5..4.0);
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(x, y)| a as f64 * *x as f64 + *y as f64)
            .collect();
        // A small grid: the grid-stride loop visits most elements several times over.
        let config = LaunchConfig::linear(7, 128);
        let on_device = run_saxpy(&device, a, &x, &y, config)?;
        let on_host = run_saxpy(&host, a, &x, &y, config)?;
        assert_close_in_norm(&format!("saxpy n={n} on {device}"), &on_device, &want, TOL);
        assert_close_in_norm(&format!("saxpy n={n} on the host"), &on_host, &want, TOL);
        let host_ref: Vec<f64> = on_host.iter().map(|v| *v as f64).collect();
        assert_close_in_norm(
            &format!("saxpy n={n}, {device} vs host"),
            &on_device,
            &host_ref,
            TOL,
        );
        // One thread per element gives the same values.
        let wide = run_saxpy(&device, a, &x, &y, LaunchConfig::for_num_elems(n))?;
        assert_close_in_norm(&format!("saxpy n={n}, one thread each"), &wide, &want, TOL);
    }
    Ok(())
}

/// `out[r][c] = x[r][c] * row_scale[r] + col_bias[c]` for an `rows x cols` row-major matrix,
/// with a 2-D launch: x along columns, y along rows. The host implementation walks the launch's
/// grid and blocks as the GPU's threads do, so a configuration that does not cover the matrix
/// leaves poison on both backends.
fn scale_rows_add_cols() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
        // given, below the counts it is given, and has no data race of its own.
        // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
        // given, below the counts it is given, and has no data race of its own.
        let kernel = unsafe {
            Kernel::new(
                "rt_scale_rows_add_cols",
                r#"extern "C" __global__ void rt_scale_rows_add_cols(
                    float* out, const float* x, const float* row_scale, const float* col_bias,
                    unsigned rows, unsigned cols) {
                unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
                unsigned r = blockIdx.y * blockDim.y + threadIdx.y;
                if (r < rows && c < cols) {
                    out[r * cols + c] = x[r * cols + c] * row_scale[r] + col_bias[c];
                }
            }"#,
            )
        };
        kernel.with_host(|args| {
            const NAME: &str = "rt_scale_rows_add_cols";
            let rows = args.scalar::<u32>(4)? as usize;
            let cols = args.scalar::<u32>(5)? as usize;
            let x = prefix(NAME, args.input::<f32>(1)?, rows * cols)?;
            let row_scale = prefix(NAME, args.input::<f32>(2)?, rows)?;
            let col_bias = prefix(NAME, args.input::<f32>(3)?, cols)?;
            let cfg = args.config();
            let out = prefix_mut(NAME, args.output::<f32>(0)?, rows * cols)?;
            let (grid, block) = (cfg.grid, cfg.block);
            for by in 0..grid.1 as usize {
                for bx in 0..grid.0 as usize {
                    for ty in 0..block.1 as usize {
                        for tx in 0..block.0 as usize {
                            let c = bx * block.0 as usize + tx;
                            let r = by * block.1 as usize + ty;
                            if r < rows && c < cols {
                                out[r * cols + c] = x[r * cols + c] * row_scale[r] + col_bias[c];
                            }
                        }
                    }
                }
            }
            Ok(())
        })
    })
}

fn run_2d(
    device: &Device,
    x: &[f32],
    row_scale: &[f32],
    col_bias: &[f32],
    config: LaunchConfig,
) -> Result<Vec<f32>, DeviceError> {
    let (rows, cols) = (row_scale.len(), col_bias.len());
    let s = device.new_stream()?;
    let xb = DeviceBuffer::from_host(&s, x)?;
    let rb = DeviceBuffer::from_host(&s, row_scale)?;
    let cb = DeviceBuffer::from_host(&s, col_bias)?;
    let out = DeviceBuffer::<f32>::alloc(&s, rows * cols)?;
    out.view().fill_bytes(&s, POISON)?;
    scale_rows_add_cols().launch(
        &s,
        config,
        KernelArgs::new()
            .output(&out)
            .input(&xb)
            .input(&rb)
            .input(&cb)
            .scalar(rows as u32)
            .scalar(cols as u32),
    )?;
    out.to_host_vec(&s)
}

#[test]
fn a_two_dimensional_launch_matches_the_host_backend_and_a_float64_reference(
) -> Result<(), DeviceError> {
    let device = device();
    let host = Device::host();
    let mut rng = rng();
    for (rows, cols) in [(1usize, 1usize), (37, 1001), (129, 63)] {
        let x = random_f32(&mut rng, rows * cols);
        let row_scale = random_f32(&mut rng, rows);
        let col_bias = random_f32(&mut rng, cols);
        let mut want = vec![0f64; rows * cols];
        // The size of each element's terms: mixed signs may cancel (the 1x1 case can land
        // near 0), and rounding errs relative to the terms, not to their sum.
        let mut terms = vec![0f64; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                let (xs, b) = (
                    x[r * cols + c] as f64 * row_scale[r] as f64,
                    col_bias[c] as f64,
                );
                want[r * cols + c] = xs + b;
                terms[r * cols + c] = xs.abs() + b.abs();
            }
        }
        let block = (16u32, 8u32, 1u32);
        let config = LaunchConfig::new(
            (
                (cols as u32).div_ceil(block.0),
                (rows as u32).div_ceil(block.1),
                1,
            ),
            block,
        );
        let on_device = run_2d(&device, &x, &row_scale, &col_bias, config)?;
        let on_host = run_2d(&host, &x, &row_scale, &col_bias, config)?;
        let what = format!("{rows}x{cols}");
        let close = |label: String, got: &[f32], want: &[f64]| {
            assert_close_to_magnitude(&label, got, want, &terms, TOL)
        };
        close(format!("{what} on {device}"), &on_device, &want);
        close(format!("{what} on the host"), &on_host, &want);
        let host_ref: Vec<f64> = on_host.iter().map(|v| *v as f64).collect();
        close(format!("{what}, {device} vs host"), &on_device, &host_ref);

        // A grid one block short along y leaves the last rows' poison in place.
        if rows > block.1 as usize {
            let mut short = config;
            short.grid.1 -= 1;
            let covered = (config.grid.1 as usize - 1) * block.1 as usize * cols;
            for got in [
                run_2d(&device, &x, &row_scale, &col_bias, short)?,
                run_2d(&host, &x, &row_scale, &col_bias, short)?,
            ] {
                assert_close_to_magnitude(
                    &what,
                    &got[..covered],
                    &want[..covered],
                    &terms[..covered],
                    TOL,
                );
                assert!(
                    got[covered..].iter().all(|v| v.to_bits() == POISON_U32),
                    "{what}: rows outside the grid were written"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn kernels_on_sub_views_touch_only_their_range() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = rng();
    let n = 4097;
    let x = random_f32(&mut rng, n);
    let y = random_f32(&mut rng, n);
    let a = 2.5f32;
    let xb = DeviceBuffer::from_host(&s, &x)?;
    let yb = DeviceBuffer::from_host(&s, &y)?;
    // y[1001..3002] += a * x[17..2018]
    let (ys, xs, len) = (1001, 17, 2001);
    saxpy().launch(
        &s,
        LaunchConfig::linear(3, 64),
        KernelArgs::new()
            .output(yb.slice(ys..ys + len)?)
            .input(xb.slice(xs..xs + len)?)
            .scalar(a)
            .scalar(len as u32),
    )?;
    let got = yb.to_host_vec(&s)?;
    assert_eq!(&got[..ys], &y[..ys], "elements before the view changed");
    assert_eq!(
        &got[ys + len..],
        &y[ys + len..],
        "elements after the view changed"
    );
    let want: Vec<f64> = (0..len)
        .map(|i| a as f64 * x[xs + i] as f64 + y[ys + i] as f64)
        .collect();
    assert_close_in_norm("saxpy on views", &got[ys..ys + len], &want, TOL);
    assert_eq!(xb.to_host_vec(&s)?, x, "the input changed");
    Ok(())
}

#[test]
fn repeated_launches_accumulate_in_stream_order() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = rng();
    let n = 1000;
    let x = random_f32(&mut rng, n);
    let xb = DeviceBuffer::from_host(&s, &x)?;
    for _ in 0..10 {
        launch_add_one(&s, &xb)?;
    }
    // Ten additions of 1.0 in f32, in the same order as the kernel: exact on both backends.
    let want: Vec<f32> = x
        .iter()
        .map(|v| (0..10).fold(*v, |acc, _| acc + 1.0))
        .collect();
    assert_eq!(xb.to_host_vec(&s)?, want);
    Ok(())
}

#[test]
fn kernels_describe_themselves_and_compile_ahead_of_launch() -> Result<(), DeviceError> {
    let device = device();
    let k = saxpy().clone();
    assert_eq!(k.name(), "test_saxpy");
    assert!(k.has_host_impl());
    assert!(k.supports(BackendKind::Host) && k.supports(BackendKind::Cuda));
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let bare = unsafe { Kernel::new("rt_bare", "extern \"C\" __global__ void rt_bare() {}") };
    assert!(!bare.has_host_impl());
    assert!(!bare.supports(BackendKind::Host));
    // Compiling ahead is a no-op on the host and builds the kernel on CUDA.
    k.compile(&device)?;
    bare.compile(&device)?;

    let s = device.new_stream()?;
    let buf = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let mut args = KernelArgs::new();
    assert!(args.is_empty());
    args.output(&buf).input(&buf).scalar(1.0f32).scalar(4u32);
    assert_eq!(args.len(), 4);

    // A clone shares the kernel (and its compiled code): launching it runs saxpy.
    let x = random_f32(&mut rng(), 5);
    let xb = DeviceBuffer::from_host(&s, &x)?;
    let yb = DeviceBuffer::from_host(&s, &x)?;
    k.launch(
        &s,
        LaunchConfig::linear(1, 32),
        KernelArgs::new()
            .output(&yb)
            .input(&xb)
            .scalar(1.0f32)
            .scalar(5u32),
    )?;
    let want: Vec<f64> = x.iter().map(|v| 2.0 * *v as f64).collect();
    assert!(rel_err_in_norm(&yb.to_host_vec(&s)?, &want) <= TOL);
    Ok(())
}

/// A buffer passed with `KernelArgs::output` to a parameter declared `const` is read by the
/// kernel, on every backend: the CUDA C reads it through its `const` pointer, and the host
/// implementation reads it with `HostKernelArgs::input` (its write stays ordered as a write).
#[test]
fn a_buffer_given_as_an_output_to_a_const_parameter_is_read() -> Result<(), DeviceError> {
    let s = stream();
    let data = random_f32(&mut rng(), 1000);
    let src = DeviceBuffer::from_host(&s, &data)?;
    let dst = DeviceBuffer::from_host(&s, &vec![f32::NAN; data.len()])?;
    cuflow_testing::kernels::copy().launch(
        &s,
        LaunchConfig::for_num_elems(data.len()),
        KernelArgs::new()
            .output(&dst)
            .output(&src)
            .scalar(data.len() as u32),
    )?;
    assert_eq!(dst.to_host_vec(&s)?, data);
    assert_eq!(src.to_host_vec(&s)?, data);
    Ok(())
}

/// A host implementation reads an output given to a `const` parameter, or writes it, but not
/// both in one launch: the slice it read stays valid for the whole launch, so the write is
/// refused with an error naming the argument, and so is a read after the write. A read
/// refused for its element type takes nothing: the output can still be written.
#[test]
fn a_host_implementation_reads_or_writes_an_output_but_not_both() -> Result<(), DeviceError> {
    let s = Device::host().new_stream()?;
    let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0])?;
    for read_first in [true, false] {
        // SAFETY: the CUDA C source touches no memory; only its host implementation runs here.
        let k = unsafe {
            Kernel::new(
                "read_or_write",
                r#"extern "C" __global__ void read_or_write(const float* x) {}"#,
            )
        }
        .with_host(move |args| {
            if read_first {
                let _ = args.input::<f32>(0)?;
                args.output::<f32>(0).map(drop)
            } else {
                let _ = args.output::<f32>(0)?;
                args.input::<f32>(0).map(drop)
            }
        });
        k.launch(&s, LaunchConfig::linear(1, 1), KernelArgs::new().output(&x))?;
        let e = s.synchronize().expect_err("reading and writing is refused");
        let want = if read_first {
            "was read with HostKernelArgs::input"
        } else {
            "already taken with HostKernelArgs::output"
        };
        assert!(
            matches!(&e, DeviceError::InvalidArgument { index: 0, reason, .. } if reason.contains(want)),
            "{e}"
        );
    }
    assert_eq!(x.to_host_vec(&s)?, vec![1.0, 2.0]);
    Ok(())
}

/// A read of an output refused for its element type leaves the output to be written.
#[test]
fn a_refused_read_of_an_output_leaves_it_writable() -> Result<(), DeviceError> {
    let s = Device::host().new_stream()?;
    let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0])?;
    // SAFETY: the CUDA C source touches no memory; only its host implementation runs here.
    let k = unsafe {
        Kernel::new(
            "read_wrong_then_write",
            r#"extern "C" __global__ void read_wrong_then_write(float* x) {}"#,
        )
    }
    .with_host(|args| {
        assert!(
            args.input::<u32>(0).is_err(),
            "a read as u32 of f32 elements"
        );
        args.output::<f32>(0)?[0] = 7.0;
        Ok(())
    });
    k.launch(&s, LaunchConfig::linear(1, 1), KernelArgs::new().output(&x))?;
    assert_eq!(x.to_host_vec(&s)?, vec![7.0, 2.0]);
    Ok(())
}

//! Kernel errors are values: a source that does not compile, a kernel without the host
//! implementation the host backend needs, launch configurations the device cannot run, and
//! arguments that do not match the kernel's parameters (as declared in its CUDA C source, as
//! compiled, or as its host implementation reads them) all come back as `DeviceError`, and
//! the device keeps working afterwards.
//!
//! Tests of host implementations (what they read, how they fail) run on `Device::host()`
//! whatever the device under test is: only the host backend runs them.

use cuflow_runtime::{
    BackendKind, Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig,
};
use cuflow_testing::{
    device::{device, stream},
    kernels::{add_one, assert_stream_usable, copy, saxpy},
    rng::{random_f32, rng},
};

#[test]
fn a_bad_kernel_source_is_a_compile_error_on_cuda_and_needs_a_host_impl_on_host(
) -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let broken = unsafe {
        Kernel::new(
            "rt_broken",
            r#"extern "C" __global__ void rt_broken(float* x) { x[0] = rt_undefined_symbol; }"#,
        )
    };
    match device.kind() {
        BackendKind::Cuda => {
            match broken.compile(&device) {
                Err(DeviceError::Compile { kernel, log }) => {
                    assert_eq!(kernel, "rt_broken");
                    assert!(!log.trim().is_empty(), "the compile log is empty");
                    assert!(
                        log.contains("rt_undefined_symbol"),
                        "the log does not name the error: {log}"
                    );
                }
                other => panic!("expected a compile error, got {other:?}"),
            }
            // Launching compiles, and fails the same way, without enqueuing anything.
            let launched =
                broken.launch(&s, LaunchConfig::linear(1, 1), KernelArgs::new().output(&x));
            match launched {
                Err(e @ DeviceError::Compile { .. }) => {
                    assert!(e.to_string().contains("rt_undefined_symbol"), "{e}")
                }
                other => panic!("expected a compile error, got {other:?}"),
            }
            // An entry point that the source does not define.
            // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
            // given, below the counts it is given, and has no data race of its own.
            let misnamed = unsafe {
                Kernel::new(
                    "rt_not_defined_here",
                    r#"extern "C" __global__ void rt_defined(float* x) { x[0] = 1.0f; }"#,
                )
            };
            match misnamed.compile(&device) {
                Err(DeviceError::Compile { kernel, log }) => {
                    assert_eq!(kernel, "rt_not_defined_here");
                    assert!(log.contains("rt_not_defined_here"), "{log}");
                }
                other => panic!("expected a compile error, got {other:?}"),
            }
        }
        _ => {
            // There is no compiler on the host: building is a no-op, and a kernel without a
            // host implementation cannot run.
            broken.compile(&device)?;
            match broken.launch(&s, LaunchConfig::linear(1, 1), KernelArgs::new().output(&x)) {
                Err(DeviceError::HostKernel { kernel, reason }) => {
                    assert_eq!(kernel, "rt_broken");
                    assert!(reason.contains("host implementation"), "{reason}");
                }
                other => panic!("expected a missing host implementation, got {other:?}"),
            }
        }
    }
    assert_eq!(x.to_host_vec(&s)?, vec![0.0; 4], "the failed launch ran");
    assert_stream_usable(&s)
}

#[test]
fn a_kernel_without_a_host_impl_cannot_run_on_the_host() -> Result<(), DeviceError> {
    let s = Device::host().new_stream()?;
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let cuda_only = unsafe {
        Kernel::new(
            "rt_cuda_only",
            r#"extern "C" __global__ void rt_cuda_only() {}"#,
        )
    };
    assert!(matches!(
        cuda_only.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new()),
        Err(DeviceError::HostKernel { .. })
    ));
    assert_stream_usable(&s)
}

#[test]
fn bad_launch_configurations_are_refused_before_they_run() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let x0 = random_f32(&mut rng(), 64);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    let limits = *device.limits();
    let bad = [
        LaunchConfig::linear(1, 2048),
        LaunchConfig::linear(0, 32),
        LaunchConfig::linear(1, 0),
        LaunchConfig::new((1, 1, 1), (1, 1, 65)),
        LaunchConfig::new((1, 1, 1), (32, 32, 2)),
        LaunchConfig::new((1, limits.max_grid_dim[1] + 1, 1), (32, 1, 1)),
        LaunchConfig::linear(1, 32).with_shared_mem(limits.max_shared_mem_per_block_optin + 1),
    ];
    for cfg in bad {
        match add_one().launch(&s, cfg, KernelArgs::new().output(&x).scalar(64u32)) {
            Err(DeviceError::InvalidLaunch { kernel, reason }) => {
                assert_eq!(kernel, "test_add_one");
                assert!(!reason.is_empty());
            }
            other => panic!("{cfg:?}: expected InvalidLaunch, got {other:?}"),
        }
        assert!(cfg.validate("test_add_one", &limits).is_err());
    }
    // The limits themselves are valid.
    let widest = LaunchConfig::new((2, 1, 1), (limits.max_threads_per_block, 1, 1));
    widest.validate("test_add_one", &limits)?;
    add_one().launch(&s, widest, KernelArgs::new().output(&x).scalar(64u32))?;
    let want: Vec<f32> = x0.iter().map(|v| v + 1.0).collect();
    assert_eq!(x.to_host_vec(&s)?, want, "only the valid launch ran");
    assert_stream_usable(&s)
}

#[test]
fn a_scalar_larger_than_sixteen_bytes_is_an_invalid_argument() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let r = add_one().launch(
        &s,
        LaunchConfig::linear(1, 4),
        KernelArgs::new().output(&x).scalar([0u64; 3]),
    );
    match r {
        Err(DeviceError::InvalidArgument { kernel, index, .. }) => {
            assert_eq!(kernel, "test_add_one");
            assert_eq!(index, 1);
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(x.to_host_vec(&s)?, vec![0.0; 4]);
    assert_stream_usable(&s)
}

#[test]
fn a_host_impl_reading_the_wrong_argument_type_is_an_invalid_argument() -> Result<(), DeviceError> {
    let s = Device::host().new_stream()?;
    let ints = DeviceBuffer::<i32>::zeroed(&s, 4)?;
    let floats = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let other = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    type Launch<'a> = Box<dyn Fn() -> Result<(), DeviceError> + 'a>;
    let cases: Vec<(usize, Launch<'_>)> = vec![
        // rt_add_one writes argument 0 as f32: an i32 buffer.
        (
            0,
            Box::new(|| {
                add_one().launch(
                    &s,
                    LaunchConfig::linear(1, 4),
                    KernelArgs::new().output(&ints).scalar(4u32),
                )
            }),
        ),
        // rt_add_one reads its count as u32: an f64.
        (
            1,
            Box::new(|| {
                add_one().launch(
                    &s,
                    LaunchConfig::linear(1, 4),
                    KernelArgs::new().output(&floats).scalar(4.0f64),
                )
            }),
        ),
        // test_saxpy writes argument 0: an input buffer there.
        (
            0,
            Box::new(|| {
                saxpy().launch(
                    &s,
                    LaunchConfig::linear(1, 4),
                    KernelArgs::new()
                        .input(&floats)
                        .input(&other)
                        .scalar(1.0f32)
                        .scalar(4u32),
                )
            }),
        ),
        // Too few arguments.
        (
            1,
            Box::new(|| {
                add_one().launch(
                    &s,
                    LaunchConfig::linear(1, 4),
                    KernelArgs::new().output(&floats),
                )
            }),
        ),
    ];
    for (want_index, launch) in &cases {
        // Refused at once when the source's signature says so (a wrong element type, a wrong
        // count); otherwise the host implementation finds the mismatch when it runs (an input
        // buffer passed where the kernel writes).
        let outcome = match launch() {
            Ok(()) => s.synchronize(),
            refused => refused,
        };
        match outcome {
            Err(DeviceError::InvalidArgument { index, .. }) => assert_eq!(index, *want_index),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(floats.to_host_vec(&s)?, vec![0.0; 4]);
    assert_eq!(ints.to_host_vec(&s)?, vec![0; 4]);
    assert_stream_usable(&s)
}

#[test]
fn launch_arguments_are_checked_against_the_declared_parameters() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0, 3.0, 4.0])?;
    let y = DeviceBuffer::from_host(&s, &[0.0f32; 4])?;
    let ints = DeviceBuffer::<u32>::zeroed(&s, 4)?;
    let doubles = DeviceBuffer::<f64>::zeroed(&s, 4)?;
    let one = LaunchConfig::linear(1, 4);
    // test_saxpy(float* y, const float* x, float a, unsigned n)
    let cases: Vec<(&str, usize, KernelArgs<'_>)> = vec![
        (
            "too few",
            3,
            KernelArgs::new()
                .output(&y)
                .input(&x)
                .scalar(2.0f32)
                .clone(),
        ),
        (
            "too many",
            4,
            KernelArgs::new()
                .output(&y)
                .input(&x)
                .scalar(2.0f32)
                .scalar(4u32)
                .scalar(1u32)
                .clone(),
        ),
        (
            "an f64 for a float",
            2,
            KernelArgs::new()
                .output(&y)
                .input(&x)
                .scalar(2.0f64)
                .scalar(4u32)
                .clone(),
        ),
        (
            "a float for an unsigned",
            3,
            KernelArgs::new()
                .output(&y)
                .input(&x)
                .scalar(2.0f32)
                .scalar(4.0f32)
                .clone(),
        ),
        (
            "a u32 buffer for a float*",
            1,
            KernelArgs::new()
                .output(&y)
                .input(&ints)
                .scalar(2.0f32)
                .scalar(4u32)
                .clone(),
        ),
        (
            "an f64 buffer for a float*",
            0,
            KernelArgs::new()
                .output(&doubles)
                .input(&x)
                .scalar(2.0f32)
                .scalar(4u32)
                .clone(),
        ),
        (
            "a value for a pointer",
            1,
            KernelArgs::new()
                .output(&y)
                .scalar(1u64)
                .scalar(2.0f32)
                .scalar(4u32)
                .clone(),
        ),
    ];
    for (what, want_index, args) in &cases {
        match saxpy().launch(&s, one, args) {
            Err(DeviceError::InvalidArgument { index, reason, .. }) => {
                assert_eq!(index, *want_index, "{what}: {reason}");
                // The message quotes the declaration.
                assert!(
                    reason.contains("float") || reason.contains("unsigned"),
                    "{what}: {reason}"
                );
            }
            other => panic!("{what}: expected InvalidArgument at once, got {other:?}"),
        }
    }
    // Nothing ran; the right arguments still work.
    saxpy().launch(
        &s,
        one,
        KernelArgs::new()
            .output(&y)
            .input(&x)
            .scalar(2.0f32)
            .scalar(4u32),
    )?;
    assert_eq!(y.to_host_vec(&s)?, vec![2.0, 4.0, 6.0, 8.0]);
    Ok(())
}

#[test]
fn a_kernel_whose_signature_is_not_read_from_source_is_checked_against_its_compiled_form(
) -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    // The declaration comes from a macro, so the source check cannot see the parameters; on
    // CUDA the compiled function's parameters (their count and sizes) are checked instead,
    // and where the driver cannot report them (before CUDA 12.4) every launch is refused.
    // SAFETY: the kernel writes only `out[0..n)`, below the count it is given.
    let kernel = unsafe {
        Kernel::new(
            "rt_macro_declared",
            r#"#define DECLARE(name) extern "C" __global__ void name(double* out, double v, unsigned n)
            DECLARE(rt_macro_declared) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) out[i] = v;
            }"#,
        )
    }
    .with_host(|args| {
        let v = args.scalar::<f64>(1)?;
        let n = args.scalar::<u32>(2)? as usize;
        for o in args.output::<f64>(0)?.iter_mut().take(n) {
            *o = v;
        }
        Ok(())
    });
    let out = DeviceBuffer::<f64>::zeroed(&s, 4)?;
    let one = LaunchConfig::linear(1, 4);
    let cases: Vec<(&str, KernelArgs<'_>)> = vec![
        (
            "too few",
            KernelArgs::new().output(&out).scalar(2.0f64).clone(),
        ),
        (
            "an f32 for a double",
            KernelArgs::new()
                .output(&out)
                .scalar(2.0f32)
                .scalar(4u32)
                .clone(),
        ),
    ];
    for (what, args) in &cases {
        let r = kernel.launch(&s, one, args).and_then(|()| s.synchronize());
        if device.kind() == BackendKind::Cuda {
            assert!(
                matches!(r, Err(DeviceError::InvalidArgument { .. })),
                "{what}: expected InvalidArgument at once, got {r:?}"
            );
        } else {
            // The host implementation reads its arguments by type and count itself.
            assert!(r.is_err(), "{what}: {r:?}");
        }
    }
    match kernel.launch(
        &s,
        one,
        KernelArgs::new().output(&out).scalar(2.5f64).scalar(4u32),
    ) {
        Err(DeviceError::InvalidArgument { reason, .. })
            if device.kind() == BackendKind::Cuda && reason.contains("CUDA 12.4 or later") =>
        {
            // A driver that cannot report the compiled kernel's parameters: nothing checks
            // the launch, so none is made.
            assert!(reason.contains("no `__global__` declaration"), "{reason}");
            eprintln!("the driver cannot report kernel parameters: {reason}");
        }
        r => {
            r?;
            assert_eq!(out.to_host_vec(&s)?, vec![2.5; 4]);
        }
    }
    Ok(())
}

/// Two arguments overlapping in a buffer the launch writes are refused before the launch, on
/// every backend (on a GPU, the kernel's threads would race); disjoint ranges of one buffer,
/// and reads overlapping in a buffer the launch only reads, are fine.
#[test]
fn overlapping_arguments_of_a_written_buffer_are_refused() -> Result<(), DeviceError> {
    let s = stream();
    let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let buf = DeviceBuffer::from_host(&s, &data)?;
    let config = LaunchConfig::linear(1, 32);
    for (dst, src) in [(4..12, 0..8), (0..8, 4..12), (0..8, 0..8)] {
        let r = copy().launch(
            &s,
            config,
            KernelArgs::new()
                .output(buf.slice(dst.clone())?)
                .input(buf.slice(src.clone())?)
                .scalar(8u32),
        );
        match r {
            Err(DeviceError::InvalidArgument { kernel, reason, .. }) => {
                assert_eq!(kernel, "test_copy");
                assert!(reason.contains("overlaps"), "{reason}");
            }
            other => panic!("{dst:?} from {src:?}: expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(buf.to_host_vec(&s)?, data, "refused launches write nothing");

    // Disjoint ranges of one buffer.
    copy().launch(
        &s,
        config,
        KernelArgs::new()
            .output(buf.slice(8..16)?)
            .input(buf.slice(0..8)?)
            .scalar(8u32),
    )?;
    let mut want = data.clone();
    want.copy_within(0..8, 8);
    assert_eq!(buf.to_host_vec(&s)?, want);

    // Overlapping reads of a buffer the launch does not write.
    let out = DeviceBuffer::<f32>::zeroed(&s, 8)?;
    let src = DeviceBuffer::from_host(&s, &data)?;
    cuflow_testing::kernels::add().launch(
        &s,
        config,
        KernelArgs::new()
            .output(&out)
            .input(src.slice(0..8)?)
            .input(src.slice(4..12)?)
            .scalar(8u32),
    )?;
    let sums: Vec<f32> = (0..8).map(|i| data[i] + data[i + 4]).collect();
    assert_eq!(out.to_host_vec(&s)?, sums);
    assert_stream_usable(&s)
}

/// An empty view overlaps nothing, even where it starts at the first element of a range the
/// launch writes: such a launch runs on every backend, as on a GPU.
#[test]
fn an_empty_argument_beside_or_inside_a_written_range_overlaps_nothing() -> Result<(), DeviceError>
{
    let s = stream();
    // SAFETY: the kernel writes only `y[0..n)`, below the count it is given, one element per
    // thread, and never reads `empty`.
    let double = unsafe {
        Kernel::new(
            "rt_double_beside",
            r#"extern "C" __global__ void rt_double_beside(float* y, const float* empty,
                                                           unsigned n) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] *= 2.0f;
            }"#,
        )
    }
    .with_host(|args| {
        let n = args.scalar::<u32>(2)? as usize;
        assert!(args.input::<f32>(1)?.is_empty());
        for v in args.output::<f32>(0)?.iter_mut().take(n) {
            *v *= 2.0;
        }
        Ok(())
    });
    let data: Vec<f32> = random_f32(&mut rng(), 16);
    let buf = DeviceBuffer::from_host(&s, &data)?;
    let mut want = data.clone();
    // The empty view at the start of the written range, inside it, then at its end.
    for empty_at in [4, 8, 12] {
        double.launch(
            &s,
            LaunchConfig::linear(1, 32),
            KernelArgs::new()
                .output(buf.slice(4..12)?)
                .input(buf.slice(empty_at..empty_at)?)
                .scalar(8u32),
        )?;
        for v in &mut want[4..12] {
            *v *= 2.0;
        }
        assert_eq!(buf.to_host_vec(&s)?, want, "the empty view at {empty_at}");
    }
    assert_stream_usable(&s)
}

/// An empty output writes nothing: reads of the same buffer may overlap it and each other, as
/// in a buffer the launch does not write.
#[test]
fn an_empty_output_inside_ranges_it_reads_writes_nothing() -> Result<(), DeviceError> {
    let s = stream();
    let data: Vec<f32> = random_f32(&mut rng(), 16);
    let buf = DeviceBuffer::from_host(&s, &data)?;
    cuflow_testing::kernels::add().launch(
        &s,
        LaunchConfig::linear(1, 32),
        KernelArgs::new()
            .output(buf.slice(6..6)?)
            .input(buf.slice(0..8)?)
            .input(buf.slice(4..12)?)
            .scalar(0u32),
    )?;
    assert_eq!(buf.to_host_vec(&s)?, data);
    assert_stream_usable(&s)
}

/// A buffer passed as an input is ordered as a read: readers on other streams run beside it.
/// A kernel may write through every pointer parameter its source does not declare `const`, so
/// handing such a parameter an input would let the kernel's writes race with those readers; it
/// is refused before the launch, on every backend. A `const` parameter (`const float*`,
/// `float const*`) takes an input; `float* const` is a constant pointer to writable elements,
/// so it takes outputs only.
#[test]
fn an_input_for_a_parameter_the_kernel_may_write_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    let data: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let x = DeviceBuffer::from_host(&s, &data)?;
    let y = DeviceBuffer::<f32>::zeroed(&s, 8)?;
    let config = LaunchConfig::linear(1, 8);
    // test_add_one(float* x, unsigned n)
    match add_one().launch(&s, config, KernelArgs::new().input(&x).scalar(8u32)) {
        Err(DeviceError::InvalidArgument {
            kernel,
            index,
            reason,
        }) => {
            assert_eq!((kernel.as_str(), index), ("test_add_one", 0), "{reason}");
            assert!(
                reason.contains("float* x") && reason.contains("const"),
                "the reason names the parameter and what is missing: {reason}"
            );
        }
        other => panic!("expected InvalidArgument at once, got {other:?}"),
    }
    // SAFETY: the kernel writes only `y[0..n)` and reads only `x[0..n)`, below the count it
    // is given, one element per thread.
    let twice = unsafe {
        Kernel::new(
            "rt_twice",
            r#"extern "C" __global__ void rt_twice(float const* x, float* const y, unsigned n) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] = 2.0f * x[i];
            }"#,
        )
    }
    .with_host(|args| {
        let x = args.input::<f32>(0)?.to_vec();
        let n = args.scalar::<u32>(2)? as usize;
        for (o, v) in args.output::<f32>(1)?.iter_mut().zip(&x).take(n) {
            *o = 2.0 * v;
        }
        Ok(())
    });
    let r = twice.launch(
        &s,
        config,
        KernelArgs::new().input(&x).input(&y).scalar(8u32),
    );
    match r {
        Err(DeviceError::InvalidArgument { index, reason, .. }) => {
            assert_eq!(index, 1, "{reason}");
            assert!(reason.contains("float* const y"), "{reason}");
        }
        other => panic!("expected InvalidArgument at once, got {other:?}"),
    }
    s.synchronize()?;
    assert_eq!(x.to_host_vec(&s)?, data, "refused launches write nothing");
    assert_eq!(
        y.to_host_vec(&s)?,
        vec![0.0; 8],
        "refused launches write nothing"
    );
    twice.launch(
        &s,
        config,
        KernelArgs::new().input(&x).output(&y).scalar(8u32),
    )?;
    let doubled: Vec<f32> = data.iter().map(|v| 2.0 * v).collect();
    assert_eq!(y.to_host_vec(&s)?, doubled);
    add_one().launch(&s, config, KernelArgs::new().output(&x).scalar(8u32))?;
    let plus_one: Vec<f32> = data.iter().map(|v| v + 1.0).collect();
    assert_eq!(x.to_host_vec(&s)?, plus_one);
    assert_stream_usable(&s)
}

/// Four bytes that are not one of the plain element types the check knows.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Pair([u16; 2]);

/// An element type the check does not know by name is still held to the size of the plain
/// C type the parameter declares: a kernel over `double* out` given a buffer of 4-byte
/// elements would write twice the buffer's bytes. Values are held to it the same way; an
/// unknown type of the declared size passes.
#[test]
fn arguments_of_unknown_types_must_have_the_declared_size() -> Result<(), DeviceError> {
    let s = stream();
    // SAFETY: the kernel writes only `out[0..n)`, below the count it is given.
    let fill = unsafe {
        Kernel::new(
            "rt_fill_f64",
            r#"extern "C" __global__ void rt_fill_f64(double* out, double v, unsigned n) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) out[i] = v;
            }"#,
        )
    }
    .with_host(|args| {
        let v = args.scalar::<f64>(1)?;
        let n = args.scalar::<u32>(2)? as usize;
        for o in args.output::<f64>(0)?.iter_mut().take(n) {
            *o = v;
        }
        Ok(())
    });
    let pairs = DeviceBuffer::from_host(&s, &[Pair([1, 2]); 4])?;
    let doubles = DeviceBuffer::<f64>::zeroed(&s, 4)?;
    let config = LaunchConfig::linear(1, 4);
    let cases: Vec<(&str, usize, &str, KernelArgs<'_>)> = vec![
        (
            "a buffer of 4-byte elements for a double*",
            0,
            "double* out",
            KernelArgs::new()
                .output(&pairs)
                .scalar(1.5f64)
                .scalar(4u32)
                .clone(),
        ),
        (
            "a 4-byte value for a double",
            1,
            "double v",
            KernelArgs::new()
                .output(&doubles)
                .scalar(Pair([1, 2]))
                .scalar(4u32)
                .clone(),
        ),
    ];
    for (what, want_index, param, args) in &cases {
        match fill.launch(&s, config, args) {
            Err(DeviceError::InvalidArgument { index, reason, .. }) => {
                assert_eq!(index, *want_index, "{what}: {reason}");
                assert!(
                    reason.contains(param) && reason.contains("4-byte"),
                    "{what}: the reason names the parameter and the size: {reason}"
                );
            }
            other => panic!("{what}: expected InvalidArgument at once, got {other:?}"),
        }
    }
    assert_eq!(pairs.to_host_vec(&s)?, vec![Pair([1, 2]); 4]);
    // An unknown type of the declared size is taken as it is: four `Pair`s for `unsigned`.
    // SAFETY: the kernel writes only `out[0..n)`, below the count it is given.
    let copy_words = unsafe {
        Kernel::new(
            "rt_copy_words",
            r#"extern "C" __global__ void rt_copy_words(unsigned* out, const unsigned* x, unsigned n) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) out[i] = x[i];
            }"#,
        )
    }
    .with_host(|args| {
        let x = args.input::<Pair>(1)?.to_vec();
        let n = args.scalar::<u32>(2)? as usize;
        for (o, v) in args.output::<Pair>(0)?.iter_mut().zip(&x).take(n) {
            *o = *v;
        }
        Ok(())
    });
    let copied = DeviceBuffer::from_host(&s, &[Pair([0, 0]); 4])?;
    copy_words.launch(
        &s,
        config,
        KernelArgs::new().output(&copied).input(&pairs).scalar(4u32),
    )?;
    assert_eq!(copied.to_host_vec(&s)?, vec![Pair([1, 2]); 4]);
    assert_stream_usable(&s)
}

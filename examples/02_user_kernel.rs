//! A kernel of your own: CUDA C source plus a host implementation, launched over tensors as an
//! op like the built-in kernels, chained after built-in ones.
//!
//! Runs on CUDA device 0 when one is usable, else on the host backend.

use cuflow::prelude::*;

/// `out[r, c] = x[r, c] * scale[c] + shift`, one block per tile of `TILE_ROWS` full rows.
fn scale_shift() -> Kernel {
    // SAFETY: every access of the kernel is below the element counts the launch appends
    // (`n_out`, `n_x`, `n_scale`), whatever the tile, block size and scalars it is given; its
    // threads write distinct elements.
    let kernel = unsafe {
        Kernel::new(
            "scale_shift",
            r#"extern "C" __global__ void scale_shift(float* out, const float* x, const float* scale,
                                                 float shift, unsigned cols, unsigned tile_rows,
                                                 unsigned long long n_out,
                                                 unsigned long long n_x,
                                                 unsigned long long n_scale) {
            if (cols == 0) return;
            const unsigned long long base = (unsigned long long)blockIdx.x * tile_rows * cols;
            for (unsigned i = threadIdx.x; i < tile_rows * cols; i += blockDim.x) {
                const unsigned long long at = base + i;
                if (at < n_out && at < n_x && i % cols < n_scale) {
                    out[at] = x[at] * scale[i % cols] + shift;
                }
            }
        }"#,
        )
    };
    kernel.with_host(|args| {
        let x = args.input::<f32>(1)?;
        let scale = args.input::<f32>(2)?;
        let shift = args.scalar::<f32>(3)?;
        let cols = args.scalar::<u32>(4)? as usize;
        for (i, (o, x)) in args.output::<f32>(0)?.iter_mut().zip(x).enumerate() {
            *o = x * scale[i % cols] + shift;
        }
        Ok(())
    })
}

/// Refuses arguments (it takes none); prints an error of the run with its `Display` form,
/// which says what went wrong and how to fix it (a missing driver names the host backend as
/// the way out), and exits with status 1.
fn main() {
    if let Some(arg) = std::env::args().nth(1) {
        eprintln!("error: unexpected argument {arg:?}; 02_user_kernel takes no arguments");
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
    let (rows, cols, tile_rows) = (64usize, 100usize, 8usize);

    let x = api::randn::<f32>(0.0, 1.0, &[rows, cols]).sync_on(&stream)?;
    let scale = api::linspace::<f32>(0.5, 2.0, cols).sync_on(&stream)?;
    let mut out = api::full::<f32>(&[rows, cols], f32::NAN).sync_on(&stream)?;

    // The user kernel, then a built-in one on its result.
    let kernel = scale_shift();
    let relu = Launch::new(&kernel, (&mut out).partition([tile_rows, cols]))
        .input(&x)
        .input(&scale)
        .scalar(0.25f32)
        .scalar(cols as u32)
        .scalar(tile_rows as u32)
        .then(|out| kernels::relu(out.unpartition().clone()))
        .sync_on(&stream)?;

    let (xh, sh, oh, rh) = (
        x.to_host_vec()?,
        scale.to_host_vec()?,
        out.to_host_vec()?,
        relu.to_host_vec()?,
    );
    let mut worst = 0.0f64;
    for i in 0..rows * cols {
        let want = xh[i] as f64 * sh[i % cols] as f64 + 0.25;
        worst = worst.max((oh[i] as f64 - want).abs() / want.abs().max(1.0));
        worst = worst.max((rh[i] as f64 - want.max(0.0)).abs() / want.abs().max(1.0));
    }
    println!("scale_shift then relu over {rows}x{cols} in tiles of {tile_rows} rows: max relative error {worst:.2e}");
    if worst > 1e-5 {
        return Err(DeviceError::usage(format!(
            "results differ from the reference by {worst}"
        )));
    }
    Ok(())
}

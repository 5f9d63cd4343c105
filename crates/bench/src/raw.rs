//! Raw cudarc baselines: the same launches written directly against cudarc, as a user of the
//! driver bindings would. The only `unsafe` of the benchmark program lives here.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

/// A context, stream and loaded kernel of raw cudarc.
pub(crate) struct Raw {
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    func: CudaFunction,
    arg: Option<CudaSlice<u64>>,
}

fn err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

impl Raw {
    /// Loads `name` from `src` on device 0; `tracking` selects cudarc's per-buffer event
    /// tracking; `with_arg` passes one device buffer to the kernel.
    pub(crate) fn new(
        src: &str,
        name: &str,
        tracking: bool,
        with_arg: bool,
    ) -> Result<Raw, String> {
        let ctx = CudaContext::new(0).map_err(err)?;
        if !tracking {
            // SAFETY: this context object is used only by this baseline, which synchronizes its
            // one stream before reading anything back.
            unsafe { ctx.disable_event_tracking() };
        }
        let stream = ctx.new_stream().map_err(err)?;
        let (major, minor) = ctx.compute_capability().map_err(err)?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let ptx = compile_ptx_with_opts(
            src,
            CompileOptions {
                arch: Some(arch),
                ..Default::default()
            },
        )
        .map_err(err)?;
        let module = ctx.load_module(ptx).map_err(err)?;
        let func = module.load_function(name).map_err(err)?;
        let arg = if with_arg {
            Some(stream.alloc_zeros::<u64>(1).map_err(err)?)
        } else {
            None
        };
        Ok(Raw {
            _ctx: ctx,
            stream,
            func,
            arg,
        })
    }

    /// Launches the kernel `n` times (one thread) and synchronizes; returns seconds.
    pub(crate) fn launch_n(&mut self, n: usize, cycles: u64) -> Result<f64, String> {
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let t = Instant::now();
        for _ in 0..n {
            let mut b = self.stream.launch_builder(&self.func);
            if let Some(a) = self.arg.as_mut() {
                b.arg(a);
                b.arg(&cycles);
            }
            // SAFETY: the kernel's parameters are exactly what was pushed (none, or one
            // `unsigned long long*` to a live buffer and one `unsigned long long`).
            unsafe { b.launch(cfg) }.map_err(err)?;
        }
        self.stream.synchronize().map_err(err)?;
        Ok(t.elapsed().as_secs_f64())
    }
}

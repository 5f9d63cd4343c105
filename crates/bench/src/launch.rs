//! `launch`: the host cost of one kernel launch through cuflow's `Stream`/`Kernel`, beside raw
//! cudarc with its per-buffer event tracking off and on, in the same process.

use std::sync::Arc;
use std::time::Instant;

use cuflow::prelude::*;

use crate::kernels::{empty_kernel, spin_kernel, EMPTY_SRC, SPIN_SRC};
use crate::raw::Raw;
use crate::report::{median, Report, Row};

fn cuflow_launches(
    stream: &Stream,
    kernel: &Kernel,
    counter: Option<&DeviceBuffer<u64>>,
    n: usize,
) -> Result<f64, DeviceError> {
    let cfg = LaunchConfig::linear(1, 1);
    let t = Instant::now();
    match counter {
        None => {
            let args = KernelArgs::new();
            for _ in 0..n {
                kernel.launch(stream, cfg, &args)?;
            }
        }
        Some(c) => {
            for _ in 0..n {
                kernel.launch(stream, cfg, KernelArgs::new().output(c).scalar(0u64))?;
            }
        }
    }
    stream.synchronize()?;
    Ok(t.elapsed().as_secs_f64())
}

pub(crate) fn run(device: &Device, iters: usize) -> Result<Report, String> {
    let e = |e: DeviceError| e.to_string();
    let stream = device.new_stream().map_err(e)?;
    let empty = empty_kernel();
    let one_arg = spin_kernel();
    let counter = Arc::new(DeviceBuffer::<u64>::zeroed(&stream, 1).map_err(e)?);
    let mut raw_off = Raw::new(EMPTY_SRC, "empty_kernel", false, false)?;
    let mut raw_off_arg = Raw::new(SPIN_SRC, "spin_kernel", false, true)?;
    let mut raw_on_arg = Raw::new(SPIN_SRC, "spin_kernel", true, true)?;

    // Warm up: compile, load, first launches.
    cuflow_launches(&stream, &empty, None, 500).map_err(e)?;
    cuflow_launches(&stream, &one_arg, Some(&counter), 500).map_err(e)?;
    raw_off.launch_n(500, 0)?;
    raw_off_arg.launch_n(500, 0)?;
    raw_on_arg.launch_n(500, 0)?;

    let trials = 7;
    let (mut a, mut b, mut c, mut d, mut f) = (vec![], vec![], vec![], vec![], vec![]);
    let per = |s: f64| s * 1e6 / iters as f64;
    for _ in 0..trials {
        a.push(per(
            cuflow_launches(&stream, &empty, None, iters).map_err(e)?
        ));
        b.push(per(raw_off.launch_n(iters, 0)?));
        c.push(per(cuflow_launches(
            &stream,
            &one_arg,
            Some(&counter),
            iters,
        )
        .map_err(e)?));
        d.push(per(raw_off_arg.launch_n(iters, 0)?));
        f.push(per(raw_on_arg.launch_n(iters, 0)?));
    }
    let (a, b, c, d, f) = (
        median(&mut a),
        median(&mut b),
        median(&mut c),
        median(&mut d),
        median(&mut f),
    );
    let row = |name: &str, value: f64, bname: &str, base: f64, goal| Row {
        name: name.into(),
        value,
        unit: "us",
        baseline_name: bname.into(),
        baseline: base,
        lower_is_better: true,
        goal,
    };
    Ok(Report {
        benchmark: "launch".into(),
        device: device.to_string(),
        notes: vec![format!(
            "µs per launch, median of {trials} trials of {iters} back-to-back launches of one \
             thread each, including the final stream synchronize"
        )],
        rows: vec![
            row(
                "cuflow empty kernel",
                a,
                "raw cudarc, tracking off",
                b,
                Some(("<=", 1.10)),
            ),
            row(
                "cuflow 1-buffer kernel",
                c,
                "raw cudarc, tracking off",
                d,
                Some(("<=", 1.10)),
            ),
            row(
                "cuflow 1-buffer kernel",
                c,
                "raw cudarc, tracking on",
                f,
                None,
            ),
        ],
    })
}

//! The strided, broadcast and axis-reduction cases of the kernel benchmark: f32 over an
//! `n × n` matrix ([`STRIDED_N`]), each built and checked against float64 on the host
//! ([`check`], which runs on any device, the host backend included), then timed like the
//! other kernels.

use cuflow::prelude::*;

use super::measure::{sample_indices, Timer};
use super::{SEED, STRIDED_N};
use crate::error::BenchError;

/// One strided or broadcast case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strided {
    /// `x + col`: `[n, n] + [n, 1]`, the column broadcast over the rows (strided kernel).
    BroadcastAdd,
    /// `xᵀ + y`: a transposed view plus a dense matrix (strided kernel).
    TransposedAdd,
    /// `x.sum(axis)` with `axis` 0 (strided reduction) or 1 (the row kernel).
    SumAxis(usize),
    /// `x.argmax(0)` (strided reduction).
    ArgmaxAxis0,
}

impl Strided {
    /// The figure's name.
    pub(super) fn name(self) -> String {
        let n = STRIDED_N;
        match self {
            Strided::BroadcastAdd => format!("add f32 {n}x{n} + {n}x1 (broadcast)"),
            Strided::TransposedAdd => format!("add f32 ({n}x{n})^T + {n}x{n} (strided view)"),
            Strided::SumAxis(axis) => format!("sum_axis f32 {n}x{n}, axis {axis}"),
            Strided::ArgmaxAxis0 => format!("argmax_axis f32 {n}x{n}, axis 0"),
        }
    }

    /// The PyTorch call it is compared with.
    pub(super) fn torch_call(self) -> &'static str {
        match self {
            Strided::BroadcastAdd => "PyTorch x + col",
            Strided::TransposedAdd => "PyTorch x.t() + y",
            Strided::SumAxis(0) => "PyTorch x.sum(0)",
            Strided::SumAxis(_) => "PyTorch x.sum(1)",
            Strided::ArgmaxAxis0 => "PyTorch x.argmax(0)",
        }
    }

    /// Bytes one call must move, in TB: each input read once, the output written once.
    pub(super) fn terabytes(self) -> f64 {
        let (n, f) = (STRIDED_N as f64, 4.0);
        match self {
            Strided::BroadcastAdd => (2.0 * n * n + n) * f / 1e12,
            Strided::TransposedAdd => 3.0 * n * n * f / 1e12,
            Strided::SumAxis(_) | Strided::ArgmaxAxis0 => (n * n + n) * f / 1e12,
        }
    }

    /// The case as the PyTorch script reads it.
    pub(super) fn torch_json(self) -> serde_json::Value {
        let n = STRIDED_N;
        match self {
            Strided::BroadcastAdd => serde_json::json!({"op": "broadcast_add", "n": n}),
            Strided::TransposedAdd => serde_json::json!({"op": "transposed_add", "n": n}),
            Strided::SumAxis(axis) => serde_json::json!({"op": "sum_axis", "n": n, "axis": axis}),
            Strided::ArgmaxAxis0 => serde_json::json!({"op": "argmax_axis", "n": n, "axis": 0}),
        }
    }
}

/// The inputs of a case: an `n × n` matrix `x`, and `y` (`n × 1` or `n × n`) where it has one.
pub(super) struct Inputs {
    x: Tensor<f32>,
    y: Option<Tensor<f32>>,
}

/// Builds the inputs of `case` over `n × n` on `stream`, runs the case once and checks sampled
/// outputs against float64 on the host.
pub(super) fn check(stream: &Stream, case: Strided, n: usize) -> Result<Inputs, BenchError> {
    let x = api::randn_seeded::<f32>(0.0, 1.0, &[n, n], SEED + 11).sync_on(stream)?;
    let xh = x.to_host_vec_on(stream)?;
    let fail = |what: String| Err(BenchError::Verification(what));
    let samples = sample_indices(n * n, 257, SEED + 12);
    match case {
        Strided::BroadcastAdd | Strided::TransposedAdd => {
            let y_shape = if case == Strided::BroadcastAdd {
                [n, 1]
            } else {
                [n, n]
            };
            let y = api::randn_seeded::<f32>(0.0, 1.0, &y_shape, SEED + 13).sync_on(stream)?;
            let yh = y.to_host_vec_on(stream)?;
            let inputs = Inputs { x, y: Some(y) };
            let out = enqueue_op(&inputs, case)?.sync_on(stream)?;
            let got = out.to_host_vec_on(stream)?;
            for i in samples {
                let (r, c) = (i / n, i % n);
                let want = if case == Strided::BroadcastAdd {
                    f64::from(xh[i]) + f64::from(yh[r])
                } else {
                    f64::from(xh[c * n + r]) + f64::from(yh[i])
                };
                if (f64::from(got[i]) - want).abs() > 1e-6 * want.abs().max(1.0) {
                    return fail(format!(
                        "{}: element ({r}, {c}) is {}, expected {want}",
                        case.name(),
                        got[i]
                    ));
                }
            }
            Ok(inputs)
        }
        Strided::SumAxis(axis) => {
            let inputs = Inputs { x, y: None };
            let got = kernels::sum_axis(&inputs.x, axis, false)
                .sync_on(stream)?
                .to_host_vec_on(stream)?;
            for o in sample_indices(n, 64, SEED + 14) {
                let at = |k: usize| {
                    f64::from(if axis == 0 {
                        xh[k * n + o]
                    } else {
                        xh[o * n + k]
                    })
                };
                let (want, mag) = (0..n).fold((0.0, 0.0), |(s, m), k| (s + at(k), m + at(k).abs()));
                if (f64::from(got[o]) - want).abs() > 1e-5 * mag {
                    return fail(format!(
                        "{}: output {o} is {}, expected {want}",
                        case.name(),
                        got[o]
                    ));
                }
            }
            Ok(inputs)
        }
        Strided::ArgmaxAxis0 => {
            let inputs = Inputs { x, y: None };
            let got = kernels::argmax_axis(&inputs.x, 0, false)
                .sync_on(stream)?
                .to_host_vec_on(stream)?;
            for o in sample_indices(n, 64, SEED + 15) {
                let mut best = 0;
                for k in 1..n {
                    if xh[k * n + o] > xh[best * n + o] {
                        best = k;
                    }
                }
                if got[o] as usize != best {
                    return fail(format!(
                        "{}: output {o} is {}, expected {best}",
                        case.name(),
                        got[o]
                    ));
                }
            }
            Ok(inputs)
        }
    }
}

/// The op of an elementwise case over `inputs`.
fn enqueue_op(
    inputs: &Inputs,
    case: Strided,
) -> Result<impl DeviceOp<Output = Tensor<f32>> + '_, BenchError> {
    let y = inputs.y.as_ref().ok_or_else(|| {
        BenchError::Verification(format!("{}: the second input is missing", case.name()))
    })?;
    let x = if case == Strided::TransposedAdd {
        inputs.x.transpose(0, 1)?
    } else {
        inputs.x.clone()
    };
    Ok(kernels::add(x, y))
}

/// `case` over [`STRIDED_N`]² checked once, then timed: milliseconds per launch of each trial.
pub(super) fn measure(timer: &Timer, case: Strided) -> Result<Vec<f64>, BenchError> {
    let inputs = check(&timer.stream, case, STRIDED_N)?;
    match case {
        Strided::BroadcastAdd | Strided::TransposedAdd => {
            timer.trials(|| timer.enqueue(enqueue_op(&inputs, case)?))
        }
        Strided::SumAxis(axis) => {
            timer.trials(|| timer.enqueue(kernels::sum_axis(&inputs.x, axis, false)))
        }
        Strided::ArgmaxAxis0 => {
            timer.trials(|| timer.enqueue(kernels::argmax_axis(&inputs.x, 0, false)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case builds, runs and passes its check on the host backend (small `n`).
    #[test]
    fn every_case_checks_on_the_host() {
        let stream = Device::host().new_stream().unwrap();
        for case in [
            Strided::BroadcastAdd,
            Strided::TransposedAdd,
            Strided::SumAxis(0),
            Strided::SumAxis(1),
            Strided::ArgmaxAxis0,
        ] {
            check(&stream, case, 67).unwrap_or_else(|e| panic!("{}: {e}", case.name()));
        }
    }
}

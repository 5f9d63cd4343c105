//! Random programs of views and kernels, each step checked against a float64 model of the
//! same step computed here: the model says whether the step is valid (then the tensor's
//! shape and elements must match it) or not (then the step must fail with a
//! [`DeviceError::InvalidShape`] or [`DeviceError::ShapeMismatch`], never panic, never report
//! an internal error). Shapes are small and include zero-length axes; the views the steps
//! build (narrowed, selected, transposed, permuted, expanded) feed the kernels that follow, so
//! the kernels read every kind of strided operand. `f32` and `f64`, and the half types, whose
//! kernels compute in `f32`. Each step's model starts from the elements the step before read
//! back, so a step is held to its own rounding. `CUFLOW_RANDOM_PROGRAMS=N` runs N times as
//! many programs.

use cuflow_device_op::{DeviceOp, DeviceOpExt};
use cuflow_graph_capture::GraphCaptureExt;
use cuflow_runtime::{DeviceError, GemmElem, Stream};
use cuflow_tensor::{api, bf16, f16, kernels, FloatDType, Tensor};
use cuflow_testing::{
    device::stream,
    rng::{scale_from_env, seeded_rng},
};
use rand::rngs::StdRng;
use rand::Rng;

/// A row-major float64 tensor: what a step should produce.
#[derive(Clone, Debug)]
struct Model {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl Model {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Row-major strides of the shape.
    fn strides(&self) -> Vec<usize> {
        let mut s = vec![1; self.shape.len()];
        for a in (0..self.shape.len().saturating_sub(1)).rev() {
            s[a] = s[a + 1] * self.shape[a + 1];
        }
        s
    }

    /// The model of shape `shape` whose element at index `i` is `f(i)`.
    fn build(shape: Vec<usize>, f: impl Fn(&[usize]) -> f64) -> Model {
        let n: usize = shape.iter().product();
        let mut idx = vec![0; shape.len()];
        let data = (0..n)
            .map(|mut k| {
                for a in (0..shape.len()).rev() {
                    idx[a] = k % shape[a];
                    k /= shape[a];
                }
                f(&idx)
            })
            .collect();
        Model { shape, data }
    }

    fn at(&self, idx: &[usize]) -> f64 {
        let offset = idx
            .iter()
            .zip(&self.shape)
            .fold(0, |acc, (&i, &d)| acc * d + i);
        self.data[offset]
    }

    fn narrow(&self, axis: usize, start: usize, len: usize) -> Option<Model> {
        (axis < self.shape.len() && start + len <= self.shape[axis]).then(|| {
            let mut shape = self.shape.clone();
            shape[axis] = len;
            Model::build(shape, |i| {
                let mut j = i.to_vec();
                j[axis] += start;
                self.at(&j)
            })
        })
    }

    fn select(&self, axis: usize, index: usize) -> Option<Model> {
        (axis < self.shape.len() && index < self.shape[axis]).then(|| {
            let mut shape = self.shape.clone();
            shape.remove(axis);
            Model::build(shape, |i| {
                let mut j = i.to_vec();
                j.insert(axis, index);
                self.at(&j)
            })
        })
    }

    fn permute(&self, order: &[usize]) -> Option<Model> {
        let mut seen = vec![false; self.shape.len()];
        let is_perm = order.len() == self.shape.len()
            && order
                .iter()
                .all(|&a| a < seen.len() && !std::mem::replace(&mut seen[a], true));
        is_perm.then(|| {
            let shape = order.iter().map(|&a| self.shape[a]).collect();
            Model::build(shape, |i| {
                let mut j = vec![0; order.len()];
                for (k, &a) in order.iter().enumerate() {
                    j[a] = i[k];
                }
                self.at(&j)
            })
        })
    }

    fn transpose(&self, a: usize, b: usize) -> Option<Model> {
        let r = self.shape.len();
        if a >= r || b >= r {
            return None;
        }
        let mut order: Vec<usize> = (0..r).collect();
        order.swap(a, b);
        self.permute(&order)
    }

    fn unsqueeze(&self, axis: usize) -> Option<Model> {
        (axis <= self.shape.len()).then(|| {
            let mut m = self.clone();
            m.shape.insert(axis, 1);
            m
        })
    }

    fn squeeze(&self, axis: usize) -> Option<Model> {
        (axis < self.shape.len() && self.shape[axis] == 1).then(|| {
            let mut m = self.clone();
            m.shape.remove(axis);
            m
        })
    }

    /// NumPy's broadcast of this model to `shape`.
    fn expand(&self, shape: &[usize]) -> Option<Model> {
        let (r, n) = (self.shape.len(), shape.len());
        if n < r {
            return None;
        }
        let lead = n - r;
        let fits = self
            .shape
            .iter()
            .zip(&shape[lead..])
            .all(|(&d, &s)| d == s || d == 1);
        fits.then(|| {
            Model::build(shape.to_vec(), |i| {
                let j: Vec<usize> = self
                    .shape
                    .iter()
                    .zip(&i[lead..])
                    .map(|(&d, &k)| if d == 1 { 0 } else { k })
                    .collect();
                self.at(&j)
            })
        })
    }

    /// The broadcast shape of two shapes, when they broadcast.
    fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
        let n = a.len().max(b.len());
        (0..n)
            .map(|k| {
                let x = if k + a.len() >= n {
                    a[k + a.len() - n]
                } else {
                    1
                };
                let y = if k + b.len() >= n {
                    b[k + b.len() - n]
                } else {
                    1
                };
                match (x, y) {
                    _ if x == y => Some(x),
                    (1, y) => Some(y),
                    (x, 1) => Some(x),
                    _ => None,
                }
            })
            .collect()
    }

    fn zip(&self, other: &Model, f: impl Fn(f64, f64) -> f64) -> Option<Model> {
        let shape = Model::broadcast(&self.shape, &other.shape)?;
        let (x, y) = (self.expand(&shape)?, other.expand(&shape)?);
        Some(Model {
            data: x.data.iter().zip(&y.data).map(|(a, b)| f(*a, *b)).collect(),
            shape,
        })
    }

    /// A reduction over `axis` of its lanes, each lane given to `f` in order.
    fn reduce(&self, axis: usize, keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Option<Model> {
        if axis >= self.shape.len() {
            return None;
        }
        let mut shape = self.shape.clone();
        shape[axis] = 1;
        let kept = Model::build(shape, |i| {
            let mut j = i.to_vec();
            let lane: Vec<f64> = (0..self.shape[axis])
                .map(|k| {
                    j[axis] = k;
                    self.at(&j)
                })
                .collect();
            f(&lane)
        });
        Some(if keepdim {
            kept
        } else {
            let mut m = kept;
            m.shape.remove(axis);
            m
        })
    }

    /// A lane-wise map along `axis`: each lane replaced by `f` of it.
    fn along(&self, axis: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Option<Model> {
        if axis >= self.shape.len() {
            return None;
        }
        let mut out = self.clone();
        let s = self.strides();
        let outer: Vec<usize> = (0..self.len())
            .filter(|&k| (k / s[axis]).is_multiple_of(self.shape[axis]))
            .collect();
        for base in outer {
            let lane: Vec<f64> = (0..self.shape[axis])
                .map(|k| self.data[base + k * s[axis]])
                .collect();
            for (k, v) in f(&lane).into_iter().enumerate() {
                out.data[base + k * s[axis]] = v;
            }
        }
        Some(out)
    }

    /// `[m, k] · [k, n]`, or batched: `[b, m, k] · [b, k, n]`, `[b, m, k] · [k, n]`.
    fn matmul(&self, other: &Model) -> Option<Model> {
        let (batch, m, k) = match self.shape[..] {
            [m, k] => (None, m, k),
            [b, m, k] => (Some(b), m, k),
            _ => return None,
        };
        let (k2, n) = match (&other.shape[..], batch) {
            (&[k2, n], _) => (k2, n),
            (&[b2, k2, n], Some(b)) if b2 == b => (k2, n),
            _ => return None,
        };
        if k != k2 {
            return None;
        }
        let shape = match batch {
            Some(b) => vec![b, m, n],
            None => vec![m, n],
        };
        Some(Model::build(shape, |i| {
            let (b, r, c) = match *i {
                [b, r, c] => (Some(b), r, c),
                [r, c] => (None, r, c),
                _ => unreachable!("a product is 2-D or 3-D"),
            };
            (0..k)
                .map(|p| {
                    let a = match b {
                        Some(b) => self.at(&[b, r, p]),
                        None => self.at(&[r, p]),
                    };
                    let y = match (b, other.shape.len()) {
                        (Some(b), 3) => other.at(&[b, p, c]),
                        _ => other.at(&[p, c]),
                    };
                    a * y
                })
                .sum()
        }))
    }
}

fn softmax(lane: &[f64]) -> Vec<f64> {
    let m = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = lane.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

fn log_softmax(lane: &[f64]) -> Vec<f64> {
    let m = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = lane.iter().map(|v| (v - m).exp()).sum();
    lane.iter().map(|v| v - m - s.ln()).collect()
}

/// The step a program takes next, its arguments drawn at random (often out of range).
#[derive(Clone, Debug)]
enum Step {
    Narrow(usize, usize, usize),
    Select(usize, usize),
    Transpose(usize, usize),
    Permute(Vec<usize>),
    Unsqueeze(usize),
    Squeeze(usize),
    ExpandLead(usize),
    ExpandOnes(Vec<usize>),
    Contiguous,
    SumAxis(usize, bool),
    MeanAxis(usize, bool),
    MaxAxis(usize, bool),
    MinAxis(usize, bool),
    SoftmaxAxis(usize),
    LogSoftmaxAxis(usize),
    AddFirst,
    MulSelf,
    SubRow,
    Clamp(f32, f32),
    Softmax,
    Sum,
    MatmulTransposed,
    MatmulFirst,
    /// `concat([x, x.narrow(axis, 0, 1)], axis)`, or `concat([x, x], axis)` for a rank 0 `x`.
    ConcatHead(usize),
    Stack(usize),
    RmsNorm,
    LayerNorm,
}

fn draw(rng: &mut StdRng, rank: usize) -> Step {
    let ax = rng.gen_range(0..rank + 2);
    let (a, b) = (rng.gen_range(0..5), rng.gen_range(0..5));
    let keep = rng.gen_bool(0.5);
    match rng.gen_range(0..27) {
        0 => Step::Narrow(ax, a, b),
        1 => Step::Select(ax, a),
        2 => Step::Transpose(ax, rng.gen_range(0..rank + 1)),
        3 => {
            let mut order: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            if rng.gen_bool(0.15) {
                order.push(ax);
            }
            Step::Permute(order)
        }
        4 => Step::Unsqueeze(ax),
        5 => Step::Squeeze(ax),
        6 => Step::ExpandLead(a),
        7 => Step::ExpandOnes((0..rank).map(|_| rng.gen_range(1..4)).collect()),
        8 => Step::Contiguous,
        9 => Step::SumAxis(ax, keep),
        10 => Step::MeanAxis(ax, keep),
        11 => Step::MaxAxis(ax, keep),
        12 => Step::MinAxis(ax, keep),
        13 => Step::SoftmaxAxis(ax),
        14 => Step::LogSoftmaxAxis(ax),
        15 => Step::AddFirst,
        16 => Step::MulSelf,
        17 => Step::SubRow,
        18 if keep => Step::Clamp(-0.5, 0.5),
        18 => Step::Clamp(0.5, -0.5),
        19 => Step::Softmax,
        20 => Step::Sum,
        21 => Step::MatmulTransposed,
        22 => Step::MatmulFirst,
        23 => Step::ConcatHead(ax),
        24 => Step::Stack(ax),
        25 => Step::RmsNorm,
        _ => Step::LayerNorm,
    }
}

/// What the step should give: `Some` model when it is valid, `None` when it must fail.
fn model_step(step: &Step, x: &Model, first: &Model) -> Option<Model> {
    let r = x.shape.len();
    match *step {
        Step::Narrow(ax, s, l) => x.narrow(ax, s, l),
        Step::Select(ax, i) => x.select(ax, i),
        Step::Transpose(a, b) => x.transpose(a, b),
        Step::Permute(ref order) => x.permute(order),
        Step::Unsqueeze(ax) => x.unsqueeze(ax),
        Step::Squeeze(ax) => x.squeeze(ax),
        Step::ExpandLead(n) => {
            let mut shape = vec![n];
            shape.extend(&x.shape);
            x.expand(&shape)
        }
        Step::ExpandOnes(ref lens) => {
            let shape: Vec<usize> = x
                .shape
                .iter()
                .zip(lens)
                .map(|(&d, &l)| if d == 1 { l } else { d })
                .collect();
            x.expand(&shape)
        }
        Step::Contiguous => Some(x.clone()),
        Step::SumAxis(ax, k) => x.reduce(ax, k, |l| l.iter().sum()),
        // The mean, maximum and minimum of no elements are errors.
        Step::MeanAxis(ax, k) if ax < r && x.shape[ax] > 0 => {
            x.reduce(ax, k, |l| l.iter().sum::<f64>() / l.len() as f64)
        }
        Step::MaxAxis(ax, k) if ax < r && x.shape[ax] > 0 => x.reduce(ax, k, |l| {
            l.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        }),
        Step::MinAxis(ax, k) if ax < r && x.shape[ax] > 0 => {
            x.reduce(ax, k, |l| l.iter().copied().fold(f64::INFINITY, f64::min))
        }
        Step::MeanAxis(..) | Step::MaxAxis(..) | Step::MinAxis(..) => None,
        Step::SoftmaxAxis(ax) => x.along(ax, softmax),
        Step::LogSoftmaxAxis(ax) => x.along(ax, log_softmax),
        Step::AddFirst => x.zip(first, |a, b| a + b),
        Step::MulSelf => x.zip(x, |a, b| a * b),
        Step::SubRow if r >= 1 => {
            let row = x.narrow(r - 1, 0, x.shape[r - 1].min(1))?;
            x.zip(&row, |a, b| a - b)
        }
        Step::SubRow => None,
        // `max` everywhere when `min > max`, as PyTorch.
        Step::Clamp(lo, hi) => Some(Model {
            shape: x.shape.clone(),
            data: x
                .data
                .iter()
                .map(|&v| v.max(f64::from(lo)).min(f64::from(hi)))
                .collect(),
        }),
        Step::Softmax if r >= 1 => x.along(r - 1, softmax),
        // `[.., n] → [..]`, and `[n] → [1]`.
        Step::Sum if r >= 1 => x.reduce(r - 1, r == 1, |l| l.iter().sum()),
        Step::Softmax | Step::Sum => None,
        Step::MatmulTransposed => {
            let r = x.shape.len();
            x.matmul(&x.transpose(r.checked_sub(2)?, r - 1)?)
        }
        Step::MatmulFirst => x.matmul(first),
        Step::ConcatHead(ax) => {
            let head = x.narrow(ax, 0, x.shape.get(ax)?.min(&1).to_owned())?;
            let mut shape = x.shape.clone();
            shape[ax] += head.shape[ax];
            Some(Model::build(shape, |i| {
                if i[ax] < x.shape[ax] {
                    x.at(i)
                } else {
                    let mut j = i.to_vec();
                    j[ax] -= x.shape[ax];
                    head.at(&j)
                }
            }))
        }
        Step::Stack(ax) => {
            let one = x.unsqueeze(ax)?;
            let mut shape = one.shape.clone();
            shape[ax] = 2;
            one.expand(&shape)
        }
        // Over the last axis, with weights 0.5 (and a bias of 0.25).
        Step::RmsNorm if r >= 1 => x.along(r - 1, |l| {
            let ms = l.iter().map(|v| v * v).sum::<f64>() / l.len() as f64;
            l.iter().map(|v| 0.5 * v / (ms + 1e-5).sqrt()).collect()
        }),
        Step::LayerNorm if r >= 1 => x.along(r - 1, |l| {
            let n = l.len() as f64;
            let mean = l.iter().sum::<f64>() / n;
            let var = l.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
            l.iter()
                .map(|v| 0.5 * (v - mean) / (var + 1e-5).sqrt() + 0.25)
                .collect()
        }),
        Step::RmsNorm | Step::LayerNorm => None,
    }
}

/// The unit roundoff of `f32`, in which the kernels of every float type but `f64` compute.
const F32_ROUNDOFF: f64 = 1.0 / (1u64 << 24) as f64;

/// Absolute error a step may add beyond the rounding of its output, where its result is
/// ill-conditioned in its input: the softmax family shifts by the row's maximum (an error of
/// the input's order of magnitude in `f32`), and the layer norm divides `x - mean` by
/// `sqrt(var + eps)`, which magnifies the rounding of the mean of a nearly constant row by up
/// to `1 / sqrt(eps)`.
fn slack(step: &Step, x: &Model) -> f64 {
    let max_abs = |l: &[f64]| l.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    match *step {
        Step::Softmax | Step::SoftmaxAxis(_) | Step::LogSoftmaxAxis(_) => {
            8.0 * F32_ROUNDOFF * max_abs(&x.data)
        }
        Step::LayerNorm => {
            let cols = x.shape.last().copied().unwrap_or(0);
            if cols == 0 {
                return 0.0;
            }
            x.data
                .chunks(cols)
                .map(|l| {
                    let n = l.len() as f64;
                    let mean = l.iter().sum::<f64>() / n;
                    let var = l.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
                    // The norm's weight is 0.5.
                    0.5 * 8.0 * F32_ROUNDOFF * max_abs(l) * (1.0 + n.log2()) / (var + 1e-5).sqrt()
                })
                .fold(0.0, f64::max)
        }
        _ => 0.0,
    }
}

/// How a program runs its kernels.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `sync_on` the program's stream.
    Eager,
    /// Captured into a graph on the program's stream, replayed once, the graph's output
    /// read (the inputs are eager tensors, which the replay reads).
    Captured,
}

/// Runs a kernel's op as `mode` says.
fn execute<'a, T: FloatDType>(
    op: impl DeviceOp<Output = Tensor<T>> + 'a,
    s: &Stream,
    mode: Mode,
) -> Result<Tensor<T>, DeviceError> {
    match mode {
        Mode::Eager => op.sync_on(s),
        Mode::Captured => {
            let mut graph = op.graph_on(s.clone())?;
            graph.replay_and_wait()?;
            Ok(graph.take_output().expect("the captured kernel's output"))
        }
    }
}

/// The step run on the device under test.
fn run_step<T: FloatDType + GemmElem>(
    step: &Step,
    x: &Tensor<T>,
    first: &Tensor<T>,
    s: &Stream,
    mode: Mode,
) -> Result<Tensor<T>, DeviceError> {
    let r = x.rank();
    macro_rules! run {
        ($op:expr) => {
            execute($op, s, mode)
        };
    }
    match *step {
        Step::Narrow(ax, st, l) => x.narrow(ax, st, l),
        Step::Select(ax, i) => x.select(ax, i),
        Step::Transpose(a, b) => x.transpose(a, b),
        Step::Permute(ref order) => x.permute(order),
        Step::Unsqueeze(ax) => x.unsqueeze(ax),
        Step::Squeeze(ax) => x.squeeze(ax),
        Step::ExpandLead(n) => {
            let mut shape = vec![n];
            shape.extend(x.shape());
            x.expand(&shape)
        }
        Step::ExpandOnes(ref lens) => {
            let shape: Vec<usize> = x
                .shape()
                .iter()
                .zip(lens)
                .map(|(&d, &l)| if d == 1 { l } else { d })
                .collect();
            x.expand(&shape)
        }
        Step::Contiguous => run!(x.contiguous()),
        Step::SumAxis(ax, k) => run!(x.sum_axis(ax, k)),
        Step::MeanAxis(ax, k) => run!(x.mean_axis(ax, k)),
        Step::MaxAxis(ax, k) => run!(x.max_axis(ax, k)),
        Step::MinAxis(ax, k) => run!(x.min_axis(ax, k)),
        Step::SoftmaxAxis(ax) => run!(x.softmax_axis(ax)),
        Step::LogSoftmaxAxis(ax) => run!(x.log_softmax_axis(ax)),
        Step::AddFirst => run!(kernels::add(x, first)),
        Step::MulSelf => run!(kernels::mul(x, x)),
        Step::SubRow => {
            if r == 0 {
                return run!(kernels::sub(x, x.narrow(0, 0, 0)?));
            }
            let row = x.narrow(r - 1, 0, x.shape()[r - 1].min(1))?;
            run!(kernels::sub(x, &row))
        }
        Step::Clamp(lo, hi) => run!(x.clamp(T::from_f64(lo.into()), T::from_f64(hi.into()))),
        Step::Softmax => run!(kernels::softmax(x)),
        Step::Sum => run!(kernels::sum(x)),
        Step::MatmulTransposed => {
            let t = x.transpose(r.saturating_sub(2), r.saturating_sub(1))?;
            run!(kernels::matmul(x, &t))
        }
        Step::MatmulFirst => run!(kernels::matmul(x, first)),
        Step::ConcatHead(ax) => {
            if r == 0 {
                return run!(kernels::concat(vec![x, x], ax));
            }
            let head = x.narrow(ax, 0, x.shape().get(ax).map_or(0, |&d| d.min(1)));
            let head = match head {
                Ok(head) => head,
                // The axis is out of range: concat must say so too.
                Err(_) => x.clone(),
            };
            run!(kernels::concat(vec![x, &head], ax))
        }
        Step::Stack(ax) => run!(kernels::stack(vec![x, x], ax)),
        Step::RmsNorm | Step::LayerNorm => {
            let cols = x.shape().last().copied().unwrap_or(0);
            let w = api::full(&[cols], T::from_f64(0.5)).sync_on(s)?;
            if let Step::RmsNorm = step {
                return run!(kernels::rms_norm(x, &w, 1e-5));
            }
            let b = api::full(&[cols], T::from_f64(0.25)).sync_on(s)?;
            run!(kernels::layer_norm(x, &w, &b, 1e-5))
        }
    }
}

/// Half the distance from 1 to the next value of `T`.
fn unit_roundoff<T: FloatDType>() -> f64 {
    let mut e = 1.0f64;
    while T::from_f64(1.0 + e / 2.0).to_f64() > 1.0 {
        e /= 2.0;
    }
    e / 2.0
}

/// Checks one step's outcome against its model. A valid step gives the tensor to go on with
/// and its elements as read back, which the next step's model starts from (so that each step
/// is held to the rounding of one step, not of every step before it).
fn check<T: FloatDType>(
    what: &str,
    got: Result<Tensor<T>, DeviceError>,
    want: Option<&Model>,
    slack: f64,
) -> Option<(Tensor<T>, Model)> {
    match (got, want) {
        (Ok(t), Some(m)) => {
            assert_eq!(t.shape(), &m.shape[..], "{what}: shape");
            let v = t.to_host_vec().expect("read a result back");
            assert_eq!(v.len(), m.len(), "{what}: elements read back");
            // The rounding of one step to `T` (its kernels compute in `f32` or wider):
            // relative to the element, and to the output's magnitude for elements that
            // sums cancelled.
            let eps = unit_roundoff::<T>();
            let scale = m.data.iter().fold(0.0f64, |a, w| a.max(w.abs()));
            for (k, (g, w)) in v.iter().zip(&m.data).enumerate() {
                // Past `T`'s largest value the element is infinite (`f16` overflows at
                // 65,520); within a percent of that bound, either is right.
                let (lo, hi) = (
                    T::from_f64(w * 0.99).to_f64(),
                    T::from_f64(w * 1.01).to_f64(),
                );
                if hi.is_infinite() {
                    if lo.is_infinite() {
                        assert_eq!(g.to_f64(), lo, "{what}: element {k} (the model: {w})");
                    }
                    continue;
                }
                let err = (g.to_f64() - w).abs();
                assert!(
                    err <= 4.0 * eps * w.abs() + 1e-5 * scale + 1e-6 + slack,
                    "{what}: element {k} is {}, the float64 model gives {w}",
                    g.to_f64()
                );
            }
            let read = Model {
                shape: m.shape.clone(),
                data: v.iter().map(|g| g.to_f64()).collect(),
            };
            Some((t, read))
        }
        (Ok(t), None) => panic!(
            "{what}: succeeded with shape {:?}, but the step is invalid",
            t.shape()
        ),
        (Err(e), Some(m)) => panic!("{what}: failed ({e}), the model gives shape {:?}", m.shape),
        (Err(e), None) => {
            assert!(
                matches!(
                    e,
                    DeviceError::InvalidShape { .. } | DeviceError::ShapeMismatch { .. }
                ),
                "{what}: an invalid step must fail with a shape error, got {e:?}"
            );
            None
        }
    }
}

/// Runs `count` programs of five steps from inputs of up to `max_rank` axes whose lengths are
/// drawn from `lens`; returns how many steps were valid and how many invalid.
fn run_programs<T: FloatDType + GemmElem>(
    seed: u64,
    count: usize,
    max_rank: usize,
    lens: &[usize],
    mode: Mode,
) -> (usize, usize) {
    let count = count * scale_from_env("CUFLOW_RANDOM_PROGRAMS");
    let s = stream();
    let mut rng = seeded_rng(seed);
    let (mut valid, mut invalid) = (0usize, 0usize);
    for program in 0..count {
        let rank = rng.gen_range(0..=max_rank);
        let shape: Vec<usize> = (0..rank)
            .map(|_| lens[rng.gen_range(0..lens.len())])
            .collect();
        let n: usize = shape.iter().product();
        let data: Vec<T> = (0..n)
            .map(|_| T::from_f64(rng.gen_range(-2.0..2.0)))
            .collect();
        let first = api::from_slice(&data, &shape)
            .sync_on(&s)
            .expect("upload the program's input");
        let first_model = Model {
            shape: shape.clone(),
            data: data.iter().map(|v| v.to_f64()).collect(),
        };
        let (mut x, mut m) = (first.clone(), first_model.clone());
        let mut steps = Vec::new();
        for _ in 0..5 {
            let step = draw(&mut rng, x.rank());
            steps.push(step.clone());
            let what = format!(
                "{} program {program} of seed {seed:#x} ({mode:?}) from {shape:?}, steps {steps:?}",
                T::NAME
            );
            let want = model_step(&step, &m, &first_model);
            let got = run_step(&step, &x, &first, &s, mode);
            match check(&what, got, want.as_ref(), slack(&step, &m)) {
                Some((t, read)) => {
                    valid += 1;
                    // Keep the programs small, and their values too: products and sums of
                    // sums grow.
                    if t.len() <= 8192 {
                        (x, m) = (t, read);
                        if m.data.iter().any(|v| v.abs() > 1e3) {
                            break;
                        }
                    }
                }
                None => invalid += 1,
            }
        }
    }
    (valid, invalid)
}

/// Both kinds of step must have been exercised in numbers.
#[track_caller]
fn assert_both_kinds((valid, invalid): (usize, usize), at_least: usize) {
    assert!(
        valid >= at_least && invalid >= at_least / 2,
        "{valid} valid, {invalid} invalid steps"
    );
}

#[test]
fn random_programs_over_small_shapes_match_a_float64_model() {
    assert_both_kinds(
        run_programs::<f32>(0x5eed_5eed, 1000, 4, &[0, 1, 2, 3, 4], Mode::Eager),
        2000,
    );
    assert_both_kinds(
        run_programs::<f64>(0x5eed_0f64, 200, 4, &[0, 1, 2, 3], Mode::Eager),
        400,
    );
}

/// Half types: their kernels compute in `f32` and round once.
#[test]
fn random_programs_of_half_types_match_a_float64_model() {
    assert_both_kinds(
        run_programs::<f16>(0x5eed_0f16, 300, 4, &[0, 1, 2, 3, 5], Mode::Eager),
        500,
    );
    assert_both_kinds(
        run_programs::<bf16>(0x5eed_bf16, 300, 4, &[0, 1, 2, 3, 5], Mode::Eager),
        500,
    );
}

/// Axes long enough for the kernels' tiled and multi-block paths (32 × 32 tiles, rows of
/// several warps), beside empty and unit ones.
#[test]
fn random_programs_over_longer_axes_match_a_float64_model() {
    assert_both_kinds(
        run_programs::<f32>(0x0010_a5e5, 200, 3, &[0, 1, 3, 33, 40], Mode::Eager),
        400,
    );
}

/// The kernels captured into a graph and replayed instead of run: every kernel must capture
/// (none waits for the host or reads values back while it runs) and its replay must give
/// what the eager kernel gives; an invalid step fails the capture with its shape error.
#[test]
fn random_programs_of_captured_kernels_match_a_float64_model() {
    assert_both_kinds(
        run_programs::<f32>(0xca97_0f32, 300, 4, &[0, 1, 2, 3, 4], Mode::Captured),
        400,
    );
    assert_both_kinds(
        run_programs::<bf16>(0xca97_bf16, 100, 3, &[0, 1, 3, 33], Mode::Captured),
        120,
    );
}

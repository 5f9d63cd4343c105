//! Test ops made with `from_fn` over the [`crate::kernels`], on buffers shared between
//! the ops and the test as `Arc<DeviceBuffer<f32>>`, so that the ops are `'static` (they can be
//! awaited, spawned and shared); making and reading such buffers; and [`Gate`], a stream held
//! back until the test lets it go.
//!
//! Reading a buffer back orders itself after every stream that used it, so a test that checks
//! the executor's events must combine results *on the device* (with [`add`], [`copy`] or
//! [`sum_into`] in a later `then`) before reading them: a missing wait then shows as a wrong
//! value.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use cuflow_device_op::{
    from_fn, join_all, DeviceOp, DeviceOpExt, ExecutionContext, ExecutionStats, FromFn,
};
use cuflow_runtime::{
    Device, DeviceBuffer, DeviceError, Event, Kernel, KernelArgs, LaunchConfig, Stream, StreamId,
};

use crate::device::device;
use crate::kernels;

/// A buffer shared between ops and the test.
pub type Buf = Arc<DeviceBuffer<f32>>;

/// Elements per test buffer.
pub const LEN: usize = 1024;

/// Cycles of a spin: about 20 ms at 2 GHz on CUDA, a 20 ms sleep on the host.
pub const SPIN: u64 = 40_000_000;

fn elems(buf: &DeviceBuffer<f32>) -> (LaunchConfig, u32) {
    (LaunchConfig::for_num_elems(buf.len()), buf.len() as u32)
}

// ---------------------------------------------------------------------------------------------
// Ops: each one `from_fn` over a kernel launch or two.
// ---------------------------------------------------------------------------------------------

/// The closures the test ops are made of (so that their types can be named in signatures).
pub trait OpFn<T>:
    FnOnce(&mut ExecutionContext) -> Result<T, DeviceError> + Send + 'static
{
}

impl<T, F> OpFn<T> for F where
    F: FnOnce(&mut ExecutionContext) -> Result<T, DeviceError> + Send + 'static
{
}

/// A test op yielding `T`.
pub type TestOp<T> = FromFn<Box<dyn OpFn<T>>>;

/// Launches `kernel(buf, value, n)` over every element of `buf` on the op's stream.
fn launch_scalar(
    ctx: &mut ExecutionContext,
    kernel: &Kernel,
    buf: &DeviceBuffer<f32>,
    value: f32,
) -> Result<(), DeviceError> {
    let (config, n) = elems(buf);
    kernel.launch(
        ctx.stream()?,
        config,
        KernelArgs::new().output(buf).scalar(value).scalar(n),
    )
}

/// Launches `kernel(dst, srcs.., n)` over every element of `dst` on the op's stream.
fn launch_binary(
    ctx: &mut ExecutionContext,
    kernel: &Kernel,
    dst: &DeviceBuffer<f32>,
    srcs: &[&DeviceBuffer<f32>],
) -> Result<(), DeviceError> {
    let (config, n) = elems(dst);
    let mut args = KernelArgs::new();
    args.output(dst);
    for src in srcs {
        args.input(*src);
    }
    args.scalar(n);
    kernel.launch(ctx.stream()?, config, &args)
}

/// Writes `value` into every element of `buf`; yields `buf`.
pub fn fill(buf: &Buf, value: f32) -> FromFn<impl OpFn<Buf>> {
    let buf = buf.clone();
    from_fn(move |ctx| launch_scalar(ctx, kernels::fill(), &buf, value).map(|()| buf))
}

/// Adds `value` to every element of `buf`; yields `buf`.
pub fn add_scalar(buf: &Buf, value: f32) -> FromFn<impl OpFn<Buf>> {
    let buf = buf.clone();
    from_fn(move |ctx| launch_scalar(ctx, kernels::add_scalar(), &buf, value).map(|()| buf))
}

/// Multiplies every element of `buf` by `value`; yields `buf`.
pub fn mul_scalar(buf: &Buf, value: f32) -> FromFn<impl OpFn<Buf>> {
    let buf = buf.clone();
    from_fn(move |ctx| launch_scalar(ctx, kernels::mul_scalar(), &buf, value).map(|()| buf))
}

/// `x = x * a + b` over every element of `buf`; yields `buf`.
pub fn affine(buf: &Buf, a: f32, b: f32) -> FromFn<impl OpFn<Buf>> {
    let buf = buf.clone();
    from_fn(move |ctx| {
        let (config, n) = elems(&buf);
        kernels::affine().launch(
            ctx.stream()?,
            config,
            KernelArgs::new()
                .output(&*buf)
                .scalar(a)
                .scalar(b)
                .scalar(n),
        )?;
        Ok(buf)
    })
}

/// Spins for `cycles` on the op's stream (a kernel that touches no buffer).
fn spin(ctx: &mut ExecutionContext, cycles: u64) -> Result<(), DeviceError> {
    kernels::spin().launch(
        ctx.stream()?,
        LaunchConfig::linear(1, 1),
        KernelArgs::new().scalar(cycles),
    )
}

/// Spins for `cycles`, then writes `value` into every element of `buf`; yields `buf`.
///
/// The spin is its own kernel that touches no buffer, followed by the write. On the host
/// backend a kernel holds its buffers' locks while it runs, so a reader on another stream would
/// wait for a single spin-and-write kernel even without an event, which would hide a missing
/// dependency; with the spin apart, a reader that is not ordered after the write reads the old
/// contents on every backend.
pub fn spin_then_write(buf: &Buf, value: f32, cycles: u64) -> FromFn<impl OpFn<Buf>> {
    let buf = buf.clone();
    from_fn(move |ctx| {
        spin(ctx, cycles)?;
        launch_scalar(ctx, kernels::fill(), &buf, value).map(|()| buf)
    })
}

/// Copies `src` into `dst` (same length); yields `dst`.
pub fn copy(dst: &Buf, src: &Buf) -> FromFn<impl OpFn<Buf>> {
    let (dst, src) = (dst.clone(), src.clone());
    from_fn(move |ctx| launch_binary(ctx, kernels::copy(), &dst, &[&src]).map(|()| dst))
}

/// `dst = a + b` elementwise (same lengths); yields `dst`.
pub fn add(dst: &Buf, a: &Buf, b: &Buf) -> FromFn<impl OpFn<Buf>> {
    let (dst, a, b) = (dst.clone(), a.clone(), b.clone());
    from_fn(move |ctx| launch_binary(ctx, kernels::add(), &dst, &[&a, &b]).map(|()| dst))
}

/// `dst += src` elementwise (same lengths); yields `dst`.
pub fn accumulate(dst: &Buf, src: &Buf) -> FromFn<impl OpFn<Buf>> {
    let (dst, src) = (dst.clone(), src.clone());
    from_fn(move |ctx| launch_binary(ctx, kernels::accumulate(), &dst, &[&src]).map(|()| dst))
}

/// Sums `srcs` into `dst` (overwritten) on the device, one accumulation after another on one
/// stream (so the sum is right only if every source was written before it runs); yields `dst`.
pub fn sum_into(dst: &Buf, srcs: Vec<Buf>) -> FromFn<impl OpFn<Buf>> {
    let dst = dst.clone();
    from_fn(move |ctx| {
        launch_scalar(ctx, kernels::fill(), &dst, 0.0)?;
        for src in &srcs {
            launch_binary(ctx, kernels::accumulate(), &dst, &[src])?;
        }
        Ok(dst)
    })
}

/// A `join_all` of one branch per buffer, each writing `values[i]` into `bufs[i]` after a spin
/// of `cycles`, then the sum of the branches' outputs into `sum`, on the device: the sum is
/// right only if every branch was joined before it. Yields `sum`.
pub fn spin_writes_then_sum(
    sum: &Buf,
    bufs: &[Buf],
    values: &[f32],
    cycles: u64,
) -> impl DeviceOp<Output = Buf> + 'static {
    let writes = bufs
        .iter()
        .zip(values)
        .map(|(b, v)| spin_then_write(b, *v, cycles))
        .collect();
    let sum = sum.clone();
    join_all(writes).then(move |written| sum_into(&sum, written))
}

/// Allocates `len` elements on the op's stream, spins for `cycles`, then fills them with
/// `value`; yields the new buffer (owned, so dropping the output frees it).
pub fn alloc_spin_fill(
    len: usize,
    value: f32,
    cycles: u64,
) -> FromFn<impl OpFn<DeviceBuffer<f32>>> {
    from_fn(move |ctx| {
        let buf = DeviceBuffer::<f32>::alloc(ctx.stream()?, len)?;
        spin(ctx, cycles)?;
        launch_scalar(ctx, kernels::fill(), &buf, value).map(|()| buf)
    })
}

/// A launch the device refuses (a grid of zero blocks): fails with
/// [`DeviceError::InvalidLaunch`] on every backend.
pub fn bad_launch(buf: &Buf) -> FromFn<impl OpFn<Buf>> {
    let buf = buf.clone();
    from_fn(move |ctx| {
        kernels::fill().launch(
            ctx.stream()?,
            LaunchConfig::linear(0, 1),
            KernelArgs::new()
                .output(&*buf)
                .scalar(1.0f32)
                .scalar(buf.len() as u32),
        )?;
        Ok(buf)
    })
}

/// Sets `flag` from the stream, in order with the op's earlier device work (a host function).
pub fn set_flag(flag: &Arc<AtomicBool>) -> FromFn<impl OpFn<()>> {
    let flag = flag.clone();
    from_fn(move |ctx| {
        ctx.stream()?
            .enqueue_host_fn(move || flag.store(true, Ordering::SeqCst))
    })
}

/// An op that forks a branch of its own ([`ExecutionContext::fork_branch`]), runs `op` on it,
/// and drops the branch without joining it back: the op itself enqueues nothing on its own
/// stream. Yields `op`'s output.
pub fn on_unjoined_branch<O: DeviceOp + 'static>(op: O) -> FromFn<impl OpFn<O::Output>> {
    from_fn(move |ctx| {
        let mut branch = ctx.fork_branch(0, 1)?;
        op.execute(&mut branch)
    })
}

/// How an op loses track of the context its work went through (safe code, all three): it
/// replaces its context with a branch it forks, swaps the two, or forgets a branch it ran its
/// work on.
#[derive(Clone, Copy, Debug)]
pub enum Lost {
    /// `*ctx = ctx.fork_branch(..)` after the op's work.
    Replaced,
    /// The op's work on the context, then the context swapped with a fresh branch.
    Swapped,
    /// The op's work on a branch that is then forgotten (`std::mem::forget`).
    Forgotten,
}

impl Lost {
    /// Every way.
    pub const ALL: [Lost; 3] = [Lost::Replaced, Lost::Swapped, Lost::Forgotten];
}

/// Runs `op` and then loses its context as `how` says.
pub fn losing_its_context<O: DeviceOp + 'static>(op: O, how: Lost) -> FromFn<impl OpFn<O::Output>> {
    from_fn(move |ctx| match how {
        Lost::Replaced => {
            let out = op.execute(ctx)?;
            *ctx = ctx.fork_branch(0, 1)?;
            Ok(out)
        }
        Lost::Swapped => {
            let mut branch = ctx.fork_branch(0, 1)?;
            let out = op.execute(ctx)?;
            std::mem::swap(ctx, &mut branch);
            Ok(out)
        }
        Lost::Forgotten => {
            let mut branch = ctx.fork_branch(0, 1)?;
            let out = op.execute(&mut branch)?;
            std::mem::forget(branch);
            Ok(out)
        }
    })
}

/// Panics on the op's stream, in order with its earlier work: the op's work fails after it
/// was enqueued.
pub fn panic_on_stream() -> FromFn<impl OpFn<()>> {
    from_fn(|ctx| {
        ctx.stream()?
            .enqueue_host_fn(|| panic!("the op's work fails on the stream"))
    })
}

/// Makes the op's stream wait for `event`.
pub fn wait_event(event: &Event) -> FromFn<impl OpFn<()>> {
    let event = event.clone();
    from_fn(move |ctx| ctx.wait_for(&event))
}

/// Runs `op` and adds one to `runs` each time it executes.
pub fn counted<O: DeviceOp + 'static>(
    runs: &Arc<AtomicUsize>,
    op: O,
) -> FromFn<impl OpFn<O::Output>> {
    let runs = runs.clone();
    from_fn(move |ctx| {
        runs.fetch_add(1, Ordering::SeqCst);
        op.execute(ctx)
    })
}

/// Runs `op` and yields its output with the stream its context ran on.
pub fn with_stream<O: DeviceOp + 'static>(op: O) -> FromFn<impl OpFn<(O::Output, StreamId)>> {
    from_fn(move |ctx| {
        let out = op.execute(ctx)?;
        Ok((out, ctx.stream_id()))
    })
}

/// Waits for `event` on the op's stream, then writes `value` into every element of `buf`;
/// yields `buf`. With the event of a closed [`Gate`], the op stays in flight until the gate
/// opens.
pub fn fill_after(event: &Event, buf: &Buf, value: f32) -> FromFn<impl OpFn<Buf>> {
    let (event, buf) = (event.clone(), buf.clone());
    from_fn(move |ctx| {
        ctx.wait_for(&event)?;
        launch_scalar(ctx, kernels::fill(), &buf, value).map(|()| buf)
    })
}

/// Asserts the executor's event counts of an execution: `recorded` events recorded, `waits`
/// cross-stream waits enqueued.
#[track_caller]
pub fn assert_events(stats: &ExecutionStats, recorded: usize, waits: usize) {
    assert_eq!(
        (stats.events_recorded, stats.event_waits),
        (recorded, waits),
        "events recorded and waited on: {stats:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Gates: streams held back until the test lets them go.
// ---------------------------------------------------------------------------------------------

/// Compiles every kernel of these ops for `device` now. Loading a kernel's module at its first
/// launch waits for the device's work in flight: a test that needs work to run concurrently
/// (or a stream held by a gate) compiles first.
///
/// # Errors
///
/// A compile error.
pub fn compile_kernels(device: &Device) -> Result<(), DeviceError> {
    for k in [
        kernels::fill(),
        kernels::add_scalar(),
        kernels::mul_scalar(),
        kernels::copy(),
        kernels::add(),
        kernels::accumulate(),
        kernels::spin(),
    ] {
        k.compile(device)?;
    }
    Ok(())
}

/// How long a [`Gate`] stays closed at most.
pub const GATE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A stream blocked by a host function until [`Gate::open`] (or drop), with an event after
/// it. Work that waits on [`Gate::event`] cannot finish while the gate is closed, which
/// makes "still in flight" a certainty rather than a matter of timing.
///
/// While a gate is closed, nothing in its test binary may wait for all of the device's streams
/// (`Device::synchronize`). On CUDA, a kernel module loaded meanwhile (by another test of the
/// binary) may wait for the gate too, while holding a lock every other driver call takes, the
/// calls of the test that would open the gate among them: so a gate opens by itself after
/// [`GATE_LIMIT`], and such a test fails where it would have hung its binary.
#[derive(Debug)]
pub struct Gate {
    release: Option<mpsc::Sender<()>>,
    event: Event,
    _stream: Stream,
}

impl Gate {
    /// A closed gate on a new stream of `device`.
    ///
    /// Every test kernel is compiled first: loading a module waits for the device's work in
    /// flight, the gate's blocked host function included.
    pub fn closed(device: &Device) -> Result<Gate, DeviceError> {
        compile_kernels(device)?;
        let stream = device.new_stream()?;
        let (release, held) = mpsc::channel::<()>();
        // Returns when the sender is dropped, or after GATE_LIMIT.
        stream.enqueue_host_fn(move || {
            let _ = held.recv_timeout(GATE_LIMIT);
        })?;
        let event = stream.record_event()?;
        Ok(Gate {
            release: Some(release),
            event,
            _stream: stream,
        })
    }

    /// Completes when the gate is opened.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Opens the gate.
    pub fn open(&mut self) {
        self.release = None;
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

// ---------------------------------------------------------------------------------------------
// Buffers.
// ---------------------------------------------------------------------------------------------

thread_local! {
    /// This thread's stream for creating and reading back test buffers.
    static HOST_IO: Stream = device().new_stream().expect("a stream for test buffers");
}

/// This thread's stream for creating and reading back test buffers.
pub fn io_stream() -> Stream {
    HOST_IO.with(Stream::clone)
}

/// A buffer holding `data`, written before this returns.
pub fn buffer_from(data: &[f32]) -> Buf {
    let stream = io_stream();
    let buf = DeviceBuffer::from_host(&stream, data).expect("allocate a test buffer");
    stream.synchronize().expect("initialize a test buffer");
    Arc::new(buf)
}

/// A buffer of [`LEN`] elements equal to `value`, written before this returns.
pub fn buffer(value: f32) -> Buf {
    buffer_from(&[value; LEN])
}

/// `n` buffers of [`LEN`] elements, the `i`-th equal to `values[i]`, written before this returns.
pub fn buffers(values: &[f32]) -> Vec<Buf> {
    let stream = io_stream();
    let bufs = values
        .iter()
        .map(|v| {
            DeviceBuffer::from_host(&stream, &[*v; LEN])
                .map(Arc::new)
                .expect("allocate a test buffer")
        })
        .collect();
    stream.synchronize().expect("initialize test buffers");
    bufs
}

/// The contents of `buf`, after all work that used it.
pub fn read(buf: &DeviceBuffer<f32>) -> Vec<f32> {
    buf.to_host_vec(&io_stream())
        .expect("read a test buffer back")
}

/// Asserts that every element of `buf` equals `value`.
#[track_caller]
pub fn assert_all(buf: &DeviceBuffer<f32>, value: f32, what: &str) {
    let got = read(buf);
    if let Some((i, v)) = got.iter().enumerate().find(|(_, v)| **v != value) {
        panic!("{what}: element {i} is {v}, expected {value} everywhere");
    }
}

/// The number of distinct stream ids in `ids`.
pub fn distinct(ids: &[StreamId]) -> usize {
    let mut v = ids.to_vec();
    v.sort();
    v.dedup();
    v.len()
}

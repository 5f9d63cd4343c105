//! GEMM on the host backend: a blocked, multi-threaded matrix multiply run as one task of the
//! stream.
//!
//! The task owns its buffers (`Arc<Memory>`), so it may run after the caller dropped them, and
//! it is an `Fn`, so a capture can replay it. It locks each distinct allocation once, in address
//! order (write for the one holding `C`), as host kernels do; the runtime has checked that `C`
//! overlaps neither input, so `A` and `B` may share `C`'s allocation and each other's bytes.
//!
//! Operands are read in the accumulation type (f32, or f64 for f64): in place where the element
//! type is that type, else converted once per matrix; `A` is packed row-major when stored
//! transposed. `C`'s rows are split among threads, each of which sums into an accumulator and
//! finally writes `alpha · acc + beta · C`, rounded once to the element type. Every inner loop is
//! contiguous and works on a block of `B` sized to stay in cache: with `B` stored `k×n` it adds
//! `a[i][p] · B[p][..]` to four rows of the accumulator at a time; with `B` stored `n×k` (used
//! transposed) it takes dot products of rows of `A` with rows of `B`, over eight lanes.

use std::any::TypeId;
use std::ops::{Add, AddAssign, Mul, Range};
use std::sync::Arc;

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};

use super::capture::HostNodeKind;
use super::memory::host_mem;
use super::stream::HostStream;
use crate::blas::{GemmConfig, GemmDtype};
use crate::error::{DeviceError, Result};
use crate::memory::Memory;

/// Depth of a block of `B` stored `k×n` (rows of B, columns of A).
const KC: usize = 128;
/// Width of a block of `B` stored `k×n` (columns of B and C).
const NC: usize = 512;
/// Depth of a block of `B` stored `n×k` (columns of B and A).
const KD: usize = 512;
/// Rows of a block of `B` stored `n×k` (columns of C).
const ND: usize = 32;
/// Multiply-adds below which one thread does the whole product.
const PARALLEL_MIN_WORK: usize = 1 << 21;
/// Fewest rows of `C` a thread is given.
const MIN_ROWS_PER_THREAD: usize = 16;

/// One operand of a host GEMM: a byte range of an allocation.
pub(crate) struct GemmOperand {
    mem: Arc<Memory>,
    byte_offset: usize,
    byte_len: usize,
}

impl GemmOperand {
    pub(crate) fn new(mem: Arc<Memory>, byte_offset: usize, byte_len: usize) -> Self {
        GemmOperand {
            mem,
            byte_offset,
            byte_len,
        }
    }

    fn range(&self) -> Range<usize> {
        self.byte_offset..self.byte_offset + self.byte_len
    }
}

/// Enqueues `C = alpha · op(A) · op(B) + beta · C` on `stream` (shapes already validated).
pub(crate) fn gemm(
    stream: &HostStream,
    dtype: (GemmDtype, GemmDtype),
    cfg: GemmConfig,
    a: GemmOperand,
    b: GemmOperand,
    c: GemmOperand,
) -> Result<()> {
    let (m, n, k) = (cfg.m, cfg.n, cfg.k);
    stream.enqueue(
        Arc::new(move || run(dtype, &cfg, &a, &b, &c)),
        HostNodeKind::Gemm,
        move || format!("gemm {m}x{n}x{k}"),
    )
}

enum Guard<'g> {
    Read(RwLockReadGuard<'g, Vec<u64>>),
    Write(RwLockWriteGuard<'g, Vec<u64>>),
}

fn run(
    dtype: (GemmDtype, GemmDtype),
    cfg: &GemmConfig,
    a: &GemmOperand,
    b: &GemmOperand,
    c: &GemmOperand,
) -> Result<()> {
    use half::{bf16, f16};
    match dtype {
        (GemmDtype::F32, GemmDtype::F32) => run_typed::<f32, f32>(cfg, a, b, c),
        (GemmDtype::F64, GemmDtype::F64) => run_typed::<f64, f64>(cfg, a, b, c),
        (GemmDtype::F16, GemmDtype::F16) => run_typed::<f16, f16>(cfg, a, b, c),
        (GemmDtype::BF16, GemmDtype::BF16) => run_typed::<bf16, bf16>(cfg, a, b, c),
        (GemmDtype::F16, GemmDtype::F32) => run_typed::<f16, f32>(cfg, a, b, c),
        (GemmDtype::BF16, GemmDtype::F32) => run_typed::<bf16, f32>(cfg, a, b, c),
        (i, o) => Err(internal(&format!("no GEMM from {i:?} inputs to {o:?}"))),
    }
}

/// The elements of `op`'s range of `bytes` (its whole allocation).
fn elems<'g, E: bytemuck::Pod>(bytes: &'g [u8], op: &GemmOperand, what: &str) -> Result<&'g [E]> {
    let range = bytes
        .get(op.range())
        .ok_or_else(|| internal(&format!("{what} lies outside its allocation")))?;
    bytemuck::try_cast_slice(range).map_err(|e| internal(&format!("{what}: {e}")))
}

fn run_typed<E: HostElem, O: HostElem<Acc = E::Acc>>(
    cfg: &GemmConfig,
    a: &GemmOperand,
    b: &GemmOperand,
    c: &GemmOperand,
) -> Result<()> {
    // Distinct allocations in address order; the one holding C is locked for writing.
    let mut mems: Vec<&Arc<Memory>> = vec![&a.mem, &b.mem, &c.mem];
    mems.sort_by_key(|m| Arc::as_ptr(m) as usize);
    mems.dedup_by(|x, y| Arc::ptr_eq(x, y));
    let mut guards: Vec<(&Arc<Memory>, Guard<'_>)> = Vec::with_capacity(mems.len());
    for mem in mems {
        let h = host_mem(mem)?;
        let guard = if Arc::ptr_eq(mem, &c.mem) {
            Guard::Write(h.write())
        } else {
            Guard::Read(h.read())
        };
        guards.push((mem, guard));
    }
    let mut c_guard = None;
    let mut reads: Vec<(&Arc<Memory>, &[u8])> = Vec::new();
    for (mem, guard) in guards.iter_mut() {
        match guard {
            Guard::Write(w) => c_guard = Some(w),
            Guard::Read(r) => reads.push((*mem, bytemuck::cast_slice(&r[..]))),
        }
    }
    let c_guard = c_guard.ok_or_else(|| internal("C's allocation was not locked"))?;
    // An input in C's allocation is copied out before C is borrowed mutably; the others are
    // read in place.
    let copy_from_c = |op: &GemmOperand, what: &str| -> Result<Option<Vec<E>>> {
        if !Arc::ptr_eq(&op.mem, &c.mem) {
            return Ok(None);
        }
        Ok(Some(
            elems::<E>(bytemuck::cast_slice(&c_guard[..]), op, what)?.to_vec(),
        ))
    };
    let (a_copy, b_copy) = (copy_from_c(a, "A")?, copy_from_c(b, "B")?);
    let in_place = |op: &GemmOperand, what: &str| -> Result<&[E]> {
        let (_, bytes) = reads
            .iter()
            .find(|(m, _)| Arc::ptr_eq(m, &op.mem))
            .ok_or_else(|| internal(&format!("{what}'s allocation was not locked")))?;
        elems(bytes, op, what)
    };
    let a_elems = match &a_copy {
        Some(v) => &v[..],
        None => in_place(a, "A")?,
    };
    let b_elems = match &b_copy {
        Some(v) => &v[..],
        None => in_place(b, "B")?,
    };
    let c_elems: &mut [O] = {
        let whole: &mut [u8] = bytemuck::cast_slice_mut(&mut c_guard[..]);
        let range = whole
            .get_mut(c.range())
            .ok_or_else(|| internal("C lies outside its allocation"))?;
        bytemuck::try_cast_slice_mut(range).map_err(|e| internal(&format!("C: {e}")))?
    };
    compute(cfg, a_elems, b_elems, c_elems);
    Ok(())
}

fn internal(what: &str) -> DeviceError {
    DeviceError::internal(format!("gemm on the host backend: {what}"))
}

/// The accumulation types.
trait Accum:
    bytemuck::Pod + Send + Sync + Default + Add<Output = Self> + Mul<Output = Self> + AddAssign
{
    fn from_f32(x: f32) -> Self;
}

impl Accum for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Accum for f64 {
    fn from_f32(x: f32) -> Self {
        x as f64
    }
}

/// Element types with their accumulation type.
trait HostElem: bytemuck::Pod + Send + Sync {
    type Acc: Accum;
    fn widen(self) -> Self::Acc;
    fn narrow(acc: Self::Acc) -> Self;
}

/// Types that accumulate in themselves.
macro_rules! accumulates_in_itself {
    ($($t:ty),*) => {$(
        impl HostElem for $t {
            type Acc = $t;
            fn widen(self) -> $t {
                self
            }
            fn narrow(acc: $t) -> $t {
                acc
            }
        }
    )*};
}

accumulates_in_itself!(f32, f64);

impl HostElem for half::f16 {
    type Acc = f32;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(acc: f32) -> half::f16 {
        half::f16::from_f32(acc)
    }
}

impl HostElem for half::bf16 {
    type Acc = f32;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(acc: f32) -> half::bf16 {
        half::bf16::from_f32(acc)
    }
}

/// A `rows × cols` matrix (stored `cols × rows` when `transposed`) from the start of `src`, as
/// a dense row-major matrix of accumulators: `src` itself where it already is one, else
/// converted (and transposed) into `buf`.
fn prepare<'x, E: HostElem>(
    src: &'x [E],
    rows: usize,
    cols: usize,
    transposed: bool,
    buf: &'x mut Vec<E::Acc>,
) -> &'x [E::Acc] {
    let src = &src[..rows * cols];
    if !transposed && TypeId::of::<E>() == TypeId::of::<E::Acc>() {
        if let Ok(same) = bytemuck::try_cast_slice::<E, E::Acc>(src) {
            return same;
        }
    }
    buf.clear();
    if transposed {
        // op(X)[r][c] = X[c][r]: a few stored rows at a time, so that the writes are
        // contiguous and the rows read stay in cache.
        const T: usize = 16;
        buf.resize(rows * cols, E::Acc::default());
        for c0 in (0..cols).step_by(T) {
            let c1 = (c0 + T).min(cols);
            for r in 0..rows {
                let out = &mut buf[r * cols + c0..r * cols + c1];
                for (o, c) in out.iter_mut().zip(c0..c1) {
                    *o = src[c * rows + r].widen();
                }
            }
        }
    } else {
        buf.extend(src.iter().map(|x| x.widen()));
    }
    buf
}

fn compute<E: HostElem, O: HostElem<Acc = E::Acc>>(
    cfg: &GemmConfig,
    a: &[E],
    b: &[E],
    c: &mut [O],
) {
    let (m, n, k) = (cfg.m, cfg.n, cfg.k);
    let alpha = E::Acc::from_f32(cfg.alpha);
    let beta = E::Acc::from_f32(cfg.beta);
    let work = m.saturating_mul(n).saturating_mul(k);
    let threads = if work < PARALLEL_MIN_WORK {
        1
    } else {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        cores.min(m.div_ceil(MIN_ROWS_PER_THREAD)).max(1)
    };
    let rows_per_thread = m.div_ceil(threads);
    let (mut a_buf, mut b_buf) = (Vec::new(), Vec::new());
    // B as stored: k×n, or n×k when used transposed.
    let (b_rows, b_cols) = if cfg.trans_b { (n, k) } else { (k, n) };
    for t in 0..cfg.batch {
        let c_mat = &mut c[t * cfg.stride_c..][..m * n];
        let a_mat = prepare(&a[t * cfg.stride_a..], m, k, cfg.trans_a, &mut a_buf);
        let b_mat = prepare(&b[t * cfg.stride_b..], b_rows, b_cols, false, &mut b_buf);
        let job = |row0: usize, c_rows: &mut [O]| {
            let rows = c_rows.len() / n;
            let mut acc = vec![E::Acc::default(); rows * n];
            let a_rows = &a_mat[row0 * k..(row0 + rows) * k];
            if cfg.trans_b {
                dot_rows(a_rows, b_mat, k, n, &mut acc);
            } else {
                axpy_rows(a_rows, b_mat, k, n, &mut acc);
            }
            write_out(c_rows, &acc, alpha, beta, cfg.beta == 0.0);
        };
        if threads == 1 {
            job(0, c_mat);
        } else {
            std::thread::scope(|scope| {
                for (i, chunk) in c_mat.chunks_mut(rows_per_thread * n).enumerate() {
                    let job = &job;
                    scope.spawn(move || job(i * rows_per_thread, chunk));
                }
            });
        }
    }
}

/// `acc += a · b` for `a` of `rows × k` and `b` stored `k × n`, block by block of `b`.
fn axpy_rows<A: Accum>(a: &[A], b: &[A], k: usize, n: usize, acc: &mut [A]) {
    let rows = acc.len() / n.max(1);
    for n0 in (0..n).step_by(NC) {
        let cols = n0..(n0 + NC).min(n);
        for k0 in (0..k).step_by(KC) {
            let depth = k0..(k0 + KC).min(k);
            let mut r = 0;
            while r + 4 <= rows {
                let block = &mut acc[r * n..(r + 4) * n];
                let (c0, rest) = block.split_at_mut(n);
                let (c1, rest) = rest.split_at_mut(n);
                let (c2, c3) = rest.split_at_mut(n);
                add_four_rows(
                    [
                        &mut c0[cols.clone()],
                        &mut c1[cols.clone()],
                        &mut c2[cols.clone()],
                        &mut c3[cols.clone()],
                    ],
                    [
                        &a[r * k..][..k],
                        &a[(r + 1) * k..][..k],
                        &a[(r + 2) * k..][..k],
                        &a[(r + 3) * k..][..k],
                    ],
                    b,
                    n,
                    cols.start,
                    depth.clone(),
                );
                r += 4;
            }
            while r < rows {
                let c_row = &mut acc[r * n..(r + 1) * n][cols.clone()];
                let a_row = &a[r * k..][..k];
                for p in depth.clone() {
                    let x = a_row[p];
                    let b_row = &b[p * n + cols.start..][..c_row.len()];
                    for (c, &y) in c_row.iter_mut().zip(b_row) {
                        *c += x * y;
                    }
                }
                r += 1;
            }
        }
    }
}

/// Four accumulator rows share each loaded row of `b`.
fn add_four_rows<A: Accum>(
    c: [&mut [A]; 4],
    a: [&[A]; 4],
    b: &[A],
    n: usize,
    col0: usize,
    depth: Range<usize>,
) {
    let [c0, c1, c2, c3] = c;
    let width = c0.len();
    for p in depth {
        let (x0, x1, x2, x3) = (a[0][p], a[1][p], a[2][p], a[3][p]);
        let b_row = &b[p * n + col0..][..width];
        let lanes = c0
            .iter_mut()
            .zip(c1.iter_mut())
            .zip(c2.iter_mut())
            .zip(c3.iter_mut())
            .zip(b_row);
        for ((((y0, y1), y2), y3), &y) in lanes {
            *y0 += x0 * y;
            *y1 += x1 * y;
            *y2 += x2 * y;
            *y3 += x3 * y;
        }
    }
}

/// `acc += a · bᵀ` for `a` of `rows × k` and `b` stored `n × k`: dot products of rows, block by
/// block of `b`.
fn dot_rows<A: Accum>(a: &[A], b: &[A], k: usize, n: usize, acc: &mut [A]) {
    let rows = acc.len() / n.max(1);
    for k0 in (0..k).step_by(KD) {
        let depth = (k0 + KD).min(k) - k0;
        for j0 in (0..n).step_by(ND) {
            let j1 = (j0 + ND).min(n);
            for r in 0..rows {
                let a_seg = &a[r * k + k0..][..depth];
                let out = &mut acc[r * n + j0..r * n + j1];
                for (o, j) in out.iter_mut().zip(j0..j1) {
                    *o += dot(a_seg, &b[j * k + k0..][..depth]);
                }
            }
        }
    }
}

/// `x · y` over eight independent lanes (which the compiler keeps in vector registers).
fn dot<A: Accum>(x: &[A], y: &[A]) -> A {
    const L: usize = 8;
    let mut lanes = [A::default(); L];
    let (xs, ys) = (x.chunks_exact(L), y.chunks_exact(L));
    let mut tail = A::default();
    for (&p, &q) in xs.remainder().iter().zip(ys.remainder()) {
        tail += p * q;
    }
    for (xc, yc) in xs.zip(ys) {
        for l in 0..L {
            lanes[l] += xc[l] * yc[l];
        }
    }
    let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
    ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) + tail
}

/// `c = alpha · acc + beta · c`, rounded once; with `beta == 0`, `c` is not read.
fn write_out<O: HostElem>(c: &mut [O], acc: &[O::Acc], alpha: O::Acc, beta: O::Acc, no_c: bool) {
    if no_c {
        for (c, &s) in c.iter_mut().zip(acc) {
            *c = O::narrow(alpha * s);
        }
    } else {
        for (c, &s) in c.iter_mut().zip(acc) {
            *c = O::narrow(alpha * s + beta * c.widen());
        }
    }
}

//! A one-shot all-reduce for small `f32` sums between the ranks of one process, over peer
//! memory: the latency path of tensor-parallel decoding, where each layer sums a few KiB.
//!
//! NCCL spends 13–30 µs on an all-reduce of 16 KiB inside a replayed decode step (see
//! `docs/perf/llama-tp.md`); here each rank's kernel copies its part into a staging area of its
//! own, the ranks meet at a flag barrier in peer memory, and every rank sums all the staged
//! parts itself, in rank order (so every rank gets the same bits), then meets the others again
//! before it returns. That second barrier means that once a rank's kernel has finished, no peer
//! reads its staging area or writes its flags any more for that call, so stream order on each
//! rank is all its memory needs.
//!
//! Used by [`NcclComm`](super::NcclComm) for each all-reduce of one `f32` buffer of at most
//! [`CAP`] elements, summed, when its communicator was made for every rank in this process
//! (`ncclCommInitAll`) over 2 to [`MAX_WORLD`] devices that can all read each other's memory;
//! `CUFLOW_NCCL_ONESHOT=0` turns it off. Which calls take it depends only on the call itself
//! (the kind, type, operation and count, which every rank passes alike), not on the group it
//! is made in, so all ranks take the same path; in a group that also has NCCL calls, the
//! one-shot kernels run beside them on a stream of their own (see `NcclComm::enqueue`).
//!
//! **The staging areas** are ordinary tracked device buffers (one per rank, zeroed at creation):
//! a call names its rank's area as a buffer it writes, so the access tracker orders a rank's
//! one-shot calls across streams and captures like any other writes to one buffer. A rank's
//! kernel also reads the other ranks' areas and writes their flags, which no tracker sees: the
//! areas are kept for the rest of the process (see `Drop`), and a call is refused once the
//! device of any rank faulted or was reset (its area went with its context).
//!
//! **Epochs.** Each block of each rank counts its calls in its area; a call's epoch is the
//! count plus one. As every rank makes the same calls in the same order, their counts agree.
//! A flag holds the epoch its writer reached, and waiting means until it reaches ours
//! (compared with wrap-around); beside it, the element count of the writer's call, which must
//! be ours. A wait has a deadline (the group's: 300 s, as the dist crate's default deadline for
//! a peer, unless the communicators were made with another): a rank that never arrives traps
//! the kernel (a device fault, reported as `DeviceFaulted`) instead of hanging, and so do ranks
//! whose calls disagree on the count, instead of summing parts of other lengths.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;

use super::super::kernel::CompiledKernel;
use super::super::{driver_err, CudaDeviceShared, CudaStreamHandle};
use crate::error::{DeviceError, Result};
use crate::kernel::SourceLayout;
use crate::memory::Memory;

/// The most ranks.
pub(crate) const MAX_WORLD: usize = 8;
/// The most elements of one call, per staging half.
pub(crate) const CAP: usize = 16 * 1024;
/// Blocks of the kernel; each sums one slice of the buffer and meets the other ranks' block of
/// the same number.
const BLOCKS: usize = 8;
/// Threads per block.
const THREADS: u32 = 256;

/// Bytes of one rank's area: two staging halves of `CAP` `f32`, the start and done flags
/// (`BLOCKS × MAX_WORLD` `u64` each: a call's epoch and element count) and a call count per
/// block.
pub(crate) const AREA_BYTES: usize = 2 * CAP * 4 + 2 * BLOCKS * MAX_WORLD * 8 + BLOCKS * 4;

const NAME: &str = "cuflow_all_reduce_oneshot_f32";

fn source() -> String {
    format!(
        r#"
#define MAX_WORLD {MAX_WORLD}
#define CAP {CAP}
#define BLOCKS {BLOCKS}
struct Areas {{ unsigned long long base[MAX_WORLD]; }};
__device__ __forceinline__ float* stage_of(unsigned long long base, unsigned half) {{
  return (float*)base + half * CAP;
}}
__device__ __forceinline__ unsigned long long* flags_of(unsigned long long base, unsigned which) {{
  return (unsigned long long*)((float*)base + 2 * CAP) + which * BLOCKS * MAX_WORLD;
}}
__device__ __forceinline__ unsigned* count_of(unsigned long long base) {{
  return (unsigned*)flags_of(base, 2);
}}
__device__ __forceinline__ unsigned long long now_ns() {{
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}}
/* Every rank's block `b` reaches this point of call `epoch` of `n` elements: thread t < world
   tells rank t (release, system scope, after the block's writes), then waits until rank t told
   it. A flag word holds the epoch its writer reached (low half) and that call's element count
   (high half): ranks whose calls disagree on the count (a program that breaks the rule of the
   same calls in the same order) trap rather than sum parts of other lengths. */
__device__ void meet(const Areas& a, unsigned which, unsigned b, unsigned rank, unsigned world,
                     unsigned epoch, unsigned n, unsigned long long deadline) {{
  __syncthreads();
  if (threadIdx.x < world) {{
    const unsigned t = threadIdx.x;
    unsigned long long* theirs = flags_of(a.base[t], which) + b * MAX_WORLD + rank;
    const unsigned long long word = ((unsigned long long)n << 32) | epoch;
    __threadfence_system();
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(theirs), "l"(word) : "memory");
    const unsigned long long* mine = flags_of(a.base[rank], which) + b * MAX_WORLD + t;
    const unsigned long long start = now_ns();
    for (;;) {{
      unsigned long long seen;
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine) : "memory");
      const unsigned seen_epoch = (unsigned)seen;
      if ((int)(seen_epoch - epoch) >= 0) {{
        if (seen_epoch == epoch && (unsigned)(seen >> 32) != n) __trap();
        break;
      }}
      if (now_ns() - start > deadline) __trap();
    }}
  }}
  __syncthreads();
}}
extern "C" __global__ void __launch_bounds__({THREADS}) {NAME}(
    const float* send, float* recv, unsigned n, Areas a, unsigned rank, unsigned world,
    unsigned long long deadline) {{
  const unsigned b = blockIdx.x;
  unsigned* count = count_of(a.base[rank]) + b;
  const unsigned epoch = *count + 1;
  const unsigned half = epoch & 1u;
  const unsigned per = (n + gridDim.x - 1) / gridDim.x;
  const unsigned lo = min(n, b * per), hi = min(n, lo + per);
  float* mine = stage_of(a.base[rank], half);
  for (unsigned i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i] = send[i];
  meet(a, 0, b, rank, world, epoch, n, deadline);
  for (unsigned i = lo + threadIdx.x; i < hi; i += blockDim.x) {{
    float s = 0.0f;
    for (unsigned r = 0; r < world; ++r) s += __ldcg(stage_of(a.base[r], half) + i);
    recv[i] = s;
  }}
  meet(a, 1, b, rank, world, epoch, n, deadline);
  if (threadIdx.x == 0) *count = epoch;
}}
"#
    )
}

/// The kernel's by-value parameter holding every rank's area.
#[repr(C)]
#[derive(Clone, Copy)]
struct Areas {
    base: [u64; MAX_WORLD],
}

/// The one-shot state of a group of ranks, shared by their communicators.
pub(crate) struct OneShot {
    /// Rank `r`'s area, on its device.
    areas: Vec<Arc<Memory>>,
    /// Their device addresses, as the kernel takes them.
    bases: Areas,
    /// Rank `r`'s device state and the kernel loaded there.
    ranks: Vec<(Arc<CudaDeviceShared>, Arc<CompiledKernel>)>,
    /// How long a rank's kernel waits for the others before it traps, in nanoseconds.
    deadline_ns: u64,
}

impl OneShot {
    /// Whether one-shot all-reduces are turned on (`CUFLOW_NCCL_ONESHOT` is not `0`).
    pub(crate) fn enabled() -> bool {
        std::env::var("CUFLOW_NCCL_ONESHOT").map_or(true, |v| v.trim() != "0")
    }

    /// The state over `shared` (rank `r` on `shared[r]`) with the zeroed areas `areas`, whose
    /// kernels wait for each other up to `deadline` (at least 1 ns; longer than `u64::MAX`
    /// nanoseconds, about 584 years, is as good as no deadline), or `None` when the group cannot use it: fewer than 2 or more than [`MAX_WORLD`] ranks, or
    /// a pair of devices that cannot read each other's memory.
    ///
    /// # Errors
    ///
    /// A compile or driver error.
    pub(crate) fn new(
        shared: &[Arc<CudaDeviceShared>],
        areas: Vec<Arc<Memory>>,
        deadline: std::time::Duration,
    ) -> Result<Option<Arc<OneShot>>> {
        let world = shared.len();
        if !(2..=MAX_WORLD).contains(&world) || areas.len() != world {
            return Ok(None);
        }
        for a in shared {
            for b in shared {
                if !super::super::peer::enable_peer_access(a, b)? {
                    return Ok(None);
                }
            }
        }
        let mut bases = Areas {
            base: [0; MAX_WORLD],
        };
        for (slot, area) in bases.base.iter_mut().zip(&areas) {
            *slot = area.backend.cuda()?.ptr();
        }
        let source = source();
        let mut ranks = Vec::with_capacity(world);
        // Launched below with its parameters written out by hand, never through the checked
        // launch path, so what a check against its source would establish does not matter.
        let layout = SourceLayout::Established;
        for s in shared {
            ranks.push((s.clone(), s.compile(NAME, &source, &[], &layout)?));
        }
        Ok(Some(Arc::new(OneShot {
            areas,
            bases,
            ranks,
            deadline_ns: u64::try_from(deadline.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
        })))
    }

    /// Rank `rank`'s area, the buffer its calls write.
    pub(crate) fn area(&self, rank: usize) -> &Arc<Memory> {
        &self.areas[rank]
    }

    /// Enqueues rank `rank`'s part of the all-reduce of `n` `f32` (at most [`CAP`]) from
    /// `send` into `recv` (device pointers of that rank's device, `n` elements each, possibly
    /// the same) on `stream`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Collective`] when the device of a rank faulted or was reset since the
    /// group was made: its area went with its context, and the address may be another
    /// allocation's by now, so no kernel may write there; a driver error of the launch.
    pub(crate) fn enqueue(
        &self,
        rank: usize,
        stream: &CudaStreamHandle,
        send: u64,
        recv: u64,
        n: usize,
    ) -> Result<()> {
        // Every rank's device state is held from its check until the launch is enqueued, so
        // that no reset comes between them (a reset waits for these gates).
        let mut held = Vec::with_capacity(self.ranks.len());
        for (r, (peer, _)) in self.ranks.iter().enumerate() {
            held.push(peer.life.gate.read_recursive());
            if r != rank && peer.life.check().is_err() {
                return Err(DeviceError::Collective {
                    op: "all_reduce",
                    rank,
                    reason: format!(
                        "the device of rank {r} (cuda:{}) faulted or was reset since this \
                         communicator was made; make new communicators for the group",
                        peer.ordinal
                    ),
                });
            }
        }
        if n > CAP {
            return Err(DeviceError::internal(
                "a one-shot all-reduce above its capacity",
            ));
        }
        let (shared, kernel) = &self.ranks[rank];
        let mut areas = self.bases;
        let (mut send, mut recv) = (send, recv);
        let mut n = n as u32;
        let (mut rank_arg, mut world) = (rank as u32, self.areas.len() as u32);
        let mut deadline = self.deadline_ns;
        let mut params: [*mut c_void; 7] = [
            (&mut send as *mut u64).cast(),
            (&mut recv as *mut u64).cast(),
            (&mut n as *mut u32).cast(),
            (&mut areas as *mut Areas).cast(),
            (&mut rank_arg as *mut u32).cast(),
            (&mut world as *mut u32).cast(),
            (&mut deadline as *mut u64).cast(),
        ];
        let _bound = shared.bind()?;
        kernel.check_state(shared)?;
        // SAFETY: the function was loaded in this device's context (checked above) and takes
        // the seven parameters of `source()`, whose values live in this frame until the call
        // returns. `send` and `recv` hold `n` elements on this device, alive until the work is
        // done (the access tracker recorded them). Every area is alive: none is ever freed
        // (`Drop`), and no rank's device was reset (checked above, under the gates); the kernel
        // writes its rank's area (which the call declared as written, so its uses are ordered)
        // and, through the flag protocol of the module docs, reads the others' staged halves
        // only between the two barriers of the same call, and writes only their flag words.
        unsafe {
            result::launch_kernel(
                kernel.function(),
                (BLOCKS as u32, 1, 1),
                (THREADS, 1, 1),
                0,
                stream.raw(),
                &mut params,
            )
        }
        .map_err(|e| driver_err("cuLaunchKernel", e))
    }
}

impl Drop for OneShot {
    /// Keeps the areas for the rest of the process (`AREA_BYTES`, about 130 KiB, a rank). A
    /// rank's area is read and written by the other ranks' kernels, which no access tracker
    /// of its device sees; a kernel of a rank that made one call more than the others (a
    /// broken program) writes its flags into every peer's area before it waits. Freeing them
    /// safely would take a wait for every rank's device, which may run into another thread's
    /// capture on one of them, so they are not freed at all.
    fn drop(&mut self) {
        for area in self.areas.drain(..) {
            std::mem::forget(area);
        }
    }
}

//! Reading checkpoint tensors into device memory: the staging of their bytes through pinned
//! host memory (the tensor index of the `*.safetensors` files is [`super::checkpoint`]).
//!
//! Files are not memory-mapped: mapping a file is `unsafe` in Rust (another process may
//! change it under the map), and this crate has no `unsafe`. Each tensor is instead read
//! with `std::fs::File` at its offset, in chunks of 16 MiB, straight into one of
//! [`STAGING_BUFFERS`] pinned staging buffers (converted to `bf16` on the way when the file
//! holds `f32` or `f16`), and copied to the device asynchronously while the next chunks are
//! read; a tensor's last chunk, or a tensor smaller than a chunk, fills the first elements of
//! a buffer. The file's header is parsed with the `safetensors` crate's own types, and every
//! tensor's shape, dtype and byte range are checked against the config before anything is
//! copied. The staging buffers are allocated as the first chunks are read, after those
//! checks, and hold a chunk or the largest tensor, whichever is smaller: a load refused by
//! the checks allocates no pinned memory, and a small model only as much as it reads.
//!
//! One thread copying out of the page cache moves a few GB/s, a tenth of what a pinned
//! host-to-device copy moves, so a large read is split into parts of at least
//! [`PART_BYTES`] read at once by up to [`READ_THREADS`] threads (positioned reads of the one
//! file handle, on Unix; one read elsewhere), and so are the conversions and the copies of
//! synthetic weights. The threads are a `rayon` pool made once per load: starting threads
//! for every chunk cost a good part of the time of reading it.
//!
//! Under tensor parallelism a rank reads only its slice of each split tensor: rows of a matrix
//! are one contiguous byte range of the file, read like a whole tensor; columns are a run of
//! every row, so the whole rows that one staging chunk of the slice covers are read at once
//! (about `tp` chunks' worth of the file's bytes) and the columns picked out on the host.
//!
//! Invariant: a staging buffer is filled only after its previous copy to the device has
//! completed (its `PinnedTransfer` was waited for), so the device never reads a chunk that
//! the host is overwriting.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::ops::Range;

use cuflow_runtime::{BufferView, DeviceError, PinnedBuffer, PinnedTransfer, Stream};
use cuflow_tensor::{bf16, f16};
use safetensors::Dtype;

use super::checkpoint::Checkpoint;
use super::files::{io_error, open_regular};
use super::tensor_parallel::Split;
use super::testing::CheckpointTensor;

/// The most elements of one staging chunk (16 MiB of `bf16`).
const CHUNK: usize = 8 << 20;

/// Pinned staging buffers of a [`Stager`]: the next chunks are read while the earlier ones
/// are copied to the device.
const STAGING_BUFFERS: usize = 3;

/// The fewest bytes (of the file, or of `bf16` written) that a reading or converting thread
/// is given: smaller parts cost more to hand out than they save.
const PART_BYTES: usize = 1 << 20;

/// The most threads that read or convert one chunk at once.
const READ_THREADS: usize = 16;

/// Threads a chunk is read with: the machine's parallelism up to [`READ_THREADS`] (asked
/// once: on Linux the answer reads the process's cgroup files).
fn read_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(READ_THREADS))
    })
}

/// A pool of `threads` threads for one load's reads and conversions, or `None` (everything
/// on the calling thread) for one thread or when the system will not start them.
fn readers(threads: usize) -> Option<rayon::ThreadPool> {
    if threads < 2 {
        return None;
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("cuflow-load-{i}"))
        .build()
        .ok()
}

/// Runs `work(start, part)` over consecutive parts of `out` that together cover it, `start`
/// being the index of `part`'s first element in `out`: on the calling thread when there is no
/// pool or `out` holds fewer than two parts of `min_part` elements, else on `pool`'s threads,
/// in as many parts as it has threads at most, each part a multiple of `align` elements but
/// the last. The first error in the order of the parts is returned once every part has
/// ended, or `panicked()` if a part panicked.
fn in_parts<T: Send, E: Send>(
    out: &mut [T],
    (min_part, align): (usize, usize),
    pool: Option<&rayon::ThreadPool>,
    work: impl Fn(usize, &mut [T]) -> Result<(), E> + Sync,
    panicked: impl Fn() -> E,
) -> Result<(), E> {
    use rayon::prelude::*;
    let threads = pool.map_or(1, rayon::ThreadPool::current_num_threads);
    let parts = (out.len() / min_part.max(1)).clamp(1, threads.max(1));
    let Some(pool) = pool.filter(|_| parts > 1) else {
        return work(0, out);
    };
    let align = align.max(1);
    let part = out.len().div_ceil(parts).div_ceil(align) * align;
    // A part that panics makes the pool's call panic once every part has ended.
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.install(|| {
            out.par_chunks_mut(part)
                .enumerate()
                .map(|(i, piece)| work(i * part, piece))
                .collect::<Vec<_>>()
        })
    }));
    match ended {
        Ok(results) => results.into_iter().collect(),
        Err(_) => Err(panicked()),
    }
}

/// Reads `out.len()` bytes of `file` from `offset`, in parts on several threads when they are
/// many (positioned reads, which leave the handle's cursor alone, on Unix).
fn read_at(
    file: &File,
    offset: u64,
    out: &mut [u8],
    (min_part, pool): (usize, Option<&rayon::ThreadPool>),
) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        in_parts(
            out,
            (min_part, 1),
            pool,
            |start, part| file.read_exact_at(part, offset + start as u64),
            || std::io::Error::other("a thread reading the file panicked"),
        )
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let _ = (min_part, pool);
        let mut file = file;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(out)
    }
}

/// Which elements of a checkpoint tensor a [`Stager`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// All of it.
    Whole,
    /// Rows `range` of a matrix: one contiguous byte range of the source.
    Rows(Range<usize>),
    /// Columns `range` of a matrix: a run of every row.
    Columns(Range<usize>),
}

/// Converts the little-endian elements `raw` of `dtype` (`F32`, `F16` or `BF16`) into `out`.
fn convert(dtype: Dtype, raw: &[u8], out: &mut [bf16]) {
    match dtype {
        Dtype::F32 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        }
        Dtype::F16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32());
            }
        }
        _ => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]);
            }
        }
    }
}

/// [`convert`] of `raw` (`out.len()` elements of `dtype`) into `out`, in parts on several
/// threads when they are many.
fn convert_in_parts(
    dtype: Dtype,
    raw: &[u8],
    out: &mut [bf16],
    (min_bytes, pool): (usize, Option<&rayon::ThreadPool>),
) -> Result<(), DeviceError> {
    let size = dtype.bitsize() / 8;
    in_parts(
        out,
        ((min_bytes / 2).max(1), 1),
        pool,
        |start, part| {
            let raw = raw
                .get(start * size..(start + part.len()) * size)
                .ok_or_else(|| {
                    DeviceError::internal("fewer bytes read than elements to convert")
                })?;
            convert(dtype, raw, part);
            Ok(())
        },
        || DeviceError::internal("a thread converting checkpoint elements panicked"),
    )
}

/// Where a [`Stager`] reads tensors from.
#[derive(Debug)]
pub(crate) enum Source<'a> {
    /// A checkpoint's files.
    Files(&'a Checkpoint),
    /// Tensors in host memory (synthetic weights).
    Memory(&'a HashMap<String, CheckpointTensor>),
}

/// Copies checkpoint tensors into device memory through two pinned staging buffers.
pub(crate) struct Stager<'a> {
    stream: &'a Stream,
    source: Source<'a>,
    /// This rank's slices under tensor parallelism; `None` reads whole tensors.
    split: Option<Split>,
    /// Elements of a staging buffer: at most the largest tensor [`Stager::check_all`] saw.
    chunk: usize,
    /// The fewest bytes a reading or converting thread is given.
    part_bytes: usize,
    /// The threads that read and convert chunks in parts; `None` does it on this thread.
    readers: Option<rayon::ThreadPool>,
    /// Staging buffers allocated so far (at most [`STAGING_BUFFERS`]).
    staged: usize,
    free: Vec<PinnedBuffer<bf16>>,
    in_flight: VecDeque<PinnedTransfer<bf16>>,
    open_files: HashMap<usize, File>,
    raw: Vec<u8>,
    /// Bytes read from the source so far.
    pub(crate) bytes_read: usize,
}

impl std::fmt::Debug for Stager<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("bytes_read", &self.bytes_read)
            .finish()
    }
}

impl<'a> Stager<'a> {
    /// A stager of `source` onto `stream`'s device: of whole tensors, or of this rank's
    /// slices under `split`.
    pub(crate) fn new(
        stream: &'a Stream,
        source: Source<'a>,
        split: Option<Split>,
    ) -> Result<Self, DeviceError> {
        Stager::with_chunk(stream, source, split, CHUNK)
    }

    /// As [`Stager::new`], staging at most `chunk` elements at a time.
    fn with_chunk(
        stream: &'a Stream,
        source: Source<'a>,
        split: Option<Split>,
        chunk: usize,
    ) -> Result<Self, DeviceError> {
        Ok(Stager {
            stream,
            source,
            split,
            chunk: chunk.max(1),
            part_bytes: PART_BYTES,
            readers: readers(read_threads()),
            staged: 0,
            free: Vec::new(),
            in_flight: VecDeque::new(),
            open_files: HashMap::new(),
            raw: Vec::new(),
            bytes_read: 0,
        })
    }

    fn where_(&self) -> String {
        match &self.source {
            Source::Files(c) => format!("checkpoint {}", c.dir.display()),
            Source::Memory(_) => "synthetic weights".into(),
        }
    }

    /// Checks every tensor of `tensors` (names with this rank's shapes) against the source,
    /// as [`Stager::read`] will read them, and that a checkpoint holds no tensor besides them
    /// (see [`Checkpoint::ensure_all_read`]; `tied` says whether the embeddings are the head):
    /// a load finds a missing, misshapen, corrupt or unread tensor before it allocates
    /// anything. The staging buffers, allocated by the reads after it, then hold at most the
    /// largest of `tensors`.
    pub(crate) fn check_all(
        &mut self,
        tensors: impl IntoIterator<Item = (String, Vec<usize>)>,
        tied: bool,
    ) -> Result<(), DeviceError> {
        let mut read = HashSet::new();
        let mut largest = 1;
        for (name, shape) in tensors {
            let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            largest = largest.max(elements.unwrap_or(usize::MAX));
            let full = match &self.split {
                Some(split) => split.part(&name, &shape).0,
                None => shape,
            };
            self.lookup(&name, &full)?;
            read.insert(name);
        }
        match &self.source {
            Source::Files(c) => c.ensure_all_read(&read, tied)?,
            Source::Memory(_) => {}
        }
        self.chunk = self.chunk.min(largest);
        Ok(())
    }

    /// Checks tensor `name` against `shape`, and its bytes against its shape and dtype, and
    /// returns its dtype and shape.
    fn lookup(&self, name: &str, shape: &[usize]) -> Result<(Dtype, Vec<usize>), DeviceError> {
        let (dtype, found_shape, bytes) = match &self.source {
            Source::Files(c) => match c.entries.get(name) {
                Some(e) => (e.dtype, e.shape.clone(), e.bytes),
                None => {
                    let mut some: Vec<&String> = c.entries.keys().collect();
                    some.sort();
                    some.truncate(3);
                    return Err(DeviceError::usage(format!(
                        "{}: tensor `{name}` is missing (the files hold {} tensors, e.g. \
                         {some:?}); is this a Llama checkpoint with Hugging Face names, and \
                         does config.json (tie_word_embeddings, num_hidden_layers) match it?",
                        self.where_(),
                        c.entries.len()
                    )));
                }
            },
            Source::Memory(m) => match m.get(name) {
                Some(t) => (t.dtype.safetensors(), t.shape.clone(), t.data.len()),
                None => {
                    return Err(DeviceError::internal(format!(
                        "synthetic tensor `{name}` was not generated"
                    )))
                }
            },
        };
        if found_shape != shape {
            return Err(DeviceError::usage(format!(
                "{}: tensor `{name}` has shape {found_shape:?}, but config.json implies \
                 {shape:?}; the config does not describe these weights",
                self.where_()
            )));
        }
        if !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(DeviceError::usage(format!(
                "{}: tensor `{name}` is {dtype:?}; only F32, F16 and BF16 weights can be loaded \
                 (quantized checkpoints are not supported)",
                self.where_()
            )));
        }
        let needed = shape
            .iter()
            .try_fold(dtype.bitsize() / 8, |n, &d| n.checked_mul(d));
        if needed != Some(bytes) {
            let needed = needed.map_or("more than the address space".into(), |n| n.to_string());
            return Err(DeviceError::usage(format!(
                "{}: tensor `{name}` holds {bytes} bytes, but its shape {shape:?} of {dtype:?} \
                 needs {needed}; the file is corrupt (a truncated or edited download?)",
                self.where_()
            )));
        }
        Ok((dtype, found_shape))
    }

    /// Reads elements `range` of this rank's `part` of tensor `name` (of `dtype` and shape
    /// `full` in the source) converted to `bf16` into `out`.
    fn fill(
        &mut self,
        name: &str,
        (dtype, full): (Dtype, &[usize]),
        part: &Part,
        range: Range<usize>,
        out: &mut [bf16],
    ) -> Result<(), DeviceError> {
        let cols = full.last().copied().unwrap_or(1);
        match part {
            Part::Whole => self.fill_run(name, dtype, range, out),
            Part::Rows(rows) => {
                let base = rows.start * cols;
                self.fill_run(name, dtype, base + range.start..base + range.end, out)
            }
            Part::Columns(columns) => self.fill_columns(name, dtype, cols, columns, range, out),
        }
    }

    /// Reads the contiguous elements `range` of tensor `name` converted to `bf16` into `out`.
    fn fill_run(
        &mut self,
        name: &str,
        dtype: Dtype,
        range: Range<usize>,
        out: &mut [bf16],
    ) -> Result<(), DeviceError> {
        let size = dtype.bitsize() / 8;
        let n = range.len() * size;
        if dtype == Dtype::BF16 {
            // Read straight into the destination's bytes.
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
            self.read_bytes(name, range.start * size, bytes)?;
        } else {
            let mut raw = std::mem::take(&mut self.raw);
            raw.resize(n, 0);
            let read = self
                .read_bytes(name, range.start * size, &mut raw)
                .and_then(|()| {
                    convert_in_parts(dtype, &raw, out, (self.part_bytes, self.readers.as_ref()))
                });
            self.raw = raw;
            read?;
        }
        self.bytes_read += n;
        Ok(())
    }

    /// Reads elements `range` of columns `columns` of the `[_, cols]` matrix `name`
    /// (row-major, so the range covers whole or partial rows of the slice) converted to
    /// `bf16` into `out`. The whole rows it touches are read at once and the columns picked
    /// out on the host.
    fn fill_columns(
        &mut self,
        name: &str,
        dtype: Dtype,
        cols: usize,
        columns: &Range<usize>,
        range: Range<usize>,
        out: &mut [bf16],
    ) -> Result<(), DeviceError> {
        let (width, size) = (columns.len(), dtype.bitsize() / 8);
        if range.is_empty() || width == 0 {
            return Ok(());
        }
        let (first, last) = (range.start / width, range.end.div_ceil(width));
        let mut raw = std::mem::take(&mut self.raw);
        raw.resize((last - first) * cols * size, 0);
        self.read_bytes(name, first * cols * size, &mut raw)?;
        self.bytes_read += raw.len();
        let (mut at, mut done) = (range.start, 0);
        while at < range.end {
            let (row, col) = (at / width, at % width);
            let n = (width - col).min(range.end - at);
            let src = ((row - first) * cols + columns.start + col) * size;
            convert(dtype, &raw[src..src + n * size], &mut out[done..done + n]);
            at += n;
            done += n;
        }
        self.raw = raw;
        Ok(())
    }

    fn read_bytes(&mut self, name: &str, offset: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        let parts = (self.part_bytes, self.readers.as_ref());
        match &self.source {
            Source::Memory(m) => {
                let t = m
                    .get(name)
                    .ok_or_else(|| DeviceError::internal(format!("no synthetic `{name}`")))?;
                let src = t.data.get(offset..offset + out.len()).ok_or_else(|| {
                    DeviceError::internal(format!("synthetic `{name}` is too short"))
                })?;
                in_parts(
                    out,
                    (parts.0, 1),
                    parts.1,
                    |start, part| {
                        let from = src.get(start..start + part.len()).ok_or_else(|| {
                            DeviceError::internal(format!("synthetic `{name}` is too short"))
                        })?;
                        part.copy_from_slice(from);
                        Ok(())
                    },
                    || DeviceError::internal("a thread copying synthetic weights panicked"),
                )
            }
            Source::Files(c) => {
                let e = c
                    .entries
                    .get(name)
                    .ok_or_else(|| DeviceError::internal(format!("no entry for `{name}`")))?;
                let path = &c.files[e.file];
                let file = match self.open_files.entry(e.file) {
                    std::collections::hash_map::Entry::Occupied(f) => f.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => v.insert(open_regular(path)?),
                };
                read_at(file, e.start + offset as u64, out, parts)
                    .map_err(|err| io_error(path, &format!("read tensor `{name}` from"), err))
            }
        }
    }

    /// Copies checkpoint tensor `name`, which must have `shape` (this rank's slice of it
    /// under a [`Split`]), into `dst`.
    pub(crate) fn read(
        &mut self,
        name: &str,
        shape: &[usize],
        dst: BufferView<'_, bf16>,
    ) -> Result<(), DeviceError> {
        let (full, part) = match &self.split {
            Some(split) => split.part(name, shape),
            None => (shape.to_vec(), Part::Whole),
        };
        let (dtype, _) = self.lookup(name, &full)?;
        let len = dst.len();
        let mut start = 0;
        while start < len {
            let end = (start + self.chunk).min(len);
            let mut pinned = match self.free.pop() {
                Some(p) => p,
                None if self.staged < STAGING_BUFFERS => {
                    let p = PinnedBuffer::new(self.stream.device(), self.chunk)?;
                    self.staged += 1;
                    p
                }
                None => match self.in_flight.pop_front() {
                    Some(t) => t.wait()?,
                    None => return Err(DeviceError::internal("no staging buffer")),
                },
            };
            let source = (dtype, &full[..]);
            let staged = pinned
                .as_mut_slice()
                .get_mut(..end - start)
                .ok_or_else(|| DeviceError::internal("a staging buffer shorter than a chunk"))
                .and_then(|out| self.fill(name, source, &part, start..end, out));
            staged?;
            // A chunk shorter than the buffer (a tensor's last) takes the buffer's first
            // elements.
            let transfer = pinned.copy_prefix_to_device(self.stream, dst.slice(start..end)?)?;
            self.in_flight.push_back(transfer);
            start = end;
        }
        Ok(())
    }

    /// Waits for every copy in flight.
    pub(crate) fn finish(&mut self) -> Result<(), DeviceError> {
        while let Some(t) = self.in_flight.pop_front() {
            self.free.push(t.wait()?);
        }
        self.stream.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::testing::WeightDtype;
    use cuflow_runtime::{Device, DeviceBuffer};

    /// A `[rows, cols]` tensor of distinct values (exact in `bf16` and `f16`) stored as `dtype`.
    fn tensor(name: &str, rows: usize, cols: usize, dtype: WeightDtype) -> CheckpointTensor {
        let values = (0..rows * cols).map(|i| i as f32 - 40.0);
        let data = match dtype {
            WeightDtype::F32 => values.flat_map(f32::to_le_bytes).collect(),
            WeightDtype::F16 => values
                .flat_map(|v| f16::from_f32(v).to_le_bytes())
                .collect(),
            _ => values
                .flat_map(|v| bf16::from_f32(v).to_le_bytes())
                .collect(),
        };
        CheckpointTensor {
            name: name.into(),
            dtype,
            shape: vec![rows, cols],
            data,
        }
    }

    /// Reads every rank's slice of the row-split, column-split and replicated `[6, 12]`
    /// matrices [`NAMES`] from `source` in chunks of 7 elements (so chunks end inside rows,
    /// and the last of a tensor is shorter), `parts` as the stager's thread split,
    /// and checks each against the slice taken from the matrix directly.
    fn assert_slices<'a>(
        stream: &'a Stream,
        source: impl Fn() -> Source<'a>,
        parts: (usize, usize),
        what: &str,
    ) -> Result<(), DeviceError> {
        let (cols, tp) = (12, 3);
        for rank in 0..tp {
            let split = Split { rank, tp };
            let mut stager = Stager::with_chunk(stream, source(), Some(split), 7)?;
            stager.part_bytes = parts.0;
            stager.readers = readers(parts.1);
            for (name, local) in NAMES {
                let dst = DeviceBuffer::<bf16>::zeroed(stream, local[0] * local[1])?;
                stager.read(name, &local, dst.view())?;
                stager.finish()?;
                // Rank r holds rows r·2.. of q_proj and columns r·4.. of down_proj.
                let (r0, c0) = match local {
                    [2, 12] => (rank * 2, 0),
                    [6, 4] => (0, rank * 4),
                    _ => (0, 0),
                };
                let want: Vec<bf16> = (0..local[0] * local[1])
                    .map(|i| {
                        let (r, c) = (r0 + i / local[1], c0 + i % local[1]);
                        bf16::from_f32((r * cols + c) as f32 - 40.0)
                    })
                    .collect();
                let what = format!("{name}, rank {rank} of {tp}, {what}, parts {parts:?}");
                assert_eq!(dst.to_host_vec(stream)?, want, "{what}");
            }
        }
        Ok(())
    }

    /// The matrices of [`assert_slices`] and their shapes on each of 3 ranks.
    const NAMES: [(&str, [usize; 2]); 3] = [
        ("model.layers.0.self_attn.q_proj.weight", [2, 12]),
        ("model.layers.0.mlp.down_proj.weight", [6, 4]),
        ("model.embed_tokens.weight", [6, 12]),
    ];

    fn tensors(dtype: WeightDtype) -> Vec<CheckpointTensor> {
        NAMES.iter().map(|(n, _)| tensor(n, 6, 12, dtype)).collect()
    }

    /// Every rank's slice of a row-split, a column-split and a replicated matrix equals the
    /// slice taken from the matrix directly, read from host memory and from a checkpoint
    /// file, in one piece and in parts of a few bytes on two and on four threads (so parts end
    /// inside elements and rows).
    #[test]
    fn sliced_reads_equal_the_slices() -> Result<(), DeviceError> {
        let device = Device::auto()?;
        let stream = device.new_stream()?;
        for dtype in [WeightDtype::Bf16, WeightDtype::F32, WeightDtype::F16] {
            let map: HashMap<String, CheckpointTensor> = tensors(dtype)
                .into_iter()
                .map(|t| (t.name.clone(), t))
                .collect();
            let dir = std::env::temp_dir().join(format!(
                "cuflow-loader-{dtype:?}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, "create", e))?;
            crate::llama::testing::write_checkpoint(
                &dir,
                &crate::llama::LlamaConfig::tiny(),
                &tensors(dtype),
            )?;
            let checkpoint = Checkpoint::open(&dir)?;
            for parts in [(PART_BYTES, READ_THREADS), (3, 4), (5, 2)] {
                let what = format!("{dtype:?} from memory");
                assert_slices(&stream, || Source::Memory(&map), parts, &what)?;
                let what = format!("{dtype:?} from a file");
                assert_slices(&stream, || Source::Files(&checkpoint), parts, &what)?;
            }
            std::fs::remove_dir_all(&dir).ok();
        }
        Ok(())
    }

    /// `in_parts` hands every element to exactly one part, at its index, aligned as asked,
    /// in as many parts as the pool has threads at most, and returns the first error in the order of the
    /// parts after every part ran.
    #[test]
    fn parts_cover_the_output_once_and_keep_the_first_error() {
        for len in [0, 1, 7, 64, 1000, 1001] {
            for (min_part, align, threads) in [(1, 1, 4), (3, 2, 3), (10, 4, 8), (2000, 1, 8)] {
                let mut out = vec![usize::MAX; len];
                let calls = std::sync::atomic::AtomicUsize::new(0);
                let pool = readers(threads);
                let r: Result<(), ()> = in_parts(
                    &mut out,
                    (min_part, align),
                    pool.as_ref(),
                    |start, part| {
                        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        assert!(start % align == 0, "part at {start}, align {align}");
                        for (i, x) in part.iter_mut().enumerate() {
                            assert_eq!(*x, usize::MAX, "element {} written twice", start + i);
                            *x = start + i;
                        }
                        Ok(())
                    },
                    || (),
                );
                assert_eq!(r, Ok(()));
                assert_eq!(out, (0..len).collect::<Vec<_>>(), "len {len}, {min_part}");
                let calls = calls.into_inner();
                assert!(
                    calls >= 1 && calls <= threads,
                    "{calls} parts for {threads} threads"
                );
                if len < 2 * min_part {
                    assert_eq!(calls, 1, "len {len} is below two parts of {min_part}");
                }
            }
        }
        let mut out = vec![0u8; 100];
        let ran = std::sync::atomic::AtomicUsize::new(0);
        let four = readers(4);
        let r = in_parts(
            &mut out,
            (10, 1),
            four.as_ref(),
            |start, _| {
                ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if start > 0 {
                    Err(start)
                } else {
                    Ok(())
                }
            },
            || usize::MAX,
        );
        assert_eq!(
            r,
            Err(25),
            "the second of four parts of 25 failed first in order"
        );
        assert_eq!(ran.into_inner(), 4);
        let r = in_parts(
            &mut out,
            (10, 1),
            four.as_ref(),
            |start, _| if start == 50 { panic!("part") } else { Ok(()) },
            || 7,
        );
        assert_eq!(
            r,
            Err(7),
            "a part that panics is the error the caller names"
        );
    }

    /// The staging buffers are allocated by the reads, not before the checks: a check that
    /// fails leaves none, and a checkpoint of tensors smaller than a chunk stages its largest
    /// tensor's elements at a time, in as many buffers as its reads need, at most
    /// [`STAGING_BUFFERS`].
    #[test]
    fn staging_buffers_come_after_the_checks_and_fit_the_tensors() -> Result<(), DeviceError> {
        let stream = Device::auto()?.new_stream()?;
        let map: HashMap<String, CheckpointTensor> = tensors(WeightDtype::Bf16)
            .into_iter()
            .chain([tensor("model.norm.weight", 1, 5, WeightDtype::Bf16)])
            .map(|t| (t.name.clone(), t))
            .collect();
        let mut stager = Stager::new(&stream, Source::Memory(&map), None)?;
        let missing = [("model.layers.9.mlp.up_proj.weight".to_string(), vec![6, 12])];
        assert!(stager.check_all(missing, false).is_err());
        assert_eq!((stager.staged, stager.chunk), (0, CHUNK));
        let all = [("model.norm.weight".to_string(), vec![1, 5])]
            .into_iter()
            .chain(NAMES.iter().map(|(n, _)| (n.to_string(), vec![6, 12])));
        stager.check_all(all, false)?;
        assert_eq!((stager.staged, stager.chunk), (0, 72));
        for (name, _) in NAMES {
            let dst = DeviceBuffer::<bf16>::zeroed(&stream, 72)?;
            stager.read(name, &[6, 12], dst.view())?;
        }
        stager.finish()?;
        assert!((1..=STAGING_BUFFERS).contains(&stager.staged));
        assert!(stager.free.iter().all(|p| p.len() == 72));
        Ok(())
    }

    #[test]
    fn a_split_checks_the_whole_shape() -> Result<(), DeviceError> {
        let stream = Device::auto()?.new_stream()?;
        let name = "model.layers.0.self_attn.o_proj.weight";
        let map = HashMap::from([(name.to_string(), tensor(name, 4, 6, WeightDtype::Bf16))]);
        let split = Some(Split { rank: 0, tp: 2 });
        let mut stager = Stager::new(&stream, Source::Memory(&map), split)?;
        let dst = DeviceBuffer::<bf16>::zeroed(&stream, 8)?;
        let e = stager.read(name, &[4, 2], dst.view()).unwrap_err();
        assert!(
            e.to_string().contains("[4, 6]") && e.to_string().contains("[4, 4]"),
            "{e}"
        );
        Ok(())
    }
}

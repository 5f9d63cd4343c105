//! Reading checkpoint tensors into device memory: the tensor index of Hugging Face
//! `*.safetensors` files, and the staging of their bytes through pinned host memory.
//!
//! Files are not memory-mapped: mapping a file is `unsafe` in Rust (another process may
//! change it under the map), and this crate has no `unsafe`. Each tensor is instead read
//! with `std::fs::File` at its offset, in chunks of 16 MiB, straight into one of two pinned
//! staging buffers (converted to `bf16` on the way when the file holds `f32` or `f16`), and
//! copied to the device asynchronously while the next chunk is read. The file's header is
//! parsed with the `safetensors` crate's own types, and every tensor's shape, dtype and
//! byte range are checked against the config before anything is copied.
//!
//! Invariant: a staging buffer is filled only after its previous copy to the device has
//! completed (its `PinnedTransfer` was waited for), so the device never reads a chunk that
//! the host is overwriting.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use cuflow_runtime::{BufferView, DeviceError, PinnedBuffer, PinnedTransfer, Stream};
use cuflow_tensor::{bf16, f16};
use safetensors::tensor::TensorInfo;
use safetensors::Dtype;

use super::testing::CheckpointTensor;

/// Elements of one staging chunk (16 MiB of `bf16`).
const CHUNK: usize = 8 << 20;

/// Where a tensor's bytes are: one of the checkpoint's files at an offset.
#[derive(Debug)]
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte offset in the file.
    start: u64,
    bytes: usize,
}

/// The tensors of a checkpoint folder's `*.safetensors` files.
#[derive(Debug)]
pub(crate) struct Checkpoint {
    dir: PathBuf,
    files: Vec<PathBuf>,
    entries: HashMap<String, Entry>,
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> DeviceError {
    DeviceError::usage(format!("cannot {what} {}: {e}", path.display()))
}

impl Checkpoint {
    /// Indexes every `*.safetensors` file of `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Checkpoint, DeviceError> {
        let listing = std::fs::read_dir(dir).map_err(|e| io_error(dir, "list", e))?;
        let mut files: Vec<PathBuf> = listing
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(DeviceError::usage(format!(
                "{} holds no *.safetensors file; a Hugging Face checkpoint folder holds \
                 config.json and model.safetensors (or model-0000N-of-0000M.safetensors)",
                dir.display()
            )));
        }
        let mut entries = HashMap::new();
        for (index, path) in files.iter().enumerate() {
            let mut file = File::open(path).map_err(|e| io_error(path, "open", e))?;
            let file_len = file
                .metadata()
                .map_err(|e| io_error(path, "stat", e))?
                .len();
            let mut len = [0u8; 8];
            file.read_exact(&mut len)
                .map_err(|e| io_error(path, "read the header of", e))?;
            let header_len = u64::from_le_bytes(len);
            if header_len > 100 << 20 || 8 + header_len > file_len {
                return Err(DeviceError::usage(format!(
                    "{} is not a safetensors file: its header length {header_len} does not \
                     fit its {file_len} bytes",
                    path.display()
                )));
            }
            let mut header = vec![0u8; header_len as usize];
            file.read_exact(&mut header)
                .map_err(|e| io_error(path, "read the header of", e))?;
            let table: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
                .map_err(|e| {
                    DeviceError::usage(format!(
                        "{} has an unreadable safetensors header: {e}",
                        path.display()
                    ))
                })?;
            let data_start = 8 + header_len;
            for (name, value) in table {
                if name == "__metadata__" {
                    continue;
                }
                let info: TensorInfo = serde_json::from_value(value).map_err(|e| {
                    DeviceError::usage(format!(
                        "{}: tensor `{name}` has an unreadable header entry: {e}",
                        path.display()
                    ))
                })?;
                let (begin, end) = info.data_offsets;
                if end < begin || data_start + end as u64 > file_len {
                    return Err(DeviceError::usage(format!(
                        "{}: tensor `{name}` claims bytes {begin}..{end} past the end of the \
                         file (truncated download?)",
                        path.display()
                    )));
                }
                entries.insert(
                    name,
                    Entry {
                        file: index,
                        dtype: info.dtype,
                        shape: info.shape,
                        start: data_start + begin as u64,
                        bytes: end - begin,
                    },
                );
            }
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            files,
            entries,
        })
    }

    /// Bytes of every tensor of the checkpoint.
    pub(crate) fn total_bytes(&self) -> usize {
        self.entries.values().map(|e| e.bytes).sum()
    }
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
    pub(crate) fn new(stream: &'a Stream, source: Source<'a>) -> Result<Self, DeviceError> {
        let free = (0..2)
            .map(|_| PinnedBuffer::new(stream.device(), CHUNK))
            .collect::<Result<_, _>>()?;
        Ok(Stager {
            stream,
            source,
            free,
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

    /// Checks tensor `name` against `shape` and returns its dtype and byte count.
    fn lookup(&self, name: &str, shape: &[usize]) -> Result<(Dtype, Vec<usize>), DeviceError> {
        let (dtype, found_shape) = match &self.source {
            Source::Files(c) => match c.entries.get(name) {
                Some(e) => (e.dtype, e.shape.clone()),
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
                Some(t) => (t.dtype.safetensors(), t.shape.clone()),
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
        Ok((dtype, found_shape))
    }

    /// Reads elements `range` of tensor `name` (of `dtype`) converted to `bf16` into `out`.
    fn fill(
        &mut self,
        name: &str,
        dtype: Dtype,
        range: std::ops::Range<usize>,
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
            self.read_bytes(name, range.start * size, &mut raw)?;
            match dtype {
                Dtype::F32 => {
                    for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                        *o = bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    }
                }
                _ => {
                    for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                        *o = bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32());
                    }
                }
            }
            self.raw = raw;
        }
        self.bytes_read += n;
        Ok(())
    }

    fn read_bytes(&mut self, name: &str, offset: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        match &self.source {
            Source::Memory(m) => {
                let t = m
                    .get(name)
                    .ok_or_else(|| DeviceError::internal(format!("no synthetic `{name}`")))?;
                let src = t.data.get(offset..offset + out.len()).ok_or_else(|| {
                    DeviceError::internal(format!("synthetic `{name}` is too short"))
                })?;
                out.copy_from_slice(src);
                Ok(())
            }
            Source::Files(c) => {
                let e = c
                    .entries
                    .get(name)
                    .ok_or_else(|| DeviceError::internal(format!("no entry for `{name}`")))?;
                let path = &c.files[e.file];
                let file = match self.open_files.entry(e.file) {
                    std::collections::hash_map::Entry::Occupied(f) => f.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(File::open(path).map_err(|err| io_error(path, "open", err))?)
                    }
                };
                file.seek(SeekFrom::Start(e.start + offset as u64))
                    .and_then(|_| file.read_exact(out))
                    .map_err(|err| io_error(path, &format!("read tensor `{name}` from"), err))
            }
        }
    }

    /// Copies checkpoint tensor `name`, which must have `shape`, into `dst`.
    pub(crate) fn read(
        &mut self,
        name: &str,
        shape: &[usize],
        dst: BufferView<'_, bf16>,
    ) -> Result<(), DeviceError> {
        let (dtype, _) = self.lookup(name, shape)?;
        let len = dst.len();
        let mut start = 0;
        while start < len {
            let end = (start + CHUNK).min(len);
            if end - start == CHUNK {
                let mut pinned = match self.free.pop() {
                    Some(p) => p,
                    None => match self.in_flight.pop_front() {
                        Some(t) => t.wait()?,
                        None => return Err(DeviceError::internal("no staging buffer")),
                    },
                };
                self.fill(name, dtype, start..end, &mut pinned.as_mut_slice())?;
                let transfer = pinned.copy_to_device(self.stream, dst.slice(start..end)?)?;
                self.in_flight.push_back(transfer);
            } else {
                // A tail shorter than a staging buffer goes through pageable memory.
                let mut tail = vec![bf16::ZERO; end - start];
                self.fill(name, dtype, start..end, &mut tail)?;
                dst.slice(start..end)?.copy_from_host(self.stream, &tail)?;
            }
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

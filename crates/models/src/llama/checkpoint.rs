//! The tensor index of a checkpoint folder: every `*.safetensors` file's header, parsed with
//! the `safetensors` crate's own types, each tensor's dtype, shape and byte range checked
//! against its file, and the checks of the whole index (tensors the model never reads, a tied
//! head that differs from the embeddings). [`super::loader`] reads the bytes.
//!
//! A file is held to the format as the `safetensors` crate holds it: each tensor is listed
//! once, its bytes are as many as its shape and dtype need, and the tensors' byte ranges tile
//! the data after the header (no byte in two tensors, none in no tensor). A header length
//! that is off by a few bytes, an edited range or bytes appended to the file are found so,
//! rather than read as a model made of the wrong bytes. Bytes of no tensor are refused with
//! the checks of the whole index, after the tensors the model reads have been looked up, so
//! that a tensor dropped from a header is named as missing, not as bytes of no tensor.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use cuflow_runtime::DeviceError;
use safetensors::tensor::TensorInfo;
use safetensors::Dtype;
use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, Visitor};

use super::files::{io_error, open_regular};

/// The largest safetensors header read: 100 MiB (the `safetensors` crate's own limit), some
/// million tensors.
pub(crate) const MAX_HEADER_BYTES: u64 = 100 << 20;

/// Where a tensor's bytes are: one of the checkpoint's files at an offset.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) file: usize,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    /// Absolute byte offset in the file.
    pub(super) start: u64,
    pub(super) bytes: usize,
}

/// The tensors of a checkpoint folder's `*.safetensors` files.
#[derive(Debug)]
pub(crate) struct Checkpoint {
    pub(super) dir: PathBuf,
    pub(super) files: Vec<PathBuf>,
    pub(super) entries: HashMap<String, Entry>,
    /// The first run of bytes that no tensor of its file holds, described, if any.
    unheld: Option<String>,
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
        let mut unheld = None;
        for (index, path) in files.iter().enumerate() {
            let mut file = open_regular(path)?;
            let file_len = file
                .metadata()
                .map_err(|e| io_error(path, "stat", e))?
                .len();
            let mut len = [0u8; 8];
            file.read_exact(&mut len)
                .map_err(|e| io_error(path, "read the header of", e))?;
            let header_len = u64::from_le_bytes(len);
            if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
                return Err(DeviceError::usage(format!(
                    "{} is not a safetensors file: its header length {header_len} does not \
                     fit its {file_len} bytes",
                    path.display()
                )));
            }
            let mut header = vec![0u8; header_len as usize];
            file.read_exact(&mut header)
                .map_err(|e| io_error(path, "read the header of", e))?;
            let HeaderEntries(table) = serde_json::from_slice(&header).map_err(|e| {
                DeviceError::usage(format!(
                    "{} has an unreadable safetensors header: {e}",
                    path.display()
                ))
            })?;
            let data_start = 8 + header_len;
            let mut ranges = Vec::with_capacity(table.len());
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
                if end < begin {
                    return Err(DeviceError::usage(format!(
                        "{}: tensor `{name}` claims bytes {begin}..{end}, which end before they \
                         begin (a corrupt or edited header?)",
                        path.display()
                    )));
                }
                let past_the_end = u64::try_from(end)
                    .ok()
                    .and_then(|end| data_start.checked_add(end))
                    .is_none_or(|last| last > file_len);
                if past_the_end {
                    return Err(DeviceError::usage(format!(
                        "{}: tensor `{name}` claims bytes {begin}..{end} past the end of the \
                         file (truncated download?)",
                        path.display()
                    )));
                }
                ensure_size(path, &name, &info)?;
                if let Some(earlier) = entries.get(&name).and_then(|e: &Entry| files.get(e.file)) {
                    return Err(DeviceError::usage(format!(
                        "tensor `{name}` is in both {} and {}; a checkpoint folder holds each \
                         tensor once (remove the files of another download)",
                        earlier.display(),
                        path.display()
                    )));
                }
                ranges.push((begin, end, name.clone()));
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
            let bytes_of_none = unheld_bytes(path, file_len - data_start, ranges)?;
            unheld = unheld.or(bytes_of_none);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            files,
            entries,
            unheld,
        })
    }

    /// Refuses a checkpoint holding tensors that the model does not read, or bytes that no
    /// tensor holds: `read` names every tensor it reads (whole, or a slice of it under tensor
    /// parallelism), and `tied` says whether the embedding table is the head. Allowed besides:
    /// the rotary tables (`*.rotary_emb.inv_freq`) that older checkpoints carry and the model
    /// computes itself, and, when the embeddings are tied, an `lm_head.weight` that is the
    /// embedding table.
    pub(crate) fn ensure_all_read(
        &self,
        read: &HashSet<String>,
        tied: bool,
    ) -> Result<(), DeviceError> {
        let mut unread: Vec<&String> = self
            .entries
            .keys()
            .filter(|name| !read.contains(*name) && !name.ends_with(".rotary_emb.inv_freq"))
            .collect();
        if tied && unread.iter().any(|n| *n == "lm_head.weight") {
            self.ensure_head_is_embedding()?;
            unread.retain(|n| *n != "lm_head.weight");
        }
        if unread.is_empty() {
            return match &self.unheld {
                Some(unheld) => Err(DeviceError::usage(unheld.clone())),
                None => Ok(()),
            };
        }
        unread.sort();
        let shown: Vec<String> = unread
            .iter()
            .take(6)
            .map(|name| {
                let file = self.entries.get(*name).and_then(|e| self.files.get(e.file));
                let file = file.and_then(|f| f.file_name()).unwrap_or_default();
                format!("`{name}` (in {})", file.to_string_lossy())
            })
            .collect();
        let more = unread.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Err(DeviceError::usage(format!(
            "checkpoint {}: the model does not read {} of its tensors: {}{more}; they belong to \
             another architecture (biases, extra norms) or to another file in the folder (an \
             adapter?), and loading without them would compute another model: load a Llama \
             checkpoint, with only its own *.safetensors files in the folder",
            self.dir.display(),
            unread.len(),
            shown.join(", ")
        )))
    }

    /// Checks that `lm_head.weight` holds the embedding table: same dtype, shape and bytes.
    fn ensure_head_is_embedding(&self) -> Result<(), DeviceError> {
        let (head, embed) = ("lm_head.weight", "model.embed_tokens.weight");
        let same = match (self.entries.get(head), self.entries.get(embed)) {
            (Some(h), Some(e)) if h.dtype == e.dtype && h.shape == e.shape => {
                self.same_bytes(head, h, e)?
            }
            _ => false,
        };
        if same {
            return Ok(());
        }
        Err(DeviceError::usage(format!(
            "checkpoint {}: config.json ties the head to the embeddings \
             (tie_word_embeddings: true), but `{head}` is not `{embed}`; set \
             tie_word_embeddings to false if this model has a head of its own",
            self.dir.display()
        )))
    }

    /// A fingerprint of the checkpoint's weights, the same for the same bytes wherever the
    /// files are: every tensor's name, dtype and shape, and [`Self::SAMPLE`] bytes at the start,
    /// the middle and the end of its data. Checkpoints of one config with other weights (other
    /// seeds, a fine-tune, which changes each matrix it touches throughout) differ in it, for
    /// three small reads a tensor rather than a read of every byte.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] naming the file that could not be read.
    pub(crate) fn fingerprint(&self) -> Result<u64, DeviceError> {
        let mut names: Vec<&String> = self.entries.keys().collect();
        names.sort();
        let mut files: Vec<Option<File>> = self.files.iter().map(|_| None).collect();
        let mut summary = Vec::new();
        for name in names {
            let e = &self.entries[name];
            summary.extend_from_slice(format!("{name} {:?} {:?};", e.dtype, e.shape).as_bytes());
            let path = &self.files[e.file];
            let file = match &mut files[e.file] {
                Some(f) => f,
                slot => slot.insert(open_regular(path)?),
            };
            let n = e.bytes.min(Self::SAMPLE);
            for at in [0, (e.bytes - n) / 2, e.bytes - n] {
                let mut sample = vec![0u8; n];
                file.seek(SeekFrom::Start(e.start + at as u64))
                    .map_err(|err| io_error(path, "seek in", err))?;
                file.read_exact(&mut sample)
                    .map_err(|err| io_error(path, "read", err))?;
                summary.extend_from_slice(&sample);
            }
        }
        Ok(super::tensor_parallel::fingerprint(&summary))
    }

    /// How many bytes [`Self::fingerprint`] reads at each of its three places in a tensor.
    const SAMPLE: usize = 64;

    /// Whether the bytes of entries `a` (of tensor `name`) and `b` are equal, read 1 MiB at a
    /// time.
    fn same_bytes(&self, name: &str, a: &Entry, b: &Entry) -> Result<bool, DeviceError> {
        if a.bytes != b.bytes {
            return Ok(false);
        }
        let open = |e: &Entry| -> Result<(File, &Path), DeviceError> {
            let path = self
                .files
                .get(e.file)
                .ok_or_else(|| DeviceError::internal(format!("no file for `{name}`")))?;
            let mut file = open_regular(path)?;
            file.seek(SeekFrom::Start(e.start))
                .map_err(|err| io_error(path, "seek in", err))?;
            Ok((file, path))
        };
        let ((mut fa, pa), (mut fb, pb)) = (open(a)?, open(b)?);
        let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
        let mut left = a.bytes;
        while left > 0 {
            let n = left.min(ba.len());
            fa.read_exact(&mut ba[..n])
                .map_err(|err| io_error(pa, "read", err))?;
            fb.read_exact(&mut bb[..n])
                .map_err(|err| io_error(pb, "read", err))?;
            if ba[..n] != bb[..n] {
                return Ok(false);
            }
            left -= n;
        }
        Ok(true)
    }
}

/// The entries of a safetensors header in the file's order, a name listed twice refused:
/// JSON leaves repeated keys to the reader, and a map would keep one of them silently.
struct HeaderEntries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for HeaderEntries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = HeaderEntries;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HeaderEntries, A::Error> {
                let mut seen = HashSet::new();
                let mut entries = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, serde_json::Value>()? {
                    if !seen.insert(name.clone()) {
                        return Err(A::Error::custom(format!(
                            "tensor `{name}` is listed twice; a header lists each tensor once"
                        )));
                    }
                    entries.push((name, value));
                }
                Ok(HeaderEntries(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// Refuses the entry `info` of tensor `name` of the file `path` when its byte range is not as
/// long as its shape and dtype need.
fn ensure_size(path: &Path, name: &str, info: &TensorInfo) -> Result<(), DeviceError> {
    let (begin, end) = info.data_offsets;
    let bits = info
        .shape
        .iter()
        .try_fold(info.dtype.bitsize(), |n, &d| n.checked_mul(d));
    let held = (end - begin).checked_mul(8);
    if bits.is_some() && bits == held {
        return Ok(());
    }
    let needed = match bits {
        Some(b) if b % 8 == 0 => format!("{} bytes", b / 8),
        Some(b) => format!("{b} bits"),
        None => "more than the address space".into(),
    };
    Err(DeviceError::usage(format!(
        "{}: tensor `{name}` holds {} bytes, but its shape {:?} of {:?} needs {needed}; the \
         file is corrupt (a truncated or edited download?)",
        path.display(),
        end - begin,
        info.shape,
        info.dtype
    )))
}

/// Checks that the tensors' byte ranges (`begin..end`, tensor name) of the file `path` tile its
/// `data_len` bytes of data: two tensors that overlap are an error; bytes before, between or
/// after them that no tensor holds are returned, described, for
/// [`Checkpoint::ensure_all_read`] to refuse. Empty tensors hold no bytes, wherever they
/// claim them.
fn unheld_bytes(
    path: &Path,
    data_len: u64,
    mut ranges: Vec<(usize, usize, String)>,
) -> Result<Option<String>, DeviceError> {
    ranges.retain(|(begin, end, _)| begin < end);
    ranges.sort();
    let unheld = |from: usize, to: u64, around: String| {
        format!(
            "{}: bytes {from}..{to} of its data are in no tensor ({around}); the tensors of a \
             safetensors file hold every byte after its header (a wrong header length, an \
             edited header or bytes appended to the file?)",
            path.display()
        )
    };
    let mut first_unheld = None;
    let mut previous: Option<&(usize, usize, String)> = None;
    for range in &ranges {
        let end = previous.map_or(0, |p| p.1);
        if let Some(prev) = previous.filter(|prev| range.0 < prev.1) {
            return Err(DeviceError::usage(format!(
                "{}: tensors `{}` (bytes {}..{}) and `{}` (bytes {}..{}) overlap; each tensor \
                 of a safetensors file has bytes of its own (a corrupt or edited header?)",
                path.display(),
                prev.2,
                prev.0,
                prev.1,
                range.2,
                range.0,
                range.1
            )));
        }
        if range.0 > end && first_unheld.is_none() {
            let around = match previous {
                Some(prev) => format!("between `{}` and `{}`", prev.2, range.2),
                None => format!("before `{}`", range.2),
            };
            first_unheld = Some(unheld(end, range.0 as u64, around));
        }
        previous = Some(range);
    }
    let end = previous.map_or(0, |p| p.1);
    if (end as u64) < data_len && first_unheld.is_none() {
        let around = previous.map_or("the header lists no tensor".into(), |p| {
            format!("after `{}`", p.2)
        });
        first_unheld = Some(unheld(end, data_len, around));
    }
    Ok(first_unheld)
}

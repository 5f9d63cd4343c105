//! Random `model.safetensors` files: the tiny model's weights with random header lengths,
//! header bytes, entries (dtypes, shapes, byte ranges), names, lengths and layouts (a split
//! into two shards, with or without an index file), each loaded from a folder of its own.
//! Whatever the files hold, a load is `Ok` or an error naming the file or the tensor, never a
//! panic or a hang, and a refused load has allocated no device memory; a load of the original
//! tensors computes the original model, and a model that loads generates from a prompt of its
//! vocabulary and refuses an id outside it.
//!
//! The seeds are fixed: `CUFLOW_RANDOM_CHECKPOINTS=N` runs N times as many cases. A failing
//! case is reported with its number and its edits, to be written down as a test of its own.

mod random_checkpoint;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError};
use cuflow_testing::rng::{scale_from_env, seeded_rng};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use random_checkpoint::*;
use serde_json::{json, Value};

/// The `model.safetensors.index.json` of a split checkpoint.
#[derive(Clone, Copy, Debug)]
enum Index {
    None,
    /// Naming the shard of every tensor.
    Matching,
    /// Naming shards that are not in the folder.
    Stale,
    /// Not JSON.
    Garbage,
}

/// An edit of a checkpoint's `*.safetensors` files.
#[derive(Clone, Debug)]
enum FileEdit {
    /// The header length (the first 8 bytes) set.
    HeaderLength(u64),
    /// One byte of the header replaced.
    HeaderByte { at: usize, byte: u8 },
    /// A field of a tensor's header entry set, or removed.
    Field {
        tensor: String,
        field: &'static str,
        value: Option<Value>,
    },
    /// A tensor's header entry replaced by a value that is no entry.
    Entry { tensor: String, value: Value },
    /// The byte ranges of two tensors of one shape and dtype exchanged.
    SwapRanges(String, String),
    /// A tensor renamed.
    Rename { tensor: String, to: String },
    /// A tensor removed from the header.
    Remove(String),
    /// A tensor of zeros added, its bytes after the others'.
    Extra {
        name: String,
        dtype: &'static str,
        shape: Vec<usize>,
    },
    /// A second header entry for `tensor`, a copy of `like`'s, written before the first.
    Duplicate { tensor: String, like: String },
    /// A `__metadata__` entry.
    Metadata(Value),
    /// The file cut to its first bytes.
    Truncate(usize),
    /// Bytes appended to the file.
    Append(usize),
    /// Bytes of the tensors overwritten (NaN, infinities, random).
    Data { at: usize, bytes: Vec<u8> },
    /// The tensors split over two shard files (`second` in the second), `both` in each.
    Split {
        second: Vec<String>,
        both: Option<String>,
        index: Index,
    },
    /// `model.safetensors` renamed.
    RenameFile(&'static str),
    /// An entry of the folder beside the checkpoint: an empty file or a folder.
    Stray { name: &'static str, folder: bool },
}

impl fmt::Display for FileEdit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileEdit::HeaderLength(n) => write!(f, "header length {n}"),
            FileEdit::HeaderByte { at, byte } => write!(f, "header byte {at} = {byte:#04x}"),
            FileEdit::Field {
                tensor,
                field,
                value: Some(v),
            } => write!(f, "`{tensor}`.{field} = {v}"),
            FileEdit::Field { tensor, field, .. } => write!(f, "`{tensor}` without {field}"),
            FileEdit::Entry { tensor, value } => write!(f, "`{tensor}` = {value}"),
            FileEdit::SwapRanges(a, b) => write!(f, "`{a}` and `{b}` exchanged"),
            FileEdit::Rename { tensor, to } => write!(f, "`{tensor}` renamed `{to}`"),
            FileEdit::Remove(t) => write!(f, "no `{t}`"),
            FileEdit::Extra { name, dtype, shape } => {
                write!(f, "extra `{name}` of {dtype} {shape:?}")
            }
            FileEdit::Duplicate { tensor, like } => {
                write!(f, "a second entry `{tensor}` copying `{like}`'s")
            }
            FileEdit::Metadata(v) => write!(f, "__metadata__ = {v}"),
            FileEdit::Truncate(n) => write!(f, "cut to {n} bytes"),
            FileEdit::Append(n) => write!(f, "{n} bytes appended"),
            FileEdit::Data { at, bytes } => write!(f, "data bytes {at}.. = {bytes:02x?}"),
            FileEdit::Split {
                second,
                both,
                index,
            } => write!(
                f,
                "split, {second:?} in the second shard, {both:?} in both, index {index:?}"
            ),
            FileEdit::RenameFile(to) => write!(f, "model.safetensors renamed {to}"),
            FileEdit::Stray { name, folder } => {
                write!(
                    f,
                    "a {} {name}",
                    if *folder { "folder" } else { "empty file" }
                )
            }
        }
    }
}

impl FileEdit {
    /// An edit of the file `original`; `structured` edits only (header entries and data,
    /// which combine with each other) when asked.
    fn draw(rng: &mut StdRng, original: &Original, structured: bool) -> FileEdit {
        let tensors = original.file.tensors();
        let tensor = tensors.choose(rng).expect("tensors").clone();
        let kinds = if structured { 9 } else { 17 };
        match rng.gen_range(0..kinds) {
            0 | 1 => {
                let field = *["dtype", "shape", "data_offsets"]
                    .choose(rng)
                    .expect("fields");
                let value =
                    (!rng.gen_bool(0.1)).then(|| entry_value(rng, original, &tensor, field));
                FileEdit::Field {
                    tensor,
                    field,
                    value,
                }
            }
            2 => FileEdit::Entry {
                tensor,
                value: wrong_type(rng),
            },
            3 => {
                let shape = &original.file.entry(&tensor)["shape"];
                let alike: Vec<&String> = tensors
                    .iter()
                    .filter(|t| **t != tensor && &original.file.entry(t)["shape"] == shape)
                    .collect();
                match alike.choose(rng) {
                    Some(other) => FileEdit::SwapRanges(tensor, (*other).clone()),
                    None => FileEdit::Remove(tensor),
                }
            }
            4 => {
                let to = match rng.gen_range(0..6) {
                    0 => tensor.replacen("model.", "", 1),
                    1 => tensor.replace(".weight", ".bias"),
                    2 => tensor.to_uppercase(),
                    3 => tensors.choose(rng).expect("tensors").clone(),
                    4 => "__metadata__".into(),
                    _ => format!("{tensor} "),
                };
                FileEdit::Rename { tensor, to }
            }
            5 => FileEdit::Remove(tensor),
            6 => {
                // A bias, a layer past the config's, a rotary table, a head beside tied
                // embeddings, a second final norm, a tensor without a name.
                let extras = r#"[["model.layers.0.self_attn.q_proj.bias", [64]],
                    ["model.layers.2.input_layernorm.weight", [64]],
                    ["model.layers.0.self_attn.rotary_emb.inv_freq", [8]],
                    ["lm_head.weight", [256, 64]], ["model.norm.weight", [64]], ["", [1]]]"#;
                let (name, shape): (String, Vec<usize>) =
                    serde_json::from_value(pick(rng, extras)).expect("a name and a shape");
                let dtype = *["BF16", "F32", "F16"].choose(rng).expect("dtypes");
                FileEdit::Extra { name, dtype, shape }
            }
            7 => FileEdit::Duplicate {
                like: if rng.gen_bool(0.5) {
                    tensor.clone()
                } else {
                    tensors.choose(rng).expect("tensors").clone()
                },
                tensor,
            },
            8 => {
                let len = original.file.data.len();
                let at = rng.gen_range(0..len - 8);
                let bytes = match rng.gen_range(0..3) {
                    0 => [0xff, 0x7f].repeat(4),
                    1 => [0x80, 0x7f, 0x80, 0xff].repeat(2),
                    _ => (0..rng.gen_range(1..8)).map(|_| rng.gen()).collect(),
                };
                FileEdit::Data { at, bytes }
            }
            9 => FileEdit::Metadata(pick(
                rng,
                r#"[{"format": "pt"}, "pt", 7, [1, 2], {"format": {"nested": [1]}}, null]"#,
            )),
            10 | 11 => {
                let len = original.header_len;
                let file = original.bytes.len() as u64;
                let all = [
                    0,
                    1,
                    len - 1,
                    len - 7,
                    len + 1,
                    len + 8,
                    file - 8,
                    file - 7,
                    (100 << 20) + 1,
                    u64::MAX,
                    u64::MAX - 7,
                    1 << 63,
                ];
                FileEdit::HeaderLength(*all.choose(rng).expect("lengths"))
            }
            12 => {
                let at = rng.gen_range(0..original.header_len as usize);
                let byte = if rng.gen_bool(0.6) {
                    *b"{}[]\",:0123456789 \t\nA.x\\".choose(rng).expect("bytes")
                } else {
                    rng.gen()
                };
                FileEdit::HeaderByte { at, byte }
            }
            13 => FileEdit::Truncate(rng.gen_range(0..original.bytes.len())),
            14 => FileEdit::Append(*[1, 2, 7, 64].choose(rng).expect("lengths")),
            15 => {
                let mut shuffled = tensors.clone();
                shuffled.shuffle(rng);
                let second = shuffled[..rng.gen_range(1..tensors.len())].to_vec();
                let both = rng.gen_bool(0.3).then(|| shuffled[0].clone());
                let index = *[Index::None, Index::Matching, Index::Stale, Index::Garbage]
                    .choose(rng)
                    .expect("indexes");
                FileEdit::Split {
                    second,
                    both,
                    index,
                }
            }
            _ => {
                if rng.gen_bool(0.5) {
                    let to = [
                        "weights.safetensors",
                        "model.safetensors.bak",
                        "model.SAFETENSORS",
                        ".safetensors",
                        "model",
                    ];
                    FileEdit::RenameFile(to.choose(rng).expect("names"))
                } else {
                    let name = *["extra.safetensors", "a.safetensors", "z.safetensors"]
                        .choose(rng)
                        .expect("names");
                    FileEdit::Stray {
                        name,
                        folder: rng.gen_bool(0.5),
                    }
                }
            }
        }
    }

    /// Applies the edit to the checkpoint folder `dir`; a structured edit reads and rewrites
    /// `file`, the model's parsed file.
    fn apply(&self, dir: &Path, file: &mut SafetensorsFile) -> Result<(), DeviceError> {
        let path = dir.join("model.safetensors");
        let raw = |edit: &dyn Fn(&mut Vec<u8>)| -> Result<(), DeviceError> {
            let mut bytes = std::fs::read(&path).map_err(io)?;
            edit(&mut bytes);
            std::fs::write(&path, bytes).map_err(io)
        };
        match self {
            FileEdit::HeaderLength(n) => raw(&|b| b[..8].copy_from_slice(&n.to_le_bytes())),
            FileEdit::HeaderByte { at, byte } => raw(&|b| b[8 + at] = *byte),
            FileEdit::Truncate(n) => raw(&|b| b.truncate(*n)),
            FileEdit::Append(n) => raw(&|b| b.extend(std::iter::repeat_n(0x5a, *n))),
            FileEdit::Field {
                tensor,
                field,
                value,
            } => {
                if let Some(entry) = file.object_mut(tensor) {
                    match value {
                        Some(v) => entry.insert(field.to_string(), v.clone()),
                        None => entry.remove(*field),
                    };
                }
                file.write(&path)
            }
            FileEdit::Entry { tensor, value } => {
                for (_, entry) in file.entries.iter_mut().filter(|(n, _)| n == tensor) {
                    *entry = value.clone();
                }
                file.write(&path)
            }
            FileEdit::SwapRanges(a, b) => {
                let mut range = |t: &str| Some(file.object_mut(t)?.get("data_offsets")?.clone());
                if let (Some(ra), Some(rb)) = (range(a), range(b)) {
                    for (t, r) in [(a, rb), (b, ra)] {
                        file.object_mut(t)
                            .map(|e| e.insert("data_offsets".into(), r));
                    }
                }
                file.write(&path)
            }
            FileEdit::Rename { tensor, to } => {
                for (name, _) in file.entries.iter_mut().filter(|(n, _)| n == tensor) {
                    name.clone_from(to);
                }
                file.write(&path)
            }
            FileEdit::Remove(tensor) => {
                file.entries.retain(|(n, _)| n != tensor);
                file.write(&path)
            }
            FileEdit::Extra { name, dtype, shape } => {
                let size = if *dtype == "F32" { 4 } else { 2 };
                let begin = file.data.len();
                file.data
                    .resize(begin + shape.iter().product::<usize>() * size, 0);
                let entry = json!({"dtype": dtype, "shape": shape,
                    "data_offsets": [begin, file.data.len()]});
                file.entries.push((name.clone(), entry));
                file.write(&path)
            }
            FileEdit::Duplicate { tensor, like } => {
                if let Some((_, entry)) = file.entries.iter().find(|(n, _)| n == like) {
                    file.entries.insert(0, (tensor.clone(), entry.clone()));
                }
                file.write(&path)
            }
            FileEdit::Metadata(v) => {
                file.entries.push(("__metadata__".into(), v.clone()));
                file.write(&path)
            }
            FileEdit::Data { at, bytes } => {
                file.data[*at..*at + bytes.len()].copy_from_slice(bytes);
                file.write(&path)
            }
            FileEdit::Split {
                second,
                both,
                index,
            } => {
                let names = file.tensors();
                let first: Vec<String> = names
                    .iter()
                    .filter(|n| !second.contains(n) || both.as_ref() == Some(n))
                    .cloned()
                    .collect();
                let mut second = second.clone();
                if let Some(b) = both.as_ref().filter(|b| !second.contains(b)) {
                    second.push(b.clone());
                }
                let shards = [
                    ("model-00001-of-00002.safetensors", &first),
                    ("model-00002-of-00002.safetensors", &second),
                ];
                let mut weight_map = serde_json::Map::new();
                for (shard, names) in shards {
                    file.subset(names).write(&dir.join(shard))?;
                    for name in names {
                        weight_map.insert(name.clone(), json!(shard));
                    }
                }
                std::fs::remove_file(&path).map_err(io)?;
                let index_text = match index {
                    Index::None => return Ok(()),
                    Index::Matching => json!({"weight_map": weight_map}).to_string(),
                    Index::Stale => {
                        let stale = names.iter().map(|n| (n.clone(), json!("gone.safetensors")));
                        json!({"weight_map": stale.collect::<serde_json::Map<_, _>>()}).to_string()
                    }
                    Index::Garbage => "{\"weight_map\": [".into(),
                };
                std::fs::write(dir.join("model.safetensors.index.json"), index_text).map_err(io)
            }
            FileEdit::RenameFile(to) => std::fs::rename(&path, dir.join(to)).map_err(io),
            FileEdit::Stray { name, folder } => {
                let stray = dir.join(name);
                match folder {
                    true => std::fs::create_dir(stray),
                    false => std::fs::write(stray, b""),
                }
                .map_err(io)
            }
        }
    }

    /// What a checkpoint of `original` edited by this edit alone must do: load (as the
    /// original model, or as another), be refused naming what the edit concerns, or either.
    fn expect(&self, original: &Original) -> Expect {
        let tensors = |names: &[&String]| names.iter().map(|n| format!("`{n}`")).collect();
        let file_name = || vec!["model.safetensors".to_string()];
        match self {
            FileEdit::HeaderLength(n) if *n == original.header_len => Expect::loads(true),
            FileEdit::HeaderLength(_) | FileEdit::Truncate(_) | FileEdit::Append(_) => {
                Expect::refused(file_name())
            }
            FileEdit::HeaderByte { .. } => {
                let mut naming = file_name();
                naming.extend(original.file.tensors().iter().map(|n| format!("`{n}`")));
                Expect {
                    loads: None,
                    same_model: true,
                    naming,
                }
            }
            FileEdit::Field {
                tensor,
                field,
                value: Some(v),
            } => {
                let was = &original.file.entry(tensor)[*field];
                let two_bytes = |d: &Value| matches!(d.as_str(), Some("BF16" | "F16"));
                if v == was {
                    Expect::loads(true)
                } else if *field == "dtype" && two_bytes(v) && two_bytes(was) {
                    // BF16 bytes read as F16, or the reverse: another model, as the file says.
                    Expect::loads(false)
                } else {
                    Expect::refused(tensors(&[tensor]))
                }
            }
            FileEdit::Field { tensor, .. }
            | FileEdit::Entry { tensor, .. }
            | FileEdit::Remove(tensor)
            | FileEdit::Duplicate { tensor, .. } => Expect::refused(tensors(&[tensor])),
            FileEdit::Rename { tensor, to } if tensor == to => Expect::loads(true),
            // The tensor is missing (a tied checkpoint's extra head is not its embeddings).
            FileEdit::Rename { tensor, to } => Expect::refused(tensors(&[tensor, to])),
            FileEdit::SwapRanges(..) | FileEdit::Data { .. } => Expect::loads(false),
            FileEdit::Extra { name, .. } if name.ends_with(".rotary_emb.inv_freq") => {
                Expect::loads(true)
            }
            FileEdit::Extra { name, .. } => Expect::refused(tensors(&[name])),
            FileEdit::Metadata(_) => Expect::loads(true),
            FileEdit::Split { both: Some(t), .. } => Expect::refused(tensors(&[t])),
            FileEdit::Split { .. } => Expect::loads(true),
            FileEdit::RenameFile("weights.safetensors") => Expect::loads(true),
            FileEdit::RenameFile(_) => Expect::refused(vec!["no *.safetensors".into()]),
            FileEdit::Stray { name, .. } => Expect::refused(vec![name.to_string()]),
        }
    }
}

/// A value of a header entry's `field` for `tensor`: another dtype (other floats, integers,
/// names no dtype has, other JSON types), another shape (empty, zero, huge or extra axes,
/// transposed), other byte ranges (reversed, overlapping, out of range, of another length).
fn entry_value(rng: &mut StdRng, original: &Original, tensor: &str, field: &str) -> Value {
    let entry = original.file.entry(tensor);
    let one_of = |rng: &mut StdRng, all: Vec<Value>| all.choose(rng).expect("values").clone();
    match field {
        "dtype" => pick(
            rng,
            r#"["F32", "F16", "BF16", "I8", "U8", "I32", "F64", "BOOL", "F8_E4M3", "F4", "bf16",
                "Q4_0", 16, null]"#,
        ),
        "shape" => {
            let shape: Vec<u64> = serde_json::from_value(entry["shape"].clone()).expect("dims");
            let mut reversed = shape.clone();
            reversed.reverse();
            let mut extra = shape.clone();
            extra.push(1);
            let mut zero = shape.clone();
            zero[rng.gen_range(0..shape.len())] = 0;
            let mut huge = shape.clone();
            huge[0] = *[1 << 31, 1 << 53, 1 << 63, u64::MAX]
                .choose(rng)
                .expect("dims");
            one_of(
                rng,
                vec![
                    json!(reversed),
                    json!(extra),
                    json!(zero),
                    json!(huge),
                    json!([]),
                    json!([shape.iter().product::<u64>()]),
                    json!([-1]),
                    json!(["64"]),
                    json!(64),
                ],
            )
        }
        _ => {
            let offsets = &entry["data_offsets"];
            let (b, e) = (
                offsets[0].as_u64().expect("an offset"),
                offsets[1].as_u64().expect("an offset"),
            );
            let data = original.file.data.len() as u64;
            let k = rng.gen_range(1..=8u64);
            one_of(
                rng,
                vec![
                    json!([e, b]),
                    json!([b.saturating_sub(k), e.saturating_sub(k)]),
                    json!([b + k, e + k]),
                    json!([b, e + 2]),
                    json!([b, e - 2]),
                    json!([b, data + 1]),
                    json!([data, data + (e - b)]),
                    json!([0, 0]),
                    json!([b, b]),
                    json!([u64::MAX, u64::MAX]),
                    json!([b, u64::MAX]),
                    json!([b]),
                    json!([b, e, e]),
                    json!([-1, e]),
                    json!([0.5, e]),
                ],
            )
        }
    }
}

/// A case of [`random_safetensors_load_or_name_what_is_wrong`].
#[derive(Debug)]
struct FileCase {
    base: Base,
    edits: Vec<FileEdit>,
}

impl fmt::Display for FileCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let edits: Vec<String> = self.edits.iter().map(ToString::to_string).collect();
        write!(
            f,
            "[{}] of the tiny checkpoint (tied: {}, {:?})",
            edits.join("; "),
            self.base.tied,
            self.base.dtype
        )
    }
}

impl FileCase {
    /// Writes the case's checkpoint into `dir`, loads it and checks the outcome.
    fn check(
        &self,
        device: &Device,
        dir: &Path,
        bases: &Bases,
        rng: &mut StdRng,
    ) -> Result<(), DeviceError> {
        bases.write(dir, self.base)?;
        let base = bases.get(self.base);
        let original = &base.weights;
        let mut file = original.file.clone();
        for edit in &self.edits {
            edit.apply(dir, &mut file)?;
        }
        let expect = match &self.edits[..] {
            [edit] => edit.expect(original),
            // Structured edits together: refused naming a tensor, or loaded.
            edits => {
                let mut naming = vec!["model.safetensors".to_string()];
                naming.extend(original.file.tensors().iter().map(|n| format!("`{n}`")));
                Expect {
                    loads: None,
                    same_model: edits.iter().all(|e| e.expect(original).same_model),
                    naming,
                }
            }
        };
        load_and_check(device, dir, &expect, &base.logits, rng).map(|_| ())
    }
}

/// Safetensors files with random edits (header lengths of 0, past the file and u64::MAX,
/// random header bytes, dtypes, shapes and byte ranges of an entry changed, tensors renamed,
/// removed, added or listed twice, files cut or extended, tensors split over two shards,
/// stray files): each loads (the original model, where the edit keeps it) or is an error
/// naming the file or the tensor edited.
#[test]
fn random_safetensors_load_or_name_what_is_wrong() -> Result<(), DeviceError> {
    let _turn = device_turn();
    let device = cuflow_testing::device::device();
    let bases = Arc::new(Bases::new(&device)?);
    let mut rng = seeded_rng(0x5afe_7e45);
    let cases = CASES * scale_from_env(SCALE);
    for i in 0..cases {
        let base = *Base::ALL.choose(&mut rng).expect("bases");
        let original = &bases.get(base).weights;
        let structured = rng.gen_bool(0.25);
        let count = if structured { rng.gen_range(2..=3) } else { 1 };
        let edits = (0..count)
            .map(|_| FileEdit::draw(&mut rng, original, structured))
            .collect();
        let case = FileCase { base, edits };
        let seed: u64 = rng.gen();
        let what = format!("safetensors case {i}: {case}");
        let (device, bases) = (device.clone(), bases.clone());
        run_case(&what, move || {
            let TempDir(dir) = &TempDir::new(&format!("safetensors-{i}"));
            case.check(&device, dir, &bases, &mut seeded_rng(seed))
        });
    }
    Ok(())
}

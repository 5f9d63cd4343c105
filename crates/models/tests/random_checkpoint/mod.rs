//! What the random checkpoint tests share: the checkpoints they start from, a safetensors
//! file taken apart, the run of one case (on a thread of its own, with a deadline), and the
//! checks of a load and of generation from the model it gives.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Duration;

use cuflow_models::llama::testing::{synthetic_tensors, write_checkpoint, WeightDtype};
use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::{Device, DeviceError};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};

/// The variable that multiplies the number of cases.
pub const SCALE: &str = "CUFLOW_RANDOM_CHECKPOINTS";

/// Cases of each test by default (a few seconds of a debug build).
pub const CASES: usize = 150;

/// The seed of every checkpoint's weights.
pub const WEIGHT_SEED: u64 = 5;

/// The prompt whose logits tell two models apart.
pub const PROMPT: [u32; 3] = [7, 99, 1];

/// The most parameters of a checkpoint written for an edited config (the tiny model has
/// about 130 thousand).
pub const MAX_PARAMETERS: usize = 1 << 20;

/// The most device memory a case may allocate (its weights are at most 2 MiB).
pub const MAX_DEVICE_BYTES: usize = 64 << 20;

/// How long a case may take before it counts as hung (one takes milliseconds).
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// The tests of this file take turns on the device, so that the memory a case allocates is
/// its own.
pub static DEVICE_TURN: Mutex<()> = Mutex::new(());

pub fn device_turn() -> MutexGuard<'static, ()> {
    DEVICE_TURN.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn io(e: std::io::Error) -> DeviceError {
    DeviceError::usage(e.to_string())
}

/// A folder of the temporary directory, empty when made and removed when dropped (by a case
/// that fails too).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("cuflow-random-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `case` on a thread of its own and panics naming `what` when the case panicked (the
/// loader, or one of its assertions) or has not returned within [`CASE_TIMEOUT`] (a load
/// that hangs).
pub fn run_case(what: &str, case: impl FnOnce() -> Result<(), DeviceError> + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(case));
        let outcome = match ended {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("failed: {e}")),
            Err(payload) => Err(payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())),
        };
        tx.send(outcome).ok();
    });
    match rx.recv_timeout(CASE_TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(why)) => panic!("{what}: {why}"),
        Err(_) => panic!("{what}: did not return within {CASE_TIMEOUT:?}"),
    }
}

/// A checkpoint the cases start from: the tiny config, tied or not, its weights stored as
/// `dtype`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Base {
    pub tied: bool,
    pub dtype: WeightDtype,
}

impl Base {
    pub const ALL: [Base; 6] = [
        Base::new(false, WeightDtype::Bf16),
        Base::new(false, WeightDtype::F32),
        Base::new(false, WeightDtype::F16),
        Base::new(true, WeightDtype::Bf16),
        Base::new(true, WeightDtype::F32),
        Base::new(true, WeightDtype::F16),
    ];

    pub const fn new(tied: bool, dtype: WeightDtype) -> Base {
        Base { tied, dtype }
    }

    pub fn config(self) -> LlamaConfig {
        LlamaConfig {
            tie_word_embeddings: self.tied,
            ..LlamaConfig::tiny()
        }
    }

    /// Writes the checkpoint of `cfg` (an edited config) with this base's dtype.
    pub fn write(self, dir: &Path, cfg: &LlamaConfig) -> Result<(), DeviceError> {
        write_checkpoint(dir, cfg, &synthetic_tensors(cfg, WEIGHT_SEED, self.dtype)?)
    }
}

/// Every [`Base`] checkpoint, made once: the bytes of its files, its `model.safetensors`
/// taken apart, and the logits after [`PROMPT`] of the model it loads.
#[derive(Debug)]
pub struct Bases(pub Vec<(Base, BaseFiles)>);

#[derive(Debug)]
pub struct BaseFiles {
    pub config: Vec<u8>,
    pub weights: Original,
    pub logits: Vec<f32>,
}

impl Bases {
    pub fn new(device: &Device) -> Result<Bases, DeviceError> {
        let stream = device.new_stream()?;
        let mut all = Vec::new();
        for base in Base::ALL {
            let TempDir(dir) = &TempDir::new(&format!("base-{}-{:?}", base.tied, base.dtype));
            base.write(dir, &base.config())?;
            let logits = Llama::load(device, dir)?.prefill_logits(&stream, &PROMPT)?;
            let config = std::fs::read(dir.join("config.json")).map_err(io)?;
            let weights = Original::read(&dir.join("model.safetensors"))?;
            let files = BaseFiles {
                config,
                weights,
                logits,
            };
            all.push((base, files));
        }
        Ok(Bases(all))
    }

    pub fn get(&self, base: Base) -> &BaseFiles {
        let found = self.0.iter().find(|(b, _)| *b == base);
        &found.expect("every base is made").1
    }

    /// Writes the checkpoint of `base` into `dir`.
    pub fn write(&self, dir: &Path, base: Base) -> Result<(), DeviceError> {
        let files = self.get(base);
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::write(dir.join("config.json"), &files.config).map_err(io)?;
        std::fs::write(dir.join("model.safetensors"), &files.weights.bytes).map_err(io)
    }
}

/// What a case expects of its load.
#[derive(Debug)]
pub struct Expect {
    /// Whether the load must succeed (`None`: either).
    pub loads: Option<bool>,
    /// Whether a model that loads is the original one (else the edits may change it).
    pub same_model: bool,
    /// Strings one of which an error must contain (the file, the tensor, the field).
    pub naming: Vec<String>,
}

impl Expect {
    pub fn loads(same_model: bool) -> Expect {
        Expect {
            loads: Some(true),
            same_model,
            naming: Vec::new(),
        }
    }

    pub fn refused(naming: Vec<String>) -> Expect {
        Expect {
            loads: Some(false),
            same_model: true,
            naming,
        }
    }
}

/// Loads `dir` on `device` and checks the load against `expect` (`original`: the logits
/// after [`PROMPT`] of the original model); a model that loads must then generate (see
/// [`check_generation`]). Returns the model, or the error of a refused load.
pub fn load_and_check(
    device: &Device,
    dir: &Path,
    expect: &Expect,
    original: &[f32],
    rng: &mut StdRng,
) -> Result<Result<Llama, String>, DeviceError> {
    let pool = device.memory_pool();
    pool.reset_peak()?;
    let before = pool.stats()?.in_use;
    let model = match Llama::load(device, dir) {
        Ok(model) => model,
        Err(e) => {
            let e = e.to_string();
            let peak = pool.stats()?.peak_in_use;
            assert!(
                peak == before,
                "the refused load allocated {} bytes of device memory: {e}",
                peak - before
            );
            assert!(expect.loads != Some(true), "must load, but: {e}");
            assert!(
                expect.naming.iter().any(|n| e.contains(n.as_str())),
                "the error names none of {:?}: {e}",
                expect.naming
            );
            return Ok(Err(e));
        }
    };
    assert!(expect.loads != Some(false), "loaded, but must be refused");
    let stream = device.new_stream()?;
    if expect.same_model {
        let got = model.prefill_logits(&stream, &PROMPT)?;
        assert!(got == original, "loaded another model than the files hold");
    }
    check_generation(&model, rng)?;
    let peak = pool.stats()?.peak_in_use - before;
    assert!(
        peak <= MAX_DEVICE_BYTES,
        "loading and generating allocated {peak} bytes of device memory"
    );
    Ok(Ok(model))
}

/// A prompt of 1 to 4 ids of the vocabulary of `vocab` tokens, one of them outside it in a
/// quarter of the prompts.
pub fn random_prompt(rng: &mut StdRng, vocab: usize) -> Vec<u32> {
    let vocab32 = u32::try_from(vocab).unwrap_or(u32::MAX);
    let mut prompt: Vec<u32> = (0..rng.gen_range(1..=4))
        .map(|_| rng.gen_range(0..vocab32))
        .collect();
    if rng.gen_bool(0.25) {
        let at = rng.gen_range(0..prompt.len());
        let outside = [vocab32, vocab32.saturating_add(1), 1 << 31, u32::MAX];
        prompt[at] = *outside.choose(rng).expect("ids");
    }
    prompt
}

/// Generates 2 or 3 tokens after a random prompt, eagerly and (sometimes) by a captured step
/// of the default options: a prompt of the vocabulary gives tokens of the vocabulary, an id
/// outside it is an error naming it, and a prompt longer than the captured caches an error.
pub fn check_generation(model: &Llama, rng: &mut StdRng) -> Result<(), DeviceError> {
    let stream = model.device().new_stream()?;
    let vocab = model.config().vocab_size;
    let prompt = random_prompt(rng, vocab);
    let n = rng.gen_range(2..=3);
    let options = if rng.gen_bool(0.6) {
        GenerateOptions::greedy()
    } else {
        GenerateOptions::sampled(rng.gen_range(0.1..2.0))
            .top_k(rng.gen_range(0..=vocab.min(300) as u32 + 2))
            .top_p(rng.gen_range(0.05..=1.0))
            .seed(rng.gen())
    };
    let what = format!("generating {n} tokens after {prompt:?} with {options:?}");
    let result = model.generate(&stream, &prompt, n, &options);
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        let e = result.expect_err(&what).to_string();
        assert!(
            e.contains(&bad.to_string()) && e.contains("vocabulary"),
            "{what}: {e}"
        );
        return Ok(());
    }
    let ids = result.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(ids.len(), n, "{what}");
    assert!(ids.iter().all(|&t| (t as usize) < vocab), "{what}: {ids:?}");
    if rng.gen_bool(0.3) {
        let mut step = model
            .capture(&stream, GenerateOptions::greedy())
            .unwrap_or_else(|e| panic!("capture with the default options: {e}"));
        let captured = step.generate(&prompt, n);
        if prompt.len() + n <= step.max_seq() {
            let eager = model.generate(&stream, &prompt, n, &GenerateOptions::greedy())?;
            assert_eq!(captured?, eager, "captured {what}");
        } else {
            let e = captured.expect_err("a prompt past max_seq").to_string();
            assert!(e.contains("max_seq"), "{e}");
        }
    }
    Ok(())
}

/// A safetensors file taken apart: its header's entries in order (a name may repeat), and
/// the bytes after the header.
#[derive(Clone, Debug)]
pub struct SafetensorsFile {
    pub entries: Vec<(String, Value)>,
    pub data: Vec<u8>,
}

impl SafetensorsFile {
    pub fn read(path: &Path) -> Result<SafetensorsFile, DeviceError> {
        let bytes = std::fs::read(path).map_err(io)?;
        let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes[8..8 + len]).expect("a header of the test's own");
        Ok(SafetensorsFile {
            entries: header.into_iter().collect(),
            data: bytes[8 + len..].to_vec(),
        })
    }

    pub fn header(&self) -> Vec<u8> {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|(name, entry)| format!("{}:{entry}", json!(name)))
            .collect();
        format!("{{{}}}", entries.join(",")).into_bytes()
    }

    pub fn write(&self, path: &Path) -> Result<(), DeviceError> {
        let header = self.header();
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&self.data);
        std::fs::write(path, bytes).map_err(io)
    }

    pub fn tensors(&self) -> Vec<String> {
        let names = self.entries.iter().map(|(n, _)| n.clone());
        names.filter(|n| n != "__metadata__").collect()
    }

    pub fn entry(&self, name: &str) -> &Value {
        let found = self.entries.iter().find(|(n, _)| n == name);
        &found.expect("a tensor of the file").1
    }

    /// The header entry of `name` where it is still an object (edits made before may have
    /// renamed, removed or replaced it).
    pub fn object_mut(&mut self, name: &str) -> Option<&mut serde_json::Map<String, Value>> {
        let found = self.entries.iter_mut().find(|(n, _)| n == name);
        found.and_then(|(_, entry)| entry.as_object_mut())
    }

    /// The bytes of tensor `name`.
    pub fn bytes_of(&self, name: &str) -> &[u8] {
        let offsets = &self.entry(name)["data_offsets"];
        let at = |i: usize| offsets[i].as_u64().expect("an offset") as usize;
        &self.data[at(0)..at(1)]
    }

    /// A file of the tensors `names` of this one, their bytes packed one after the other.
    pub fn subset(&self, names: &[String]) -> SafetensorsFile {
        let mut out = SafetensorsFile {
            entries: Vec::new(),
            data: Vec::new(),
        };
        for name in names {
            let mut entry = self.entry(name).clone();
            let begin = out.data.len();
            out.data.extend_from_slice(self.bytes_of(name));
            entry["data_offsets"] = json!([begin, out.data.len()]);
            out.entries.push((name.clone(), entry));
        }
        out
    }
}

/// The original file's facts that edits are drawn from.
#[derive(Debug)]
pub struct Original {
    pub file: SafetensorsFile,
    pub bytes: Vec<u8>,
    pub header_len: u64,
}

impl Original {
    pub fn read(path: &Path) -> Result<Original, DeviceError> {
        let bytes = std::fs::read(path).map_err(io)?;
        Ok(Original {
            file: SafetensorsFile::read(path)?,
            header_len: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            bytes,
        })
    }
}

/// One of the values of the JSON array `pool`.
pub fn pick(rng: &mut StdRng, pool: &str) -> Value {
    let pool: Vec<Value> = serde_json::from_str(pool).expect("a JSON array");
    pool.choose(rng).expect("a value").clone()
}

/// Numbers at and past the edges of every type a field has: 0, ±1, 2^31, 2^32, 2^53, 2^63,
/// 2^64 - 1, -2^63, ±1e300, fractions, -0, the smallest floats.
pub fn extreme_number(rng: &mut StdRng) -> Value {
    let pool = "[0, 1, -1, 2147483648, 4294967296, 9007199254740992, 9223372036854775808,
        18446744073709551615, -9223372036854775808, 1e300, -1e300, 0.5, 1.5, 64.0, -0.0,
        1e-300, 5e-324]";
    pick(rng, pool)
}

/// A value of another JSON type than a number, or a number written as a string.
pub fn wrong_type(rng: &mut StdRng) -> Value {
    let pool = r#"["64", "NaN", "nan", "Infinity", "-inf", "", "llama", [], [64], [1, 2], null,
        {}, {"value": 64}, true, false]"#;
    pick(rng, pool)
}

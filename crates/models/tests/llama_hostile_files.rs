//! A checkpoint folder whose files are not regular files, or whose `config.json` is too large
//! to be a config, gives an error naming the file at once, never a load that blocks for ever
//! or reads without bound.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use cuflow_models::llama::testing::write_tiny_checkpoint;
use cuflow_models::llama::{Llama, LlamaConfig};
use cuflow_runtime::{Device, DeviceError};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuflow-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn io(e: std::io::Error) -> DeviceError {
    DeviceError::usage(e.to_string())
}

/// Loads `dir` on another thread and returns its error, failing the test when the load
/// succeeds or has not returned within a minute (a load blocked on a FIFO, or reading a
/// file that never ends).
fn load_error(dir: &Path) -> String {
    let (tx, rx) = mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let result = Device::auto().and_then(|d| Llama::load(&d, &dir));
        tx.send(result.map(|_| ()).map_err(|e| e.to_string())).ok();
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => panic!("the folder must not load"),
        Ok(Err(e)) => e,
        Err(_) => panic!("the load did not return within a minute"),
    }
}

/// Replaces the file `name` of the tiny checkpoint in `dir` by a link to `/dev/zero`, then a
/// FIFO, then a folder, and checks that each is refused as not a regular file, naming it.
#[cfg(unix)]
fn assert_special_files_refused(dir: &Path, name: &str) -> Result<(), DeviceError> {
    let path = dir.join(name);
    std::fs::remove_file(&path).map_err(io)?;
    std::os::unix::fs::symlink("/dev/zero", &path).map_err(io)?;
    let mut what = "a link to /dev/zero";
    for next in ["a FIFO", "a folder", ""] {
        let err = load_error(dir);
        assert!(
            err.contains(name) && err.contains("not a regular file"),
            "{name} as {what}: {err}"
        );
        std::fs::remove_file(&path)
            .or_else(|_| std::fs::remove_dir(&path))
            .map_err(io)?;
        match next {
            "a FIFO" => mkfifo(&path)?,
            "a folder" => std::fs::create_dir(&path).map_err(io)?,
            _ => {}
        }
        what = next;
    }
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

/// A `config.json` that is a symbolic link to `/dev/zero`, a FIFO, or a folder is refused as
/// not a regular file.
#[cfg(unix)]
#[test]
fn a_config_that_is_not_a_regular_file_is_refused() -> Result<(), DeviceError> {
    let dir = temp_dir("config-special");
    write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 1)?;
    assert_special_files_refused(&dir, "config.json")
}

/// A `config.json` of more than 16 MiB is refused before it is parsed, though it is valid
/// JSON (a real config is a few kilobytes).
#[test]
fn an_oversized_config_is_refused() -> Result<(), DeviceError> {
    let dir = temp_dir("config-large");
    write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 1)?;
    let config = dir.join("config.json");
    let json = std::fs::read_to_string(&config).map_err(io)?;
    let padded = " ".repeat(17 << 20) + &json;
    std::fs::write(&config, padded).map_err(io)?;
    let err = load_error(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        err.contains("config.json") && err.contains("16 MiB"),
        "{err}"
    );
    Ok(())
}

/// A `*.safetensors` entry that is a FIFO, a link to `/dev/zero` or a folder is refused as not a
/// regular file, naming it.
#[cfg(unix)]
#[test]
fn a_weights_file_that_is_not_a_regular_file_is_refused() -> Result<(), DeviceError> {
    let dir = temp_dir("weights-special");
    write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 1)?;
    assert_special_files_refused(&dir, "model.safetensors")
}

#[cfg(unix)]
fn mkfifo(path: &Path) -> Result<(), DeviceError> {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .map_err(io)?;
    if !status.success() {
        return Err(DeviceError::usage(format!(
            "mkfifo {}: {status}",
            path.display()
        )));
    }
    Ok(())
}

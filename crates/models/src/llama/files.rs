//! Opening the files of a checkpoint folder. Only regular files are opened (symbolic links are
//! followed to one), so that a FIFO named `model.safetensors` cannot block a load for ever and
//! a link to a device cannot feed it without end; `config.json` is read through a size cap.
//!
//! The file is checked by its path before it is opened and again by the handle opened, so a
//! path swapped between the two looks is caught too (but for a swap to a FIFO in that window,
//! whose opening blocks before the second look).

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

use cuflow_runtime::DeviceError;

/// The largest `config.json` read (a real one is a few kilobytes).
const CONFIG_CAP: u64 = 16 << 20;

/// The error of the I/O operation `what` on `path`.
pub(crate) fn io_error(path: &Path, what: &str, e: std::io::Error) -> DeviceError {
    DeviceError::usage(format!("cannot {what} {}: {e}", path.display()))
}

fn ensure_regular(path: &Path, meta: &Metadata) -> Result<(), DeviceError> {
    if meta.is_file() {
        return Ok(());
    }
    Err(DeviceError::usage(format!(
        "{} is not a regular file (a folder, FIFO, socket or device); a checkpoint folder \
         holds config.json and its *.safetensors as regular files or symbolic links to them",
        path.display()
    )))
}

/// Opens `path` for reading if it is a regular file (or a symbolic link to one).
///
/// # Errors
///
/// [`DeviceError::Usage`] naming the file when it cannot be opened or is not a regular file.
pub(crate) fn open_regular(path: &Path) -> Result<File, DeviceError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, "open", e))?;
    ensure_regular(path, &meta)?;
    let file = File::open(path).map_err(|e| io_error(path, "open", e))?;
    let meta = file.metadata().map_err(|e| io_error(path, "stat", e))?;
    ensure_regular(path, &meta)?;
    Ok(file)
}

/// The bytes of the regular file `path`, a `config.json` of at most 16 MiB.
///
/// # Errors
///
/// As [`open_regular`], and [`DeviceError::Usage`] when the file is larger than 16 MiB or
/// cannot be read.
pub(crate) fn read_config(path: &Path) -> Result<Vec<u8>, DeviceError> {
    let file = open_regular(path)?;
    let too_large = || {
        DeviceError::usage(format!(
            "{} is larger than 16 MiB, which no config.json is (a Llama config is a few \
             kilobytes); is it the right file?",
            path.display()
        ))
    };
    if file.metadata().map_or(0, |m| m.len()) > CONFIG_CAP {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    // One byte past the cap tells a file that grew since its size was read.
    file.take(CONFIG_CAP + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, "read", e))?;
    if bytes.len() as u64 > CONFIG_CAP {
        return Err(too_large());
    }
    Ok(bytes)
}

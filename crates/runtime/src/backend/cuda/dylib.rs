//! What the run-time loaders of CUDA libraries (cuBLAS, NCCL) share: resolving a symbol, telling
//! "not there" from "there but unusable", and the error text that says where they looked.

use std::path::PathBuf;

use libloading::Library;

/// Resolves `name` in `lib` (loaded from `path`) as a `T`; the error names the file and the
/// symbol.
///
/// # Safety
///
/// `T` must be the function pointer type of `name`'s C declaration.
pub(crate) unsafe fn symbol<T: Copy>(
    lib: &Library,
    name: &str,
    path: &str,
) -> std::result::Result<T, String> {
    // SAFETY: the caller names the symbol's true type.
    unsafe { lib.get::<T>(name) }
        .map(|s| *s)
        .map_err(|e| format!("{path} has no {name}: {e}"))
}

/// Whether the loader's `message` says the file does not exist (as opposed to a file that
/// exists and could not be loaded, which is worth reporting).
pub(crate) fn not_found(message: &str) -> bool {
    message.contains("No such file") || message.contains("cannot open shared object")
}

/// Why no library could be loaded: `first` (where it is not), the directories searched (or
/// `no_dirs` when there were none), and the files found but unusable.
pub(crate) fn not_loaded(
    first: &str,
    dirs: &[PathBuf],
    no_dirs: &str,
    failures: &[String],
) -> String {
    let searched = if dirs.is_empty() {
        no_dirs.to_string()
    } else {
        format!(
            "nor in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut reason = format!("{first}, {searched}");
    if !failures.is_empty() {
        reason.push_str(&format!("; found but unusable: {}", failures.join("; ")));
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::not_loaded;

    #[test]
    fn the_reason_names_every_directory_and_every_unusable_file() {
        let dirs = ["/a".into(), "/b".into()];
        let r = not_loaded("x is not on the path", &dirs, "-", &["/a/x: bad".into()]);
        assert_eq!(
            r,
            "x is not on the path, nor in /a, /b; found but unusable: /a/x: bad"
        );
        assert_eq!(
            not_loaded("x is not on the path", &[], "and no dir exists", &[]),
            "x is not on the path, and no dir exists"
        );
    }
}

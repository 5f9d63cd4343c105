//! Running test code on a thread with a small stack, as a program's spawned threads may have.

/// The stack of the threads of [`on_small_stack`]: 256 KiB.
pub const SMALL_STACK: usize = 256 * 1024;

/// Runs `f` on a new thread with a stack of `bytes` and returns its result; panics (failing
/// the test) if the thread cannot be spawned or `f` panics. A stack overflow aborts the
/// process, which fails the test binary.
///
/// # Examples
///
/// ```
/// let n = cuflow_testing::thread::on_stack_of(128 * 1024, || 2 + 2);
/// assert_eq!(n, 4);
/// ```
pub fn on_stack_of<T: Send + 'static>(bytes: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(bytes)
        .spawn(f)
        .expect("spawn a small-stack thread")
        .join()
        .expect("the small-stack thread finished without panicking")
}

/// [`on_stack_of`] with [`SMALL_STACK`].
pub fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    on_stack_of(SMALL_STACK, f)
}

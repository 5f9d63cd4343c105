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

/// How long [`within_a_minute`] waits.
pub const HANG_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `f` on a thread of its own and returns its result, failing the test with `hang` if it
/// has not returned within [`HANG_LIMIT`]: for tests whose failure is a hang. A panic of `f`
/// is resumed on the caller's thread.
///
/// # Examples
///
/// ```
/// let n = cuflow_testing::thread::within_a_minute("adding never returned", || 2 + 2);
/// assert_eq!(n, 4);
/// ```
pub fn within_a_minute<T: Send + 'static>(hang: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let (tx, rx) = channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HANG_LIMIT) {
        Ok(out) => out,
        Err(RecvTimeoutError::Disconnected) => match thread.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("the thread ended without sending its result"),
        },
        Err(RecvTimeoutError::Timeout) => panic!("{hang}"),
    }
}

/// Runs `f` on each of `items` (the ranks of a communicator, say), each on a thread of its own
/// and all at once, and gives the results in the order of `items`. A panic of any of the
/// threads panics the caller.
///
/// # Examples
///
/// ```
/// let squares = cuflow_testing::thread::on_each(&[1, 2, 3], |x| x * x);
/// assert_eq!(squares, vec![1, 4, 9]);
/// ```
pub fn on_each<I: Sync, R: Send>(items: &[I], f: impl Fn(&I) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let threads: Vec<_> = items.iter().map(|item| s.spawn(|| f(item))).collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a thread of on_each panicked"))
            .collect()
    })
}

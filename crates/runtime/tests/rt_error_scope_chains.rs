//! Long chains of error scopes (each nested in the one before, or depending on it), as deep
//! chains of shared ops make them: dropping one unsettled, settling it or asking for its error
//! never recurses once per link, and takes time linear in the chain.

use cuflow_runtime::{Device, DeviceError, ErrorScope};

/// Links in each chain: deeper than a small thread stack holds recursive drops of.
const LINKS: usize = 20_000;

/// Runs `f` on a thread with a 256 KiB stack; a stack overflow there aborts the process, so the
/// test fails instead of passing.
fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .expect("a thread")
        .join()
        .expect("the thread panicked");
}

#[test]
fn a_deep_chain_of_nested_scopes_dropped_unsettled_does_not_overflow_the_stack() {
    on_small_stack(|| {
        let root = ErrorScope::new();
        let root_entered = root.enter();
        let mut entered = Vec::new();
        for _ in 0..LINKS {
            let scope = ErrorScope::nested().expect("a scope is entered");
            entered.push((scope.enter(), scope));
        }
        while let Some((guard, scope)) = entered.pop() {
            drop(guard);
            drop(scope);
        }
        drop(root_entered);
        drop(root);
    });
}

#[test]
fn a_deep_chain_of_dependent_scopes_dropped_unsettled_does_not_overflow_the_stack() {
    on_small_stack(|| {
        let mut last = ErrorScope::new();
        for _ in 0..LINKS {
            let next = ErrorScope::new();
            next.depend_on(&last);
            last = next;
        }
        drop(last);
    });
}

#[test]
fn the_error_at_the_far_end_of_a_deep_chain_reaches_its_other_end() -> Result<(), DeviceError> {
    let stream = Device::host().new_stream()?;
    let first = ErrorScope::new();
    {
        let _entered = first.enter();
        stream.enqueue_host_fn(|| panic!("the first scope's work fails"))?;
        assert!(stream.synchronize().is_err());
    }
    let mut last = first.clone();
    let mut chain = vec![first];
    for _ in 0..LINKS {
        let next = ErrorScope::new();
        next.depend_on(&last);
        chain.push(next.clone());
        last = next;
    }
    assert!(last.error().is_some(), "the far end's error is reported");
    last.settle();
    drop(chain);
    assert!(
        last.check().is_err(),
        "a settled scope keeps the error it reported"
    );
    Ok(())
}

//! The guards of entered error scopes: whatever order they are dropped in, the thread is left
//! in the scopes whose guards are still alive, innermost (most recently entered) first.

use cuflow_runtime::{Device, DeviceError, ErrorScope};

#[test]
fn guards_dropped_out_of_order_leave_the_thread_in_the_scopes_still_entered(
) -> Result<(), DeviceError> {
    let stream = Device::host().new_stream()?;
    let (outer, inner) = (ErrorScope::new(), ErrorScope::new());
    let outer_guard = outer.enter();
    let inner_guard = inner.enter();
    drop(outer_guard);
    // Still inside `inner`: its work's failure is its own.
    stream.enqueue_host_fn(|| panic!("the inner scope's work fails"))?;
    assert!(stream.synchronize().is_err());
    assert!(inner.error().is_some(), "the failure went elsewhere");
    assert!(outer.error().is_none(), "the outer scope was left");
    drop(inner_guard);
    // No scope is entered any more: a failure is the stream's, reported by its next
    // synchronization, and no scope's.
    let untagged = ErrorScope::new();
    stream.enqueue_host_fn(|| panic!("untagged work fails"))?;
    {
        let _elsewhere = untagged.enter();
        stream.synchronize()?;
    }
    assert!(stream.synchronize().is_err(), "the stream lost its failure");
    assert!(
        outer.error().is_none(),
        "the thread went back into a scope it left"
    );
    Ok(())
}

#[test]
fn a_guard_left_inside_another_on_one_thread_does_not_leave_the_scope_of_the_other(
) -> Result<(), DeviceError> {
    // Entered twice: leaving the first entry keeps the thread in the scope of the second.
    let stream = Device::host().new_stream()?;
    let (a, b) = (ErrorScope::new(), ErrorScope::new());
    let first_a = a.enter();
    let b_guard = b.enter();
    let second_a = a.enter();
    drop(first_a);
    stream.enqueue_host_fn(|| panic!("a's work fails"))?;
    assert!(stream.synchronize().is_err());
    assert!(a.error().is_some() && b.error().is_none());
    drop(second_a);
    stream.enqueue_host_fn(|| panic!("b's work fails"))?;
    assert!(stream.synchronize().is_err());
    assert!(b.error().is_some());
    drop(b_guard);
    stream.synchronize()?;
    Ok(())
}

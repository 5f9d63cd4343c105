//! The auto traits of the public types, pinned: ops and futures move between threads
//! (`Send`); handles and policies shared by every thread are `Sync` too. The negative cases
//! (an op capturing an `Rc`, `BoxedOp` shared across threads, `shared` of a non-`Sync`
//! output) are `compile_fail` doctests in the crate's documentation.
//!
//! Where a combinator is generic, the assertion is made for every parameter that satisfies the
//! trait's own bounds, so it holds for all ops, not only the ones named here.

use cuflow_device_op::op::zip::{JoinAll, Zip2, Zip3, Zip8};
use cuflow_device_op::op::{InspectFn, MapFn};
use cuflow_device_op::{
    BoxedOp, Continuation, DeviceFuture, DeviceOp, ExecutionStats, Inspect, Map, Shared, Then,
    Value, WithContext,
};
use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Event, Kernel, Stream, StreamId};
use cuflow_scheduler::{
    LeastLoaded, Placement, Priority, PriorityLevel, SchedulingPolicy, SingleStream,
    StreamPoolRoundRobin,
};

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}
fn assert_send_sync<T: Send + Sync>() {}
fn assert_unpin<T: Unpin>() {}
fn assert_static<T: 'static>() {}

#[test]
fn futures_are_send_and_unpin_for_every_output() {
    fn all<T: Send>() {
        assert_send::<DeviceFuture<T>>();
        assert_unpin::<DeviceFuture<T>>();
    }
    all::<i32>();
    all::<std::sync::Arc<DeviceBuffer<f32>>>();
    // Unpin even when the output is not.
    all::<std::marker::PhantomPinned>();
}

#[test]
fn every_combinator_is_send() {
    fn then<A: DeviceOp, F: Continuation<A::Output>>() {
        assert_send::<Then<A, F>>();
    }
    fn map<A: DeviceOp, F: FnOnce(A::Output) -> R + Send, R: Send>() {
        assert_send::<Map<A, F>>();
        assert_send::<MapFn<F>>();
    }
    fn inspect<A: DeviceOp, F: FnOnce(&A::Output) + Send>() {
        assert_send::<Inspect<A, F>>();
        assert_send::<InspectFn<F>>();
    }
    fn zips<A: DeviceOp, B: DeviceOp, C: DeviceOp>() {
        assert_send::<Zip2<A, B>>();
        assert_send::<Zip3<A, B, C>>();
        assert_send::<Zip8<A, B, C, A, B, C, A, B>>();
        assert_send::<JoinAll<A>>();
    }
    fn boxed<T: Send + 'static>() {
        assert_send::<BoxedOp<'static, T>>();
        assert_static::<BoxedOp<'static, T>>();
    }
    fn value<T: Send>() {
        assert_send::<Value<T>>();
    }
    fn with_context<F: FnOnce(&cuflow_device_op::ExecutionContext) -> B + Send, B: DeviceOp>() {
        assert_send::<WithContext<F>>();
    }
    then::<Value<i32>, fn(i32) -> Value<u8>>();
    map::<Value<i32>, fn(i32) -> u8, u8>();
    inspect::<Value<i32>, fn(&i32)>();
    zips::<Value<i32>, Value<u8>, BoxedOp<'static, ()>>();
    boxed::<i32>();
    value::<i32>();
    with_context::<fn(&cuflow_device_op::ExecutionContext) -> Value<i32>, Value<i32>>();
}

#[test]
fn shared_is_send_and_sync_for_every_op_with_a_sync_output() {
    fn shared<O: DeviceOp>()
    where
        O::Output: Sync,
    {
        assert_send_sync::<Shared<O>>();
    }
    shared::<Value<i32>>();
    // Even when the op itself is not Sync.
    shared::<BoxedOp<'static, i32>>();
}

#[test]
fn runtime_handles_are_send_and_sync() {
    assert_send_sync::<Device>();
    assert_send_sync::<Stream>();
    assert_send_sync::<StreamId>();
    assert_send_sync::<Event>();
    assert_send_sync::<Kernel>();
    assert_send_sync::<DeviceBuffer<f32>>();
    assert_send_sync::<DeviceBuffer<u8>>();
    assert_send_sync::<DeviceError>();
    assert_send_sync::<ExecutionStats>();
    assert_sync::<std::sync::Arc<DeviceBuffer<f64>>>();
}

#[test]
fn policies_are_send_and_sync() {
    assert_send_sync::<StreamPoolRoundRobin>();
    assert_send_sync::<SingleStream>();
    assert_send_sync::<LeastLoaded>();
    assert_send_sync::<Priority>();
    assert_send_sync::<std::sync::Arc<dyn SchedulingPolicy>>();
    assert_send_sync::<PriorityLevel>();
    assert_send_sync::<Placement<'static>>();
    // Object safe: one policy type for every thread.
    let _: Option<Box<dyn SchedulingPolicy>> = None;
}

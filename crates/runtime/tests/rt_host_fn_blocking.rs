//! A host function that blocks its stream until another thread begins a capture of it.
//!
//! Such a host function breaks `Stream::enqueue_host_fn`'s rule (it waits for something the
//! program does only later), which the test needs in order to hold a synchronization waiting.
//! On CUDA the host functions of every stream run on one driver thread, and a kernel module
//! loaded meanwhile may wait for the device's work in flight, this host function included,
//! while holding a lock that every other driver call takes (the capture this test begins
//! among them). Another test loading a kernel beside it would make a cycle that no one can
//! break, so this test is alone in its binary, and it makes every driver call it needs once
//! before it blocks the stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use cuflow_runtime::DeviceError;
use cuflow_testing::device::stream;

/// How long the host function waits for the capture before it gives up (and the test fails).
const CAPTURE_LIMIT: Duration = Duration::from_secs(20);

/// A synchronization waiting for a host function that waits for another thread to begin a
/// capture of the same stream returns: the synchronization does not hold the capture back
/// while it waits.
#[test]
fn a_synchronize_does_not_hold_back_a_capture_its_stream_waits_for() {
    cuflow_testing::thread::within_a_minute("the synchronize or the capture hung", || {
        let s = stream();
        // Every driver call of a capture, made once before the stream is blocked.
        s.begin_capture().expect("begin the first capture");
        s.end_capture().expect("end the first capture");
        s.synchronize().expect("the stream is idle");

        let (began, wait_for_capture) = mpsc::channel::<()>();
        let heard = Arc::new(AtomicBool::new(false));
        let heard_in_host_fn = Arc::clone(&heard);
        s.enqueue_host_fn(move || {
            if wait_for_capture.recv_timeout(CAPTURE_LIMIT).is_ok() {
                heard_in_host_fn.store(true, Ordering::Release);
            }
        })
        .expect("enqueue the host function");
        std::thread::scope(|scope| {
            let sync = scope.spawn(|| s.synchronize());
            // Lets the synchronize start waiting first (either order must finish).
            std::thread::sleep(Duration::from_millis(50));
            s.begin_capture().expect("begin the capture");
            // Fails if the host function gave up first: the capture began only once the
            // stream's work had finished, held back by the synchronize.
            let _ = began.send(());
            let graph = s.end_capture().expect("end the capture");
            assert_eq!(graph.node_count().expect("node count"), 0);
            match sync.join().expect("the synchronizing thread") {
                Ok(()) => {}
                Err(DeviceError::Capture { reason, .. }) => {
                    assert!(reason.contains("another thread"), "{reason}")
                }
                Err(e) => panic!("synchronize: {e}"),
            }
        });
        s.synchronize().expect("the stream is usable");
        assert!(
            heard.load(Ordering::Acquire),
            "the capture began only after the host function had given up waiting for it"
        );
    });
}

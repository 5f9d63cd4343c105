//! Events, waits and host functions: ordering between streams, completion, timing and
//! `Device::synchronize`.
//!
//! No test here leaves an error on a stream: `Device::synchronize` reports the errors of every
//! stream of the device, including those of the other tests of this binary.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuflow_runtime::{DeviceBuffer, DeviceError, Event, Stream};
use cuflow_testing::{
    device::{device, new_streams, stream},
    kernels::{launch_add_one, launch_spin_write, LONG_SPIN, SHORT_SPIN},
    rng::{random_f32, rng},
    test_cases, POISON, POISON_U32,
};
use rand::Rng;

/// Stream `a` runs a long kernel that writes `flag` at its end, then copies `src` into `data`;
/// stream `b`, ordered after `a` by `order_after`, then copies `data` and `flag` out. Without the
/// ordering, `b` would copy while `a` is still in its long kernel and read the poison; with it,
/// `b` must read what `a` wrote.
fn reader_sees_the_writers_data(
    order_after: impl Fn(&Stream, &Stream) -> Result<(), DeviceError>,
) -> Result<(), DeviceError> {
    let device = device();
    let (a, b) = (device.new_stream()?, device.new_stream()?);
    let mut rng = rng();
    let n = 4097;
    let values = random_f32(&mut rng, n);
    let value: f32 = rng.gen_range(1.0..2.0);
    let src = DeviceBuffer::from_host(&a, &values)?;
    let data = DeviceBuffer::<f32>::alloc(&a, n)?;
    let flag = DeviceBuffer::<f32>::alloc(&a, 1)?;
    data.view().fill_bytes(&a, POISON)?;
    flag.view().fill_bytes(&a, POISON)?;
    let out = DeviceBuffer::<f32>::alloc(&b, n + 1)?;
    out.view().fill_bytes(&b, POISON)?;
    a.synchronize()?;
    b.synchronize()?;

    launch_spin_write(&a, &flag, value, LONG_SPIN)?;
    data.copy_from(&a, &src)?;
    order_after(&b, &a)?;
    out.slice(..n)?.copy_from(&b, data.view())?;
    out.slice(n..)?.copy_from(&b, flag.view())?;
    // `out` was only used by `b`, so this read adds no ordering of its own on `a`.
    let got = out.to_host_vec(&b)?;
    let poison = POISON_U32;
    assert!(
        got[..n].iter().all(|v| v.to_bits() != poison),
        "stream b read the data before stream a wrote it"
    );
    assert_eq!(&got[..n], &values[..]);
    assert_eq!(
        got[n], value,
        "stream b read the flag before the long kernel wrote it"
    );
    Ok(())
}

test_cases! {
    a_reader_waiting_on_an_event_sees_the_writers_data => {
        reader_sees_the_writers_data(|reader, writer| reader.wait_event(&writer.record_event()?))
    },
    a_reader_joined_to_the_writer_sees_its_data => {
        reader_sees_the_writers_data(|reader, writer| reader.join(writer))
    },
}

#[test]
fn joining_a_stream_with_itself_does_nothing() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0])?;
    s.join(&s.clone())?;
    launch_add_one(&s, &x)?;
    assert_eq!(x.to_host_vec(&s)?, vec![2.0, 3.0]);
    Ok(())
}

/// Polls `event` until it completes. The deadline only keeps a broken event from hanging the
/// suite; it is far beyond any wait here.
fn poll_until_complete(event: &Event) -> Result<(), DeviceError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !event.is_complete()? {
        assert!(Instant::now() < deadline, "the event never completed");
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

#[test]
fn events_complete_after_the_work_before_them() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let flag = DeviceBuffer::<f32>::alloc(&s, 1)?;
    flag.view().fill_bytes(&s, POISON)?;
    launch_spin_write(&s, &flag, 7.0, SHORT_SPIN)?;
    let event = s.record_event()?;
    assert_eq!(event.stream_id(), s.id());
    assert_eq!(event.device(), &device);
    poll_until_complete(&event)?;
    assert!(event.is_complete()?, "a completed event stays complete");
    event.synchronize()?;
    assert_eq!(flag.to_host_vec(&s)?, vec![7.0]);

    // Waiting on an event blocks until its work is done.
    launch_spin_write(&s, &flag, 8.0, SHORT_SPIN)?;
    let event = s.record_event()?;
    event.synchronize()?;
    assert!(event.is_complete()?);
    Ok(())
}

#[test]
fn timed_events_measure_and_untimed_ones_refuse_to() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::<f32>::zeroed(&s, 1 << 16)?;
    let start = s.record_timed_event()?;
    launch_add_one(&s, &x)?;
    let end = s.record_timed_event()?;
    end.synchronize()?;
    start.synchronize()?;
    let ms = start.elapsed_ms(&end)?;
    assert!(ms.is_finite() && ms >= 0.0, "elapsed {ms} ms");

    let untimed = s.record_event()?;
    untimed.synchronize()?;
    assert!(matches!(
        untimed.elapsed_ms(&end),
        Err(DeviceError::Usage { .. })
    ));
    assert!(matches!(
        start.elapsed_ms(&untimed),
        Err(DeviceError::Usage { .. })
    ));
    Ok(())
}

#[test]
fn device_synchronize_waits_for_every_stream() -> Result<(), DeviceError> {
    let device = device();
    let streams = new_streams(&device, 3)?;
    let mut flags = Vec::new();
    let mut events = Vec::new();
    for (i, s) in streams.iter().enumerate() {
        let flag = DeviceBuffer::<f32>::alloc(s, 1)?;
        flag.view().fill_bytes(s, POISON)?;
        launch_spin_write(s, &flag, i as f32, SHORT_SPIN)?;
        events.push(s.record_event()?);
        flags.push(flag);
    }
    device.synchronize()?;
    for (i, e) in events.iter().enumerate() {
        assert!(
            e.is_complete()?,
            "stream {i} still had work after Device::synchronize"
        );
    }
    for (i, (s, flag)) in streams.iter().zip(&flags).enumerate() {
        assert_eq!(flag.to_host_vec(s)?, vec![i as f32]);
    }
    Ok(())
}

#[test]
fn host_functions_run_in_stream_order() -> Result<(), DeviceError> {
    let s = stream();
    let n = 257;
    let x = DeviceBuffer::<f32>::zeroed(&s, n)?;
    let log = Arc::new(Mutex::new(Vec::new()));
    for i in 0..16 {
        launch_add_one(&s, &x)?;
        let log = log.clone();
        s.enqueue_host_fn(move || log.lock().expect("log lock").push(i))?;
    }
    s.synchronize()?;
    assert_eq!(*log.lock().expect("log lock"), (0..16).collect::<Vec<_>>());
    assert_eq!(x.to_host_vec(&s)?, vec![16.0; n]);
    Ok(())
}

/// Timed events recorded during a capture stand for captured work, which runs only in
/// replays: the time between them is a capture error on every backend (as waiting for them
/// is), before and after the graph is replayed, never a number.
#[test]
fn the_time_between_captured_events_is_a_capture_error() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::<f32>::zeroed(&s, 1 << 10)?;
    s.synchronize()?;
    s.begin_capture()?;
    let start = s.record_timed_event();
    let added = launch_add_one(&s, &x);
    let end = s.record_timed_event();
    let graph = s.end_capture();
    let (start, end) = (start?, end?);
    added?;
    let exec = graph?.instantiate()?;
    let eager = s.record_timed_event()?;
    eager.synchronize()?;
    for replayed in [false, true] {
        if replayed {
            exec.launch(&s)?;
            s.synchronize()?;
        }
        for (a, b) in [(&start, &end), (&start, &eager), (&eager, &end)] {
            let r = a.elapsed_ms(b);
            assert!(
                matches!(r, Err(DeviceError::Capture { .. })),
                "replayed {replayed}: {r:?}"
            );
        }
    }
    Ok(())
}

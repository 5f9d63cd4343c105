//! The quickstart: tensors, kernels, chaining, combining, placement, async, record and replay.
//!
//! Runs on CUDA device 0 when one is usable, else on the host backend
//! (`CUFLOW_DEVICE=host|cuda|cuda:N` chooses explicitly).

use cuflow::prelude::*;

/// Refuses arguments (it takes none); prints an error of the run with its `Display` form,
/// which says what went wrong and how to fix it (a missing driver names the host backend as
/// the way out), and exits with status 1.
fn main() {
    if let Some(arg) = std::env::args().nth(1) {
        eprintln!("error: unexpected argument {arg:?}; 01_quickstart takes no arguments");
        std::process::exit(1);
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), DeviceError> {
    let device = Device::auto()?; // $CUFLOW_DEVICE if set, else CUDA device 0 if usable, else host
    println!("device: {device}");
    let stream = device.new_stream()?;

    let mut z = api::zeros::<f32>(&[16, 16]).sync_on(&stream)?;
    let x = api::ones::<f32>(&[16, 16]).sync_on(&stream)?;
    // Borrow-based: &mut z for output, &x for input. z holds the result afterwards.
    let _ = kernels::saxpy((&mut z).partition([4, 4]), 2.0, &x).sync_on(&stream)?;
    assert_eq!(z.to_host_vec()?, vec![2.0f32; 256]);
    println!(
        "saxpy over 4x4 tiles: z = 2 * x + z = {:?}...",
        &z.to_host_vec()?[..4]
    );

    // Chain dependent work (same stream, in order); combine independent work.
    let y = api::ones::<f32>(&[1 << 20])
        .then(|t| kernels::scale(t, 3.0))
        .sync()?;
    let (a, b) = zip!(api::ones::<f32>(&[64]), api::zeros::<f32>(&[64])).sync()?;
    let n = value(21).map(|v| v * 2).sync()?; // host-only transform
    let s = api::randn::<f32>(0.0, 1.0, &[256]).shared(); // Clone, runs at most once, yields Arc<Tensor<f32>>
    assert!(y.to_host_vec()?.iter().all(|v| *v == 3.0));
    assert_eq!(
        (a.to_host_vec()?[0], b.to_host_vec()?[0], n),
        (1.0, 0.0, 42)
    );

    // Two consumers of the shared op: it runs once; both see the same values.
    let (sum, prod) = zip!(
        kernels::add(s.clone(), s.clone()),
        kernels::mul(s.clone(), s.clone())
    )
    .sync()?;
    let (s_host, sum, prod) = (
        s.sync()?.to_host_vec()?,
        sum.to_host_vec()?,
        prod.to_host_vec()?,
    );
    assert!(s_host.iter().zip(&sum).all(|(v, w)| *w == v + v));
    assert!(s_host.iter().zip(&prod).all(|(v, w)| *w == v * v));
    println!(
        "shared randn: s[0] = {:.4}, s+s = {:.4}, s*s = {:.4}",
        s_host[0], sum[0], prod[0]
    );

    // Placement: default policy, explicit stream, explicit policy, async.
    let policy = StreamPoolRoundRobin::new(&device, 8)?;
    let t = futures::executor::block_on(async { kernels::relu(y).schedule(&policy)?.await })?;
    assert!(t.to_host_vec()?.iter().all(|v| *v == 3.0));
    println!("relu(y) awaited under a round-robin policy of 8 streams");

    // Record once, replay many times, feeding a new input before each replay. The graph keeps
    // clones of `input` and `acc` (handles to the same memory).
    let mut input = api::zeros::<f32>(&[4]).sync_on(&stream)?;
    let acc = api::zeros::<f32>(&[4]).sync_on(&stream)?;
    let mut graph =
        kernels::saxpy(acc.clone().partition([4]), 2.0, input.clone()).graph_on(stream.clone())?;
    let _ = graph.take_output(); // the partition of `acc` and the input, given back
    for token in [1.0f32, 2.0, 3.0] {
        let token = api::from_vec(vec![token, token, token, token], &[4]).sync_on(&stream)?;
        graph.update(api::memcpy(&mut input, &token))?;
        graph.replay_and_wait()?; // acc += 2 * input
        println!(
            "replay with input {:?}: acc = {:?}",
            token.to_host_vec()?,
            acc.to_host_vec()?
        );
    }
    assert_eq!(acc.to_host_vec()?, vec![12.0; 4]);
    Ok(())
}

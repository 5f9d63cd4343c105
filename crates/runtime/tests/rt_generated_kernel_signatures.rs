//! Kernel signatures generated from a grammar of the parameter types the reader knows (plain
//! and vector types, `const` and `__restrict__` pointers, arrays, pointers to pointers,
//! `typedef` and `using` aliases of values and of pointers, structs of one plain type, macros,
//! prototypes and `#if` branches that agree or disagree, with comments and line breaks between
//! tokens, beside decoy declarations, comments and string literals): a launch is accepted or
//! refused exactly as the documented check says. A model of the check gives, for any argument
//! list, `Ok` or the index of the argument refused.
//!
//! The reader runs before any backend, so the launches are on `Device::host()` whatever the
//! device under test is. `CUFLOW_RANDOM_SOURCES=N` runs N times as many cases.

mod kernel_source;

use cuflow_runtime::{Device, DeviceError};
use cuflow_testing::rng::{scale_from_env, seeded_rng};
use rand::Rng;

use kernel_source::check_model::*;
use kernel_source::signatures::*;
use kernel_source::*;

#[test]
fn generated_signatures_are_checked_as_documented() {
    naming_a_hang(|current| {
        let s = Device::host().new_stream().expect("a host stream");
        let cases = 300 * scale_from_env("CUFLOW_RANDOM_SOURCES");
        let (mut accepted, mut refused) = (0usize, 0usize);
        for case in 0..cases {
            let seed = 0x51_9a7e_0000 ^ case as u64;
            let mut rng = seeded_rng(seed);
            let name = ["k", "kernel", "saxpy_f32", "k2"][rng.gen_range(0..4)];
            let (source, params) = signature_source(&mut rng, name);
            let fitting = fitting_args(&mut rng, &params);
            let mut launches = vec![fitting.clone()];
            for _ in 0..4 {
                launches.push(changed(&mut rng, &fitting));
            }
            for args in launches {
                let what = format!("case {case} (seed {seed:#x})");
                at_case(current, &what, name, &source);
                let outcome = launch_unwinding(&what, name, &source, &args, &s);
                let want = refused_at(&params, &args);
                let got = match &outcome {
                    Ok(()) => None,
                    Err(DeviceError::InvalidArgument { kernel, index, .. }) if kernel == name => {
                        Some(*index)
                    }
                    Err(e) => panic!(
                        "{what}: unexpected error {e}\narguments {args:?}\nsource:\n{}",
                        shown(&source)
                    ),
                };
                if got != want {
                    panic!(
                        "{what}: {}\nthe documented check knows {params:?}\narguments {args:?}\n\
                         outcome {outcome:?}\nsource:\n{}",
                        match (want, got) {
                            (None, _) =>
                                "a launch the check documents as accepted was refused".to_string(),
                            (Some(i), None) => format!("argument {i} was accepted"),
                            (Some(i), Some(j)) => {
                                format!("argument {j} was refused where {i} should have been")
                            }
                        },
                        shown(&source)
                    );
                }
                match want {
                    None => accepted += 1,
                    Some(_) => refused += 1,
                }
            }
        }
        let total = accepted + refused;
        assert!(
            accepted * 5 > total && refused * 5 > total,
            "the cases barely test one side: {accepted} accepted, {refused} refused"
        );
    });
}

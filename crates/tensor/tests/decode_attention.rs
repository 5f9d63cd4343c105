//! Split attention over a key/value cache (partial results and their combination in one
//! kernel) against a float64 reference, for contexts that fill less than one partition,
//! exactly one, one and a bit, and several; with poisoned outputs, run twice on the same
//! counters (which every launch must leave zero); on whatever `Device::auto()` gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::Stream;
use cuflow_tensor::bf16;
use cuflow_tensor::kernels::decode::{self, AttentionShape};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng as rng;
use cuflow_testing::tensor::{read, upload};
use rand::rngs::StdRng;
use rand::Rng;

/// Positions per partition: several partitions cover the longer contexts below.
const CHUNK: usize = 64;
/// Contexts (positions attended by the first row).
const CONTEXTS: &[usize] = &[1, 63, 64, 65, 300];

fn random_f32(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// Row `r` of `q` attends positions `0..=start + r`, clamped to the cache.
fn reference(q: &[f32], cache: &[bf16], start: usize, shape: AttentionShape) -> Vec<f64> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        max_seq,
    } = shape;
    let g = heads / kv_heads;
    let rows = q.len() / (heads * hd);
    let scale = 1.0 / (hd as f64).sqrt();
    let at = |i: usize| f64::from(cache[i].to_f32());
    let mut out = vec![0.0; q.len()];
    for row in 0..rows {
        let n = (start + row).min(max_seq - 1) + 1;
        for h in 0..heads {
            let kvh = h / g;
            let qh = &q[(row * heads + h) * hd..][..hd];
            let scores: Vec<f64> = (0..n)
                .map(|t| {
                    let k = (kvh * max_seq + t) * hd;
                    qh.iter()
                        .enumerate()
                        .map(|(c, &x)| f64::from(x) * scale * at(k + c))
                        .sum()
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for c in 0..hd {
                let v: f64 = (0..n)
                    .map(|t| e[t] * at(((kv_heads + kvh) * max_seq + t) * hd + c))
                    .sum();
                out[(row * heads + h) * hd + c] = v / l;
            }
        }
    }
    out
}

fn check(s: &Stream, rng: &mut StdRng, shape: AttentionShape, rows: usize) {
    check_with(s, rng, shape, rows, CHUNK, CONTEXTS);
}

fn check_with(
    s: &Stream,
    rng: &mut StdRng,
    shape: AttentionShape,
    rows: usize,
    chunk: usize,
    contexts: &[usize],
) {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        max_seq,
    } = shape;
    let cache_h: Vec<bf16> = random_f32(rng, shape.cache_len(), 2.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let cache = upload(s, &cache_h, &[shape.cache_len()]);
    let parts = decode::attention_partitions(max_seq, chunk);
    let width = rows * heads * hd;
    let scratch_len = rows * heads * parts * (hd + 2);
    let mut scratch = upload(
        s,
        &vec![f32::NAN; scratch_len],
        &[rows, heads, parts, hd + 2],
    );
    let mut counts = decode::AttentionCounters::zeroed(rows, kv_heads)
        .sync_on(s)
        .expect("counters");
    for &ctx in contexts {
        let start = ctx - 1;
        let q_h = random_f32(rng, width, 1.5);
        let q = upload(s, &q_h, &[rows, heads * hd]);
        let pos = upload(s, &[start as u32], &[1]);
        let want = reference(&q_h, &cache_h, start, shape);
        for run in 0..2 {
            let mut out = upload(s, &vec![f32::NAN; width], &[rows, heads * hd]);
            decode::attention(&mut out, &mut scratch, &mut counts, &q, &cache, &pos, shape)
                .sync_on(s)
                .expect("attention runs");
            let got = read(&out);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-4 + 1e-4 * w.abs(),
                    "{shape:?}, {rows} rows, context {ctx}, run {run}: out[{i}] = {g}, want {w}"
                );
            }
            assert_eq!(
                counts.to_host_vec().expect("counts read back"),
                vec![0; rows * kv_heads],
                "{shape:?}, context {ctx}, run {run}: the counters are left zero"
            );
        }
    }
}

#[test]
fn split_attention_matches_float64() {
    let s = stream();
    let mut rng = rng(0xa77e);
    let llama = AttentionShape {
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        max_seq: 320,
    };
    check(&s, &mut rng, llama, 1);
    // Several rows (as in prefill), the later ones past the cache's end.
    check(&s, &mut rng, llama, 24);
    let wide = AttentionShape {
        heads: 4,
        kv_heads: 4,
        head_dim: 128,
        max_seq: 300,
    };
    check(&s, &mut rng, wide, 1);
}

/// Every head width the kernel is built for (16 to 256), groups of 1 to 8 query heads per
/// key/value head (the kernel has its own code for some widths and groups), and partitions longer than the block has threads (as prefill uses).
#[test]
fn split_attention_matches_float64_for_every_head_width_and_group() {
    let s = stream();
    let mut rng = rng(0xa77f);
    for (heads, kv_heads, head_dim) in [
        (8, 1, 16),
        (6, 2, 32),
        (3, 3, 64),
        (16, 2, 64),
        (6, 1, 64),
        (8, 2, 128),
        (4, 2, 128),
        (2, 1, 256),
    ] {
        let shape = AttentionShape {
            heads,
            kv_heads,
            head_dim,
            max_seq: 320,
        };
        check(&s, &mut rng, shape, 1);
    }
    let long = AttentionShape {
        heads: 4,
        kv_heads: 1,
        head_dim: 64,
        max_seq: 1200,
    };
    check_with(&s, &mut rng, long, 3, 512, &[1, 200, 512, 513, 1100]);
}

#[test]
fn split_attention_rejects_bad_counters() {
    let s = stream();
    let shape = AttentionShape {
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        max_seq: 8,
    };
    let parts = decode::attention_partitions(shape.max_seq, CHUNK);
    let mut out = upload(&s, &[0f32; 64], &[1, 64]);
    let mut scratch = upload(&s, &vec![0f32; 4 * parts * 18], &[1, 4, parts, 18]);
    let mut counts = decode::AttentionCounters::zeroed(1, 1)
        .sync_on(&s)
        .expect("counters");
    let q = upload(&s, &[0f32; 64], &[1, 64]);
    let cache = upload(
        &s,
        &vec![bf16::ZERO; shape.cache_len()],
        &[shape.cache_len()],
    );
    let pos = upload(&s, &[0u32], &[1]);
    let err = decode::attention(&mut out, &mut scratch, &mut counts, &q, &cache, &pos, shape)
        .sync_on(&s)
        .expect_err("one counter for two key/value heads");
    assert!(err.to_string().contains("counts"), "{err}");
}

#[test]
fn compile_all_refuses_a_shape_the_attention_kernels_do_not_support() {
    let s = stream();
    let shape = AttentionShape {
        heads: 6,
        kv_heads: 4,
        head_dim: 64,
        max_seq: 16,
    };
    let err = decode::compile_all(s.device(), shape).expect_err("6 heads over 4 are refused");
    assert!(
        matches!(
            &err,
            cuflow_runtime::DeviceError::InvalidShape {
                op: "compile_all",
                ..
            }
        ),
        "{err}"
    );
    let good = AttentionShape {
        heads: 8,
        kv_heads: 2,
        ..shape
    };
    decode::compile_all(s.device(), good).expect("a supported shape compiles");
}

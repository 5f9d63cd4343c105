//! `rope_attention` (RoPE, the cache append and attention of one decode row in one kernel)
//! against the two kernels it replaces, `rope_kv_append` then `attention`, from the same
//! random cache: the cache each leaves must agree, and the result must match a float64
//! reference of attention over that cache with the rotated queries. Every head width and
//! group size, positions in the first partition, on partition edges, in later ones, on the
//! cache's last row and past the cache up to `u32::MAX` (no append, the context clamped);
//! outputs poisoned, each case run twice on the same counters; on whatever `Device::auto()`
//! gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{DeviceError, Stream};
use cuflow_tensor::bf16;
use cuflow_tensor::kernels::decode::{self, AttentionShape};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng as rng;
use cuflow_testing::tensor::{read, upload};
use rand::rngs::StdRng;
use rand::Rng;

/// Positions per partition.
const CHUNK: usize = 64;
/// Positions the cache holds: five partitions, the last one short.
const MAX_SEQ: usize = 300;
/// Positions of the decoded row, up to the largest `pos` holds.
const POSITIONS: &[usize] = &[0, 1, 63, 64, 65, 200, 299, 300, 350, u32::MAX as usize];

fn random_f32(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// One query row `q` attending positions `0..=p` of `cache` (clamped), in float64.
fn reference(q: &[f32], cache: &[bf16], p: usize, shape: AttentionShape) -> Vec<f64> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        max_seq,
    } = shape;
    let g = heads / kv_heads;
    let n = p.min(max_seq - 1) + 1;
    let scale = 1.0 / (hd as f64).sqrt();
    let at = |i: usize| f64::from(cache[i].to_f32());
    let mut out = vec![0.0; heads * hd];
    for h in 0..heads {
        let kvh = h / g;
        let qh = &q[h * hd..][..hd];
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
            out[h * hd + c] = v / l;
        }
    }
    out
}

/// Whether two bf16 values are equal or one rounding step apart (the two kernels may
/// contract the rotation's multiply-adds differently).
fn within_one_step(a: bf16, b: bf16) -> bool {
    a.to_bits().abs_diff(b.to_bits()) <= 1
}

fn check(s: &Stream, rng: &mut StdRng, shape: AttentionShape) {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        max_seq,
    } = shape;
    let width = (heads + 2 * kv_heads) * hd;
    let parts = decode::attention_partitions(max_seq, CHUNK);
    let inv_freq_h: Vec<f32> = (0..hd / 2)
        .map(|i| 10_000f32.powf(-2.0 * i as f32 / hd as f32))
        .collect();
    let inv_freq = upload(s, &inv_freq_h, &[hd / 2]);
    let mut scratch = upload(
        s,
        &vec![f32::NAN; heads * parts * (hd + 2)],
        &[1, heads, parts, hd + 2],
    );
    let mut counts = decode::AttentionCounters::zeroed(1, kv_heads)
        .sync_on(s)
        .expect("counters");
    for &p in POSITIONS {
        let cache_h: Vec<bf16> = random_f32(rng, shape.cache_len(), 2.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let qkv = upload(s, &random_f32(rng, width, 1.5), &[1, width]);
        let pos = upload(s, &[p as u32], &[1]);

        // The two kernels it replaces.
        let mut cache_two = upload(s, &cache_h, &[shape.cache_len()]);
        let mut q = upload(s, &vec![f32::NAN; heads * hd], &[1, heads * hd]);
        decode::rope_kv_append(&mut q, &mut cache_two, &qkv, &inv_freq, &pos, shape)
            .sync_on(s)
            .expect("rope_kv_append runs");
        let want_cache = read(&cache_two);
        let want = reference(&read(&q), &want_cache, p, shape);

        for run in 0..2 {
            let mut cache = upload(s, &cache_h, &[shape.cache_len()]);
            let mut out = upload(s, &vec![f32::NAN; heads * hd], &[1, heads * hd]);
            decode::rope_attention(
                &mut out,
                &mut scratch,
                &mut counts,
                &mut cache,
                &qkv,
                &inv_freq,
                &pos,
                shape,
            )
            .sync_on(s)
            .expect("rope_attention runs");
            let got_cache = read(&cache);
            for (i, (&g, &w)) in got_cache.iter().zip(&want_cache).enumerate() {
                assert!(
                    within_one_step(g, w),
                    "{shape:?}, position {p}, run {run}: cache[{i}] = {g}, want {w}"
                );
            }
            if p >= max_seq {
                assert_eq!(got_cache, cache_h, "{shape:?}, position {p}: no append");
            }
            let got = read(&out);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 2e-4 + 2e-4 * w.abs(),
                    "{shape:?}, position {p}, run {run}: out[{i}] = {g}, want {w}"
                );
            }
            assert_eq!(
                counts.to_host_vec().expect("counts read back"),
                vec![0; kv_heads],
                "{shape:?}, position {p}, run {run}: the counters are left zero"
            );
        }
    }
}

#[test]
fn rope_attention_matches_rope_kv_append_then_attention_for_every_width_and_group() {
    let s = stream();
    let mut rng = rng(0x0f0e_a77e);
    for head_dim in [16, 32, 64, 128, 256] {
        for group in [1, 2, 3, 4, 8] {
            let kv_heads = 2;
            let shape = AttentionShape {
                heads: kv_heads * group,
                kv_heads,
                head_dim,
                max_seq: MAX_SEQ,
            };
            check(&s, &mut rng, shape);
        }
    }
}

#[test]
fn rope_attention_refuses_more_than_one_row_and_wrong_sizes() {
    let s = stream();
    let shape = AttentionShape {
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        max_seq: 32,
    };
    let width = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
    let parts = decode::attention_partitions(shape.max_seq, 8);
    let mut scratch = upload(
        &s,
        &vec![0f32; shape.heads * parts * (shape.head_dim + 2)],
        &[1, shape.heads, parts, shape.head_dim + 2],
    );
    let mut counts = decode::AttentionCounters::zeroed(1, shape.kv_heads)
        .sync_on(&s)
        .expect("counters");
    let mut cache = upload(
        &s,
        &vec![bf16::from_f32(0.5); shape.cache_len()],
        &[shape.cache_len()],
    );
    let before = read(&cache);
    let pos = upload(&s, &[3u32], &[1]);
    let inv_freq = upload(&s, &[1f32; 8], &[8]);
    let mut out = upload(
        &s,
        &vec![f32::NAN; shape.heads * shape.head_dim],
        &[1, shape.heads * shape.head_dim],
    );
    let two_rows = upload(&s, &vec![1f32; 2 * width], &[2, width]);
    let err = decode::rope_attention(
        &mut out,
        &mut scratch,
        &mut counts,
        &mut cache,
        &two_rows,
        &inv_freq,
        &pos,
        shape,
    )
    .sync_on(&s)
    .expect_err("two rows are refused");
    assert!(
        matches!(&err, DeviceError::InvalidShape { op: "rope_attention", reason } if reason.contains("one row")),
        "{err}"
    );
    let one_row = upload(&s, &vec![1f32; width], &[1, width]);
    let short_freq = upload(&s, &[1f32; 4], &[4]);
    let err = decode::rope_attention(
        &mut out,
        &mut scratch,
        &mut counts,
        &mut cache,
        &one_row,
        &short_freq,
        &pos,
        shape,
    )
    .sync_on(&s)
    .expect_err("a short inv_freq is refused");
    assert!(
        matches!(&err, DeviceError::InvalidShape { op: "rope_attention", reason } if reason.contains("inv_freq")),
        "{err}"
    );
    assert_eq!(read(&cache), before, "nothing was written");
}

//! Positions at the top of `u32`: row `r` of a launch sits at `pos[0] + r`, which passes
//! `u32::MAX` for the later rows when `pos[0]` is near it. Every backend takes that position
//! as it is, without wrapping: such rows write nothing into the cache (its row 0 included),
//! rotate by their own position, and attend the whole cache, as any position past the cache
//! does; on whatever `Device::auto()` gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_tensor::bf16;
use cuflow_tensor::kernels::decode::{self, AttentionShape};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng as rng;
use cuflow_testing::tensor::{read, upload};
use rand::rngs::StdRng;
use rand::Rng;

/// Query rows per launch: with `pos[0] = u32::MAX` the last two pass it.
const ROWS: usize = 3;

fn random_f32(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

fn random_cache(rng: &mut StdRng, shape: AttentionShape) -> Vec<bf16> {
    random_f32(rng, shape.cache_len(), 2.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

#[test]
fn rope_kv_append_rows_past_u32_max_write_nothing_and_rotate_by_their_position() {
    let s = stream();
    let mut rng = rng(0x0905_0001);
    let shape = AttentionShape {
        heads: 2,
        kv_heads: 1,
        head_dim: 16,
        max_seq: 8,
    };
    let (heads, hd, half) = (shape.heads, shape.head_dim, shape.head_dim / 2);
    let width = (heads + 2 * shape.kv_heads) * hd;
    let qkv_h = random_f32(&mut rng, ROWS * width, 1.5);
    let cache_h = random_cache(&mut rng, shape);
    // Multiples of 2^-30: every angle, position · frequency in `f32`, is exact.
    let inv_freq_h: Vec<f32> = (0..half).map(|i| (i + 1) as f32 * 2f32.powi(-30)).collect();
    let qkv = upload(&s, &qkv_h, &[ROWS, width]);
    let inv_freq = upload(&s, &inv_freq_h, &[half]);
    for start in [u32::MAX - 1, u32::MAX] {
        let pos = upload(&s, &[start], &[1]);
        let mut cache = upload(&s, &cache_h, &[shape.cache_len()]);
        let mut q = upload(&s, &vec![f32::NAN; ROWS * heads * hd], &[ROWS, heads * hd]);
        decode::rope_kv_append(&mut q, &mut cache, &qkv, &inv_freq, &pos, shape)
            .sync_on(&s)
            .expect("rope_kv_append runs");
        assert_eq!(
            read(&cache),
            cache_h,
            "pos {start}: rows past the cache write nothing (row 0 of the cache included)"
        );
        let got = read(&q);
        for row in 0..ROWS {
            let p = u64::from(start) + row as u64;
            for h in 0..heads {
                let x = &qkv_h[row * width + h * hd..][..hd];
                let o = &got[(row * heads + h) * hd..][..hd];
                for i in 0..half {
                    let (sn, cs) = f64::from(p as f32 * inv_freq_h[i]).sin_cos();
                    let (a, b) = (f64::from(x[i]), f64::from(x[i + half]));
                    for (g, w) in [(o[i], a * cs - b * sn), (o[i + half], b * cs + a * sn)] {
                        assert!(
                            (f64::from(g) - w).abs() <= 1e-5,
                            "pos {start}, row {row} (position {p}), head {h}, pair {i}: {g}, \
                             want {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn attention_rows_past_u32_max_attend_the_whole_cache() {
    let s = stream();
    let mut rng = rng(0x0905_0002);
    // Five partitions of 64 positions: the rows' results are combined from several.
    let shape = AttentionShape {
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        max_seq: 320,
    };
    let (hd, width) = (shape.head_dim, ROWS * shape.heads * shape.head_dim);
    let parts = decode::attention_partitions(shape.max_seq, 64);
    let cache = upload(&s, &random_cache(&mut rng, shape), &[shape.cache_len()]);
    let q = upload(
        &s,
        &random_f32(&mut rng, width, 1.5),
        &[ROWS, shape.heads * hd],
    );
    let mut scratch = upload(
        &s,
        &vec![f32::NAN; ROWS * shape.heads * parts * (hd + 2)],
        &[ROWS, shape.heads, parts, hd + 2],
    );
    let mut counts = decode::AttentionCounters::zeroed(ROWS, shape.kv_heads)
        .sync_on(&s)
        .expect("counters");
    let mut run = |start: u32| {
        let pos = upload(&s, &[start], &[1]);
        let mut out = upload(&s, &vec![f32::NAN; width], &[ROWS, shape.heads * hd]);
        decode::attention(&mut out, &mut scratch, &mut counts, &q, &cache, &pos, shape)
            .sync_on(&s)
            .expect("attention runs");
        read(&out)
    };
    // Every row from the cache's last position on attends all of it, in the same partitions.
    let whole = run((shape.max_seq - 1) as u32);
    for start in [u32::MAX - 1, u32::MAX] {
        let got = run(start);
        for (i, (g, w)) in got.iter().zip(&whole).enumerate() {
            assert!(
                g.to_bits() == w.to_bits(),
                "pos {start}: out[{i}] (row {}) = {g}, want {w} (the whole cache attended)",
                i / (shape.heads * hd)
            );
        }
    }
    assert_eq!(
        counts.to_host_vec().expect("counts read back"),
        vec![0; ROWS * shape.kv_heads],
        "the counters are left zero"
    );
}

//! Sizes whose products leave `usize` are refused by every decode kernel with an error naming
//! the kernel and the size, before anything is launched: attention shapes with huge head
//! counts or caches (and [`AttentionShape::cache_len`] of them), a GEMV row index past the
//! address space, an embedding table of 2^63 empty rows, and an expanded output of 2^62 rows.
//! None of them panics (in debug builds) or wraps to a small size that passes the shape checks
//! (in release builds, where a wrapped row index read row 0 instead of failing). Attention
//! shapes with a size of zero are refused the same way, the error naming the size, before
//! anything divides by it.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{DeviceError, Stream};
use cuflow_tensor::kernels::decode::{self, AttentionCounters, AttentionShape};
use cuflow_tensor::{api, bf16, Tensor};
use cuflow_testing::device::stream;
use cuflow_testing::tensor::{read, upload};

/// Asserts that `r` is an invalid shape of `op` whose message mentions `what`.
#[track_caller]
fn assert_invalid(r: Result<(), DeviceError>, op: &str, what: &str) {
    match r {
        Err(DeviceError::InvalidShape { op: o, reason }) => {
            assert_eq!(o, op, "{reason}");
            assert!(reason.contains(what), "{reason:?} does not mention {what}");
        }
        other => panic!("expected an invalid shape of {op}, got {other:?}"),
    }
}

/// Shapes that pass every per-field rule (a group of 1 to 8 query heads per key/value head, a
/// power-of-two head width from 16 to 256, a positive `max_seq`) but whose sizes overflow.
fn huge_shapes() -> [AttentionShape; 4] {
    [
        // heads · head_dim overflows.
        AttentionShape {
            heads: 1 << 62,
            kv_heads: 1 << 62,
            head_dim: 16,
            max_seq: 4,
        },
        // (heads + 2 · kv_heads) · head_dim overflows, heads · head_dim does not.
        AttentionShape {
            heads: 1 << 58,
            kv_heads: 1 << 58,
            head_dim: 16,
            max_seq: 4,
        },
        // The cache, 2 · kv_heads · max_seq · head_dim, overflows (to 0 when wrapped).
        AttentionShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 16,
            max_seq: 1 << 59,
        },
        // The longest `max_seq` there is.
        AttentionShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            max_seq: usize::MAX,
        },
    ]
}

#[test]
fn cache_len_saturates_instead_of_overflowing() {
    for shape in huge_shapes() {
        assert_eq!(shape.cache_len(), usize::MAX, "{shape:?}");
    }
    let small = AttentionShape {
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        max_seq: 8,
    };
    assert_eq!(small.cache_len(), 2 * 2 * 8 * 16);
}

/// What the attention kernels read in these tests.
struct Inputs<'a> {
    q: &'a Tensor<f32>,
    qkv: &'a Tensor<f32>,
    inv_freq: &'a Tensor<f32>,
    pos: &'a Tensor<u32>,
}

/// What they write.
struct Outputs<'a> {
    out: &'a mut Tensor<f32>,
    scratch: &'a mut Tensor<f32>,
    counts: &'a mut AttentionCounters,
    q_out: &'a mut Tensor<f32>,
    cache: &'a mut Tensor<bf16>,
}

/// `attention`, `rope_attention`, `rope_kv_append` and `compile_all` each refuse `shape` with
/// an `InvalidShape` whose reason holds `what`.
fn assert_every_attention_kernel_refuses(
    s: &Stream,
    shape: AttentionShape,
    i: &Inputs<'_>,
    o: Outputs<'_>,
    what: &str,
) {
    let r = decode::attention(o.out, o.scratch, o.counts, i.q, o.cache, i.pos, shape).sync_on(s);
    assert_invalid(r, "attention", what);
    let r = decode::rope_attention(
        o.out, o.scratch, o.counts, o.cache, i.qkv, i.inv_freq, i.pos, shape,
    )
    .sync_on(s);
    assert_invalid(r, "rope_attention", what);
    let r = decode::rope_kv_append(o.q_out, o.cache, i.qkv, i.inv_freq, i.pos, shape).sync_on(s);
    assert_invalid(r, "rope_kv_append", what);
    let r = decode::compile_all(s.device(), shape);
    assert_invalid(r, "compile_all", what);
}

#[test]
fn attention_kernels_refuse_shapes_whose_sizes_overflow() {
    let s = stream();
    let f32s = |shape: &[usize]| api::zeros::<f32>(shape).sync_on(&s).expect("a tensor");
    let cache_h = vec![bf16::from_f32(0.5); 128];
    let mut cache = upload(&s, &cache_h, &[128]);
    let pos = upload(&s, &[0u32], &[1]);
    let (q, qkv, inv_freq) = (f32s(&[16]), f32s(&[48]), f32s(&[8]));
    let inputs = Inputs {
        q: &q,
        qkv: &qkv,
        inv_freq: &inv_freq,
        pos: &pos,
    };
    for shape in huge_shapes() {
        let mut out = f32s(&[16]);
        let mut scratch = f32s(&[1, 1, 1, 18]);
        let mut counts = AttentionCounters::zeroed(1, 1)
            .sync_on(&s)
            .expect("counters");
        let mut q_out = f32s(&[16]);
        let outputs = Outputs {
            out: &mut out,
            scratch: &mut scratch,
            counts: &mut counts,
            q_out: &mut q_out,
            cache: &mut cache,
        };
        assert_every_attention_kernel_refuses(&s, shape, &inputs, outputs, "overflow");
    }
    assert_eq!(read(&cache), cache_h, "the cache after refused launches");
}

#[test]
fn attention_kernels_refuse_zero_sizes_naming_them() {
    let s = stream();
    let f32s = |shape: &[usize]| api::zeros::<f32>(shape).sync_on(&s).expect("a tensor");
    let good = AttentionShape {
        heads: 2,
        kv_heads: 1,
        head_dim: 16,
        max_seq: 4,
    };
    let cache_h = vec![bf16::from_f32(0.5); good.cache_len()];
    let mut cache = upload(&s, &cache_h, &[good.cache_len()]);
    let pos = upload(&s, &[0u32], &[1]);
    // No query rows: with `heads == 0` a row is empty too, and counting the rows divided by
    // its length.
    let (q, qkv, inv_freq) = (f32s(&[0]), f32s(&[64]), f32s(&[8]));
    let inputs = Inputs {
        q: &q,
        qkv: &qkv,
        inv_freq: &inv_freq,
        pos: &pos,
    };
    for (field, shape) in [
        ("heads", AttentionShape { heads: 0, ..good }),
        (
            "kv_heads",
            AttentionShape {
                kv_heads: 0,
                ..good
            },
        ),
        (
            "head_dim",
            AttentionShape {
                head_dim: 0,
                ..good
            },
        ),
        ("max_seq", AttentionShape { max_seq: 0, ..good }),
    ] {
        let what = format!("`{field}` is 0");
        let mut out = f32s(&[0]);
        let mut scratch = f32s(&[0, shape.heads, 1, shape.head_dim + 2]);
        let mut counts = AttentionCounters::zeroed(0, shape.kv_heads)
            .sync_on(&s)
            .expect("counters");
        let mut q_out = f32s(&[0]);
        let outputs = Outputs {
            out: &mut out,
            scratch: &mut scratch,
            counts: &mut counts,
            q_out: &mut q_out,
            cache: &mut cache,
        };
        assert_every_attention_kernel_refuses(&s, shape, &inputs, outputs, &what);
    }
    assert_eq!(read(&cache), cache_h, "the cache after refused launches");
}

#[test]
fn gemv_refuses_a_row_index_past_the_address_space() {
    let s = stream();
    let k = 8;
    let w = upload(&s, &[bf16::from_f32(1.0); 8], &[1, k]);
    let x: Tensor<f32> = upload(&s, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[1, k]);
    let mut out = upload(&s, &[f32::NAN], &[1]);
    // Wrapped, (row + 1) · k is 8 (the length of `x`, so row 0 was read) for the first and 0
    // for the second: none of them is a row of `x`.
    for row in [1 << 61, usize::MAX, usize::MAX / 8] {
        let r = decode::gemv(&mut out, &w, &x, row).sync_on(&s);
        assert_invalid(r, "gemv", &format!("row {row}"));
    }
    assert!(read(&out)[0].is_nan(), "the output after refused launches");
    // Row 0 is there.
    decode::gemv(&mut out, &w, &x, 0)
        .sync_on(&s)
        .expect("row 0");
    assert_eq!(read(&out), vec![36.0]);
}

#[test]
fn embed_rows_refuses_rows_whose_size_overflows() {
    let s = stream();
    // No elements, 2^63 columns: two rows of them would be 2^64 elements.
    let table = api::zeros::<bf16>(&[0, 1 << 63])
        .sync_on(&s)
        .expect("an empty table");
    let ids = upload(&s, &[0u32, 1], &[2]);
    let mut out = upload(&s, &[7.0f32, 7.0], &[2]);
    let r = decode::embed_rows(&mut out, &table, &ids).sync_on(&s);
    assert_invalid(r, "embed_rows", "overflow");
    assert_eq!(read(&out), vec![7.0, 7.0]);
}

#[test]
fn silu_mul_refuses_an_output_whose_input_size_overflows() {
    let s = stream();
    // An output of 2^63 elements (a row repeated 2^62 times) needs 2^64 inputs.
    let mut out = api::zeros::<f32>(&[1, 2])
        .sync_on(&s)
        .expect("a row")
        .expand(&[1 << 62, 2])
        .expect("an expanded view");
    let gate_up = upload(&s, &[1.0f32; 4], &[1, 4]);
    let r = decode::silu_mul(&mut out, &gate_up).sync_on(&s);
    assert_invalid(r, "silu_mul", "overflow");
}

//! The strided kernel's two walks over its output, against float64 (or exact) references
//! computed here from the permutation by index arithmetic, on random inputs. Operands read
//! transposed to the output (a transposed matrix, a batched permute) take the tiled walk
//! through shared memory; dense and broadcast operands in the same launch are read directly;
//! everything else takes the linear walk. Sizes that are not multiples of the 32 × 32 tile,
//! axes too short to tile, and zero-size axes are included; so are comparisons (`u8` masks)
//! and `where_` with the mask read transposed.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{bf16, f16, kernels, DType, Tensor};
use cuflow_testing::{
    device::stream,
    rng::seeded_rng,
    tensor::{assert_dtype_close, assert_exact, few_values, read, signed, uniform, upload, Float},
    test_cases,
};

/// The row-major elements of `x.permute(perm)` for `x` of `shape` with elements `data`.
fn permuted<T: Copy>(data: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let out: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
    let n: usize = out.iter().product();
    (0..n)
        .map(|mut i| {
            let mut idx = vec![0; shape.len()];
            for a in (0..out.len()).rev() {
                idx[perm[a]] = i % out[a];
                i /= out[a];
            }
            data[idx.iter().zip(shape).fold(0, |p, (&k, &d)| p * d + k)]
        })
        .collect()
}

/// Matrix sizes: multiples of the tile, odd sizes, axes too short to tile, vectors, empty.
const SIZES: &[(usize, usize)] = &[
    (64, 96),
    (33, 65),
    (100, 37),
    (17, 300),
    (5, 200),
    (1, 1000),
    (1000, 1),
    (0, 40),
    (40, 0),
];

/// `xᵀ + y`, `y - xᵀ`, `xᵀ * col` and `row + xᵀ`: the transposed operand staged, the dense,
/// column and row operands read directly, in either argument position.
fn transposed_arith<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for &(r, c) in SIZES {
        let a: Vec<T> = signed(&mut rng, r * c, 0.5, 2.0);
        let b: Vec<T> = signed(&mut rng, c * r, 0.5, 2.0);
        let colh: Vec<T> = signed(&mut rng, c, 0.5, 2.0);
        let rowh: Vec<T> = signed(&mut rng, r, 0.5, 2.0);
        let x = upload(&s, &a, &[r, c]);
        let (y, col, row) = (
            upload(&s, &b, &[c, r]),
            upload(&s, &colh, &[c, 1]),
            upload(&s, &rowh, &[r]),
        );
        let xt = x.transpose(0, 1)?; // [c, r]
        let at: Vec<f64> = permuted(&a, &[r, c], &[1, 0])
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let f = |v: &T| v.to_f64();
        let cases: [(&str, Tensor<T>, Vec<f64>); 4] = [
            (
                "xt + y",
                kernels::add(&xt, &y).sync_on(&s)?,
                (0..r * c).map(|i| at[i] + f(&b[i])).collect(),
            ),
            (
                "y - xt",
                kernels::sub(&y, &xt).sync_on(&s)?,
                (0..r * c).map(|i| f(&b[i]) - at[i]).collect(),
            ),
            (
                "xt * col",
                kernels::mul(&xt, &col).sync_on(&s)?,
                (0..r * c).map(|i| at[i] * f(&colh[i / r])).collect(),
            ),
            (
                "row + xt",
                kernels::add(&row, &xt).sync_on(&s)?,
                (0..r * c).map(|i| f(&rowh[i % r]) + at[i]).collect(),
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got.shape(), &[c, r], "{what} {r}x{c}");
            assert_dtype_close(&read(&got), &want, T::ARITH_TOL, &format!("{what} {r}x{c}"));
        }
    }
    Ok(())
}

test_cases! {
    transposed_arith_f32 => transposed_arith::<f32>(41),
    transposed_arith_f64 => transposed_arith::<f64>(42),
    transposed_arith_f16 => transposed_arith::<f16>(43),
    transposed_arith_bf16 => transposed_arith::<bf16>(44),
}

/// Batched shapes (leading axes too) under every permutation of three axes and some of four.
const PERMUTES: &[(&[usize], &[usize])] = &[
    (&[3, 33, 65], &[0, 2, 1]),
    (&[3, 33, 65], &[1, 0, 2]),
    (&[3, 33, 65], &[1, 2, 0]),
    (&[3, 33, 65], &[2, 0, 1]),
    (&[3, 33, 65], &[2, 1, 0]),
    (&[40, 2, 50], &[2, 1, 0]),
    (&[2, 3, 20, 40], &[1, 0, 3, 2]),
    (&[2, 3, 20, 40], &[3, 1, 2, 0]),
    (&[2, 3, 20, 40], &[3, 1, 0, 2]),
    (&[4, 0, 20], &[0, 2, 1]),
    (&[20, 1, 1, 20], &[3, 1, 2, 0]),
];

/// `contiguous` of permuted views, exact for every dtype.
fn permuted_copies<T: DType>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for &(shape, perm) in PERMUTES {
        let n = shape.iter().product();
        let a: Vec<T> = uniform(&mut rng, n, 0.0, 100.0);
        let x = upload(&s, &a, shape);
        let got = kernels::contiguous(x.permute(perm)?).sync_on(&s)?;
        assert!(got.is_contiguous());
        let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        assert_eq!(got.shape(), &out[..]);
        assert_exact(
            &read(&got),
            &permuted(&a, shape, perm),
            &format!("{shape:?} permuted {perm:?}"),
        );
    }
    Ok(())
}

test_cases! {
    permuted_copies_f32 => permuted_copies::<f32>(45),
    permuted_copies_f64 => permuted_copies::<f64>(46),
    permuted_copies_f16 => permuted_copies::<f16>(47),
    permuted_copies_i64 => permuted_copies::<i64>(48),
    permuted_copies_u8 => permuted_copies::<u8>(49),
}

/// Two operands read transposed to the output along the same axis (both staged), and one
/// with its unit stride along another axis than the staged one (read directly).
fn batched_transposed_operands<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let (b, m, n) = (3, 35, 70);
    let (ah, bh, ch): (Vec<T>, Vec<T>, Vec<T>) = (
        signed(&mut rng, b * m * n, 0.5, 2.0),
        signed(&mut rng, b * m * n, 0.5, 2.0),
        signed(&mut rng, b * m * n, 0.5, 2.0),
    );
    let x = upload(&s, &ah, &[b, m, n]).permute(&[0, 2, 1])?; // [b, n, m]
    let y = upload(&s, &bh, &[b, m, n]).permute(&[0, 2, 1])?;
    let z = upload(&s, &ch, &[m, n, b]).permute(&[2, 1, 0])?; // [b, n, m], unit stride on b
    let xr = permuted(&ah, &[b, m, n], &[0, 2, 1]);
    let yr = permuted(&bh, &[b, m, n], &[0, 2, 1]);
    let zr = permuted(&ch, &[m, n, b], &[2, 1, 0]);
    let got = read(&kernels::mul(&x, &y).sync_on(&s)?);
    let want: Vec<f64> = (0..xr.len())
        .map(|i| xr[i].to_f64() * yr[i].to_f64())
        .collect();
    assert_dtype_close(&got, &want, T::ARITH_TOL, "both permuted");
    let got = read(&kernels::add(&x, &z).sync_on(&s)?);
    let want: Vec<f64> = (0..xr.len())
        .map(|i| xr[i].to_f64() + zr[i].to_f64())
        .collect();
    assert_dtype_close(&got, &want, T::ARITH_TOL, "permuted two ways");
    Ok(())
}

test_cases! {
    batched_transposed_f32 => batched_transposed_operands::<f32>(50),
    batched_transposed_bf16 => batched_transposed_operands::<bf16>(51),
}

/// Comparisons of a transposed view (a `u8` mask out), `where_` with the mask, an operand or
/// both read transposed and a broadcast column beside them, and `clamp` of a transpose.
fn transposed_compare_where<T: DType>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for &(r, c) in SIZES {
        let (a, b, colh, wh) = (
            few_values::<T>(&mut rng, r * c),
            few_values::<T>(&mut rng, r * c),
            few_values::<T>(&mut rng, c),
            few_values::<T>(&mut rng, r * c),
        );
        let x = upload(&s, &a, &[r, c]);
        let (y, col) = (upload(&s, &b, &[c, r]), upload(&s, &colh, &[c, 1]));
        let xt = x.transpose(0, 1)?; // [c, r]
        let at = permuted(&a, &[r, c], &[1, 0]);
        let what = |op: &str| format!("{op} {r}x{c}");

        let lt = kernels::lt(&xt, &y).sync_on(&s)?;
        let want: Vec<u8> = (0..r * c).map(|i| u8::from(at[i] < b[i])).collect();
        assert_exact(&read(&lt), &want, &what("xt < y"));
        let eq = kernels::eq(&col, &xt).sync_on(&s)?;
        let want: Vec<u8> = (0..r * c).map(|i| u8::from(colh[i / r] == at[i])).collect();
        assert_exact(&read(&eq), &want, &what("col == xt"));

        // The mask [r, c] read transposed, beside a transposed operand and a column.
        let m = kernels::ge(&x, &upload(&s, &wh, &[r, c])).sync_on(&s)?;
        let mh = read(&m);
        let mt = m.transpose(0, 1)?;
        let mtr = permuted(&mh, &[r, c], &[1, 0]);
        let got = kernels::where_(&mt, &xt, &col).sync_on(&s)?;
        let want: Vec<T> = (0..r * c)
            .map(|i| if mtr[i] != 0 { at[i] } else { colh[i / r] })
            .collect();
        assert_exact(&read(&got), &want, &what("where_(mt, xt, col)"));
        // A dense mask choosing between a transposed and a dense operand.
        let got = kernels::where_(&lt, &y, &xt).sync_on(&s)?;
        let want: Vec<T> = (0..r * c)
            .map(|i| if at[i] < b[i] { b[i] } else { at[i] })
            .collect();
        assert_exact(&read(&got), &want, &what("where_(lt, y, xt)"));

        let (lo, hi) = (T::from_f64(1.0), T::from_f64(2.0));
        let got = kernels::clamp(&xt, lo, hi).sync_on(&s)?;
        let want: Vec<T> = at
            .iter()
            .map(|&v| {
                if v < lo {
                    lo
                } else if v > hi {
                    hi
                } else {
                    v
                }
            })
            .collect();
        assert_exact(&read(&got), &want, &what("clamp(xt)"));
    }
    Ok(())
}

test_cases! {
    transposed_compare_f32 => transposed_compare_where::<f32>(52),
    transposed_compare_f16 => transposed_compare_where::<f16>(53),
    transposed_compare_i32 => transposed_compare_where::<i32>(54),
    transposed_compare_u8 => transposed_compare_where::<u8>(55),
}

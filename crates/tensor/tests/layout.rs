//! `transpose` and `embedding` against host-computed references.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, kernels, DType};
use cuflow_testing::{
    device::stream,
    rng::seeded_rng,
    tensor::{read, upload},
};
use rand::Rng;

fn check_transpose<T: DType>(rows: usize, cols: usize, seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let xh: Vec<T> = (0..rows * cols)
        .map(|_| T::from_f64(rng.gen_range(-100.0..100.0)))
        .collect();
    let x = upload(&s, &xh, &[rows, cols]);
    let y = kernels::transpose(&x).sync_on(&s)?;
    assert_eq!(y.shape(), &[cols, rows]);
    let got = read(&y);
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(
                got[c * rows + r],
                xh[r * cols + c],
                "{rows}x{cols} at ({r}, {c})"
            );
        }
    }
    Ok(())
}

#[test]
fn transpose_awkward_shapes() -> Result<(), DeviceError> {
    for (i, (r, c)) in [(1, 1), (1, 7), (7, 1), (33, 65), (100, 1000), (4097, 3)]
        .into_iter()
        .enumerate()
    {
        check_transpose::<f32>(r, c, i as u64)?;
    }
    check_transpose::<bf16>(45, 77, 9)?;
    check_transpose::<u8>(31, 129, 10)?;
    check_transpose::<i64>(64, 32, 11)
}

/// Matrices of more rows than 65535 tiles of 32 (the most blocks along a launch's second grid
/// dimension) hold: the tall one was refused with `InvalidLaunch` ("grid.y = 65536 exceeds
/// the device's limit"), a matrix of 6 MB. Both orientations, and a tall matrix of one column.
#[test]
fn transpose_matrices_taller_than_a_grid_column() -> Result<(), DeviceError> {
    let tall = 65_535 * 32 + 1;
    check_transpose::<u8>(tall, 3, 12)?;
    check_transpose::<u8>(3, tall, 13)?;
    check_transpose::<u8>(tall, 1, 14)
}

#[test]
fn embedding_gathers_rows_and_zeroes_unknown_ids() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(5);
    let (vocab, dim) = (50, 97);
    let table_h: Vec<f32> = (0..vocab * dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut ids_h: Vec<u32> = (0..24).map(|_| rng.gen_range(0..vocab as u32)).collect();
    ids_h[3] = vocab as u32; // out of range
    ids_h[17] = u32::MAX;
    let table = upload(&s, &table_h, &[vocab, dim]);
    let ids = upload(&s, &ids_h, &[4, 6]);
    let out = kernels::embedding(&table, &ids).sync_on(&s)?;
    assert_eq!(out.shape(), &[4, 6, dim]);
    let got = read(&out);
    for (r, id) in ids_h.iter().enumerate() {
        let row = &got[r * dim..(r + 1) * dim];
        if (*id as usize) < vocab {
            assert_eq!(
                row,
                &table_h[*id as usize * dim..(*id as usize + 1) * dim],
                "row {r}"
            );
        } else {
            assert!(
                row.iter().all(|v| *v == 0.0),
                "row {r} for id {id} must be zeros"
            );
        }
    }
    Ok(())
}

#[test]
fn layout_kernels_refuse_bad_shapes() -> Result<(), DeviceError> {
    let s = stream();
    let v = api::ones::<f32>(&[2, 3, 4]).sync_on(&s)?;
    let err = kernels::transpose(&v).sync_on(&s).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::InvalidShape {
                op: "transpose",
                ..
            }
        ),
        "{err}"
    );
    let ids = api::zeros::<u32>(&[3]).sync_on(&s)?;
    let err = kernels::embedding(&v, &ids).sync_on(&s).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::InvalidShape {
                op: "embedding",
                ..
            }
        ),
        "{err}"
    );
    Ok(())
}

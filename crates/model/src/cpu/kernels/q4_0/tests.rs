//! The four-bit products against their plain reference, bit for bit, on every kernel the CPU
//! has; the quantiser against ggml's; the products against f32's.

use super::*;
use crate::cpu::kernels::q8::tests::{methods, values};

/// ggml's `quantize_row_q4_0_ref` worked out by hand: the value of the largest magnitude maps
/// to nibble 0 (`d = v / -8`), the others truncate `x / d + 8.5` and stop at 15; the first of
/// two equal magnitudes sets the sign.
#[test]
fn blocks_quantise_as_ggml_does() {
    let mut x = [0.0f32; 32];
    x[..6].copy_from_slice(&[-8.0, 4.0, 7.0, 7.6, -0.4, 8.0]);
    x[16] = -3.0;
    let mut q = [0u8; 16];
    let d = quantize_block(&x, &mut q);
    assert_eq!(d, f16::ONE, "-8 / -8");
    let nibble = |i: usize| if i < 16 { q[i] & 0x0F } else { q[i - 16] >> 4 };
    // -8 → 0; 4 → 12; 7 → trunc(15.5) = 15; 7.6 → 16, held at 15; -0.4 → trunc(8.1) = 8;
    // 8 (as large as -8, but second) → held at 15; 0 → 8; -3 → trunc(5.5) = 5.
    let want = [0, 12, 15, 15, 8, 15, 8];
    assert_eq!((0..7).map(nibble).collect::<Vec<_>>(), want);
    assert_eq!(nibble(16), 5);
    let m = Q4Matrix::from_rows(&x, 32);
    let mut back = [0.0; 32];
    m.dequantise_row(0, &mut back);
    assert_eq!(&back[..7], &[-8.0, 4.0, 7.0, 7.0, 0.0, 7.0, 0.0]);
    assert_eq!(back[16], -3.0);
    // Any row: each value is its widened byte times its block's scale.
    let any = Q4Matrix::from_rows(&values(96, 3), 96);
    let (mut row, widened) = (vec![0.0; 96], widen(any.row(0).0));
    any.dequantise_row(0, &mut row);
    for (i, v) in row.iter().enumerate() {
        assert_eq!(*v, f32::from(widened[i]) * any.row(0).1[i / BLOCK].to_f32());
    }
    let zero = Q4Matrix::from_rows(&[0.0; 32], 32);
    assert_eq!(zero.row(0).1, &[f16::ZERO]);
    assert_eq!(m.bytes(), 18, "GGUF's block: an f16 and 16 bytes");
}

/// Every kernel this CPU has computes the reference's float bit for bit (which is `Q8_0`'s
/// reference of the widened bytes), for rows of any number of blocks, extreme nibbles too.
#[test]
fn every_kernel_gives_the_reference_bits() {
    for kb in [1, 2, 3, 4, 5, 7, 8, 9, 17, 18] {
        let k = kb * BLOCK;
        let mut w = Q4Matrix::from_rows(&values(k, kb as u32), k);
        let (nibbles, _) = w.row_mut(0);
        nibbles[0] = 0x0F;
        nibbles[k / 2 - 1] = 0xF0;
        let (wq, ws) = w.row(0);
        let mut x = Q8Rows::default();
        x.quantize(&values(k, 7 + kb as u32));
        let want = dot_reference(wq, ws, &x.q, &x.d);
        assert_eq!(want, q8::dot_reference(&widen(wq), ws, &x.q, &x.d));
        for Kernel { name, dot, .. } in kernels() {
            let got = dot((wq, ws), x.one());
            assert_eq!(got.to_bits(), want.to_bits(), "{name}, {kb} blocks");
        }
    }
    // Nibbles of 0 (-8) and of 15 (7), scale 1, against bytes of ±127 (scale 1 too): the
    // integer sums exactly.
    let values: Vec<f32> = (0..64)
        .map(|i| if i % 3 == 0 { -127.0 } else { 127.0 })
        .collect();
    let mut x = Q8Rows::default();
    x.quantize(&values);
    assert_eq!(x.d, [1.0; 2]);
    for (n, w) in [(0x00, -8), (0xFF, 7)] {
        let sum: i32 = x.q.iter().map(|&x| w * i32::from(x)).sum();
        for kernel in kernels() {
            let got = (kernel.dot)((&[n; 32], &[f16::ONE; 2]), x.one());
            assert_eq!(got, sum as f32, "{}, nibbles {n:#x}", kernel.name);
        }
    }
}

/// A token's product and a thread's share of its outputs give each output the reference's
/// bits plus the bias; products of several rows are each row's alone.
#[test]
fn shares_and_rows_give_the_reference_numbers() {
    // 3 blocks (a short group of four), 8 (whole groups), 19 (past the 16 scales read at once).
    for k in [96, 256, 608] {
        let (rows, n) = (3, 40);
        let w = Q4Matrix::from_columns(&values(k * n, 8), k);
        let x = values(rows * k, 9);
        let b = values(n, 10);
        let mut out = vec![0.0; rows * n];
        product(&mut out, &x, &w, &b, Method::Alone);
        let mut q = Q8Rows::default();
        q.quantize(&x);
        let kb = k / BLOCK;
        for r in 0..rows {
            for j in 0..n {
                let (wq, ws) = w.row(j);
                let (xq, xd) = (&q.q[r * k..(r + 1) * k], &q.d[r * kb..(r + 1) * kb]);
                let want = dot_reference(wq, ws, xq, xd) + b[j];
                assert_eq!(out[r * n + j].to_bits(), want.to_bits(), "row {r}, {j}");
            }
        }
        let mut first = Q8Rows::default();
        first.quantize(&x[..k]);
        for Kernel { name, rows, .. } in kernels() {
            let mut split = vec![0.0; n];
            rows(&mut split[..7], &first, &w, &b, 0);
            rows(&mut split[7..], &first, &w, &b, 7);
            assert_eq!(split, out[..n], "{name}: a row split in two ranges");
        }
    }
}

/// Weights in Burn's `[n_in, n_out]` layout come out as rows of outputs; the product is
/// within what four bits allow of f32's, and the product of many rows (dequantised weights
/// in f32) within float rounding of the dequantised weights' own product.
#[test]
fn products_are_close_to_f32() {
    let (k, n) = (96, 70);
    for (rows, method) in methods() {
        let (w, x, b) = (values(k * n, 4), values(rows * k, 5), values(n, 6));
        let q = Q4Matrix::from_columns(&w, k);
        let mut out = vec![0.0; rows * n];
        product(&mut out, &x, &q, &b, method);
        let mut row = vec![0.0; k];
        for j in 0..n {
            q.dequantise_row(j, &mut row);
            for r in 0..rows {
                let x = &x[r * k..(r + 1) * k];
                let exact: f32 = (0..k).map(|i| x[i] * w[i * n + j]).sum::<f32>() + b[j];
                let scale: f32 = (0..k).map(|i| (x[i] * w[i * n + j]).abs()).sum();
                let got = out[r * n + j];
                assert!((got - exact).abs() < 0.15 * scale, "{r} {j}: {got} {exact}");
                let dequantised: f32 = (0..k).map(|i| x[i] * row[i]).sum::<f32>() + b[j];
                let bound = match method {
                    Method::Alone | Method::Integer => 0.02 * scale,
                    Method::Dequantised => 1e-4 * scale,
                };
                assert!((got - dequantised).abs() < bound, "{r} {j}");
            }
        }
    }
}

/// A file's `Q4_0` bytes read into this layout are the matrix its own quantiser makes.
#[test]
fn a_files_blocks_read_as_the_quantiser_writes_them() {
    let (rows, cols) = (3, 96);
    let values = values(rows * cols, 5);
    let file: Vec<u8> = values
        .chunks_exact(BLOCK)
        .flat_map(|x| {
            let (d, q) = q4_0_block(x.try_into().unwrap());
            d.to_le_bytes().into_iter().chain(q)
        })
        .collect();
    let read = Q4Matrix::from_gguf(&file, rows, cols).unwrap();
    let made = Q4Matrix::from_rows(&values, cols);
    for j in 0..rows {
        assert_eq!(read.row(j), made.row(j));
    }
    assert!(Q4Matrix::from_gguf(&file, rows, cols + 32).is_none());
}

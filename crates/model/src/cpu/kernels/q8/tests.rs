//! The int8 products against their plain reference, bit for bit, on every kernel the CPU has.

use super::*;
use crate::cpu::kernels::blocks::Method;

/// The activations' quantiser, compiled for the vector width, gives the bytes and scales
/// of the plain one (libm's `round`: ties away from zero), ties included.
#[test]
fn vector_quantiser_rounds_as_the_plain_one() {
    // Block 0 has scale 1 (max 127), so ±2.5 and ±3.5 are ties; the rest are any values.
    let mut x: Vec<f32> = (0..BLOCK).map(|i| i as f32 - 15.5).collect();
    x[0] = 127.0;
    x[1..5].copy_from_slice(&[2.5, -2.5, 3.5, -3.5]);
    x.extend(values(5 * BLOCK, 3));
    let mut rows = Q8Rows::default();
    rows.quantize(&x);
    let mut q = vec![0; x.len()];
    let d: Vec<f32> = x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .map(|(x, q)| quantize_block(x, q))
        .collect();
    assert_eq!(&rows.q[1..5], &[3, -3, 4, -4]);
    assert_eq!((rows.q, rows.d), (q, d));
}

/// The products' methods with a number of rows each takes: a few rows alone, many in f32 and,
/// where the CPU runs it, many in integers.
pub(in crate::cpu::kernels) fn methods() -> Vec<(usize, Method)> {
    let mut methods = vec![(2, Method::Alone), (GEMM_ROWS + 3, Method::Dequantised)];
    match crate::cpu::kernels::prefill::runs() {
        true => methods.push((GEMM_ROWS + 3, Method::Integer)),
        false => eprintln!("skipped: a prompt's integer product (this CPU lacks AVX-512 VNNI)"),
    }
    methods
}

/// Values in -2.5..2.5 from `seed`, the same on every run.
pub(in crate::cpu::kernels) fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i * 7919 + seed * 104729) % 251) as f32 / 50.0 - 2.5)
        .collect()
}

/// The quantiser rounds as ggml's: the largest value maps to ±127, the scale is its f16.
#[test]
fn blocks_quantise_as_ggml_does() {
    let mut x = values(32, 1);
    x[5] = -3.0;
    let m = Q8Matrix::from_rows(&x, 32);
    let (q, d) = m.row(0);
    assert_eq!(q[5], -127);
    assert_eq!(d[0], f16::from_f32(3.0 / 127.0));
    let id = 127.0 / 3.0;
    for (q, v) in q.iter().zip(&x) {
        assert_eq!(*q, (v * id).round() as i8);
    }
    let zero = Q8Matrix::from_rows(&[0.0; 32], 32);
    assert!(zero.row(0).1.iter().all(|d| *d == f16::ZERO));
}

/// Every product `rows_times` gives (several activation rows, with a bias) and a row's
/// outputs split in two ranges (`row_range`, as threads take them) are bit for bit the
/// reference's, with enough outputs that each form asks ahead for later weight rows; the
/// integer sums are the plain ones: a product of blocks of scale 1 is `Σ q_w q_x`.
#[test]
fn the_kernel_computes_the_reference_numbers() {
    let (rows, k, n) = (3, 160, 60);
    assert!(
        prefetch::rows_ahead(k) + 5 < n,
        "the ranges reach the rows asked ahead"
    );
    let w = Q8Matrix::from_columns(&values(k * n, 2), k);
    let mut x = Q8Rows::default();
    x.quantize(&values(rows * k, 3));
    let b = values(n, 4);
    let mut out = vec![0.0; rows * n];
    rows_times(&mut out, &x, &w, &b);
    let kb = k / BLOCK;
    for r in 0..rows {
        for j in 0..n {
            let (wq, ws) = w.row(j);
            let (xq, xd) = (&x.q[r * k..(r + 1) * k], &x.d[r * kb..(r + 1) * kb]);
            let want = dot_reference(wq, ws, xq, xd) + b[j];
            assert_eq!(
                out[r * n + j].to_bits(),
                want.to_bits(),
                "row {r}, output {j}"
            );
        }
    }
    let mut first = Q8Rows::default();
    first.quantize(&values(rows * k, 3)[..k]);
    let mut split = vec![0.0; n];
    row_range(&mut split[..5], &first, &w, &b, 0);
    row_range(&mut split[5..], &first, &w, &b, 5);
    assert_eq!(split, out[..n], "a row split in two ranges");
    // Bytes of ±127 and scale 1: the integer sum exactly.
    let wq = vec![127i8; 64];
    let xq: Vec<i8> = (0..64)
        .map(|i| if i % 3 == 0 { -127 } else { 127 })
        .collect();
    let sum: i32 = wq.iter().zip(&xq).map(|(&a, &b)| a as i32 * b as i32).sum();
    assert_eq!(
        (kernel().dot)(&wq, &[f16::ONE; 2], &xq, &[1.0; 2]),
        sum as f32
    );
}

/// Every kernel this CPU has computes the reference's float bit for bit, for rows of any
/// number of blocks (each kernel's tails: 1 to 3 blocks past its groups of 4, 8 or 16),
/// and with the extreme bytes GGUF files may hold (-128 in weights).
#[test]
fn every_kernel_gives_the_reference_bits() {
    for kb in [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 18, 19, 33, 48] {
        let k = kb * BLOCK;
        let mut w = Q8Matrix::from_rows(&values(k, kb as u32), k);
        let (q, _) = w.row_mut(0);
        q[0] = -128;
        q[k - 1] = -128;
        let (wq, ws) = w.row(0);
        let mut x = Q8Rows::default();
        x.quantize(&values(k, 7 + kb as u32));
        let want = dot_reference(wq, ws, &x.q, &x.d);
        for Kernel { name, dot, .. } in kernels() {
            let got = dot(wq, ws, &x.q, &x.d);
            assert_eq!(got.to_bits(), want.to_bits(), "{name}, {kb} blocks");
        }
    }
}

/// Every kernel's share of rows (what a decoding thread runs, the product inlined into its
/// loop) gives each output its own product's bits plus the bias, from any first row.
#[test]
fn every_kernels_share_of_rows_gives_its_products() {
    let (k, n) = (96, 40);
    let w = Q8Matrix::from_columns(&values(k * n, 8), k);
    let mut x = Q8Rows::default();
    x.quantize(&values(k, 9));
    let b = values(n, 10);
    for Kernel { name, dot, rows } in kernels() {
        let mut out = vec![0.0; n];
        rows(&mut out[..7], &x, &w, &b, 0);
        rows(&mut out[7..], &x, &w, &b, 7);
        for (j, got) in out.iter().enumerate() {
            let (wq, ws) = w.row(j);
            let want = dot(wq, ws, &x.q, &x.d) + b[j];
            assert_eq!(got.to_bits(), want.to_bits(), "{name}, output {j}");
        }
    }
}

/// Weights in Burn's `[n_in, n_out]` layout come out as rows of outputs, and the product is
/// close to f32's (within what 8 bits of each side allow) in int8 and in the dequantised
/// f32 product many rows take.
#[test]
fn products_are_close_to_f32() {
    let (k, n) = (96, 70);
    for (rows, method) in methods() {
        let (w, x, b) = (values(k * n, 4), values(rows * k, 5), values(n, 6));
        let q = Q8Matrix::from_columns(&w, k);
        let mut out = vec![0.0; rows * n];
        if !(method == Method::Integer
            && crate::cpu::kernels::prefill::product(&mut out, &x, &q, &b))
        {
            product(&mut out, &x, &q, &b, method == Method::Alone);
        }
        for r in 0..rows {
            for j in 0..n {
                let exact: f32 = (0..k).map(|i| x[r * k + i] * w[i * n + j]).sum::<f32>() + b[j];
                let scale: f32 = (0..k).map(|i| (x[r * k + i] * w[i * n + j]).abs()).sum();
                assert!((out[r * n + j] - exact).abs() < 0.02 * scale, "{r} {j}");
            }
        }
    }
}

/// A file's `Q8_0` bytes (as ggml's quantiser writes them) read into this layout are the
/// matrix this layout's own quantiser makes; bytes that do not fill the rows are refused.
#[test]
fn a_files_blocks_read_as_the_quantiser_writes_them() {
    let (rows, cols) = (3, 96);
    let values = values(rows * cols, 4);
    let file: Vec<u8> = values
        .chunks_exact(BLOCK)
        .flat_map(|x| {
            let (d, q) = q8_0_block(x.try_into().unwrap());
            d.to_le_bytes().into_iter().chain(q.map(|q| q as u8))
        })
        .collect();
    let read = Q8Matrix::from_gguf(&file, rows, cols).unwrap();
    let made = Q8Matrix::from_rows(&values, cols);
    for j in 0..rows {
        assert_eq!(read.row(j), made.row(j));
    }
    assert!(Q8Matrix::from_gguf(&file[1..], rows, cols).is_none());
}

//! The five-bit products against their plain reference, bit for bit, on every kernel the CPU
//! has; the quantiser against ggml's; the products against f32's.

use super::*;
use crate::cpu::kernels::q8::tests::{methods, values};

/// ggml's `quantize_row_q5_0_ref` worked out by hand: the value of the largest magnitude maps
/// to 0 (`d = v / -16`), the others truncate `x / d + 16.5` and stop at 31; the fifth bit of
/// value `i` is bit `i` of the block's word.
#[test]
fn blocks_quantise_as_ggml_does() {
    let mut x = [0.0f32; 32];
    x[..6].copy_from_slice(&[-16.0, 4.0, 15.0, 15.6, -0.4, 16.0]);
    x[16] = -3.0;
    x[31] = 7.0;
    let mut q = [0u8; 16];
    let (d, high) = quantize_block(&x, &mut q);
    assert_eq!(d, f16::ONE, "-16 / -16");
    let value = |i: usize| {
        let nibble = if i < 16 { q[i] & 0x0F } else { q[i - 16] >> 4 };
        nibble | (((high >> i) & 1) << 4) as u8
    };
    // -16 → 0; 4 → 20; 15 → trunc(31.5) = 31; 15.6 → 32, held at 31; -0.4 → trunc(16.1) =
    // 16; 16 (as large as -16, but second) → held at 31; 0 → 16; -3 → 13; 7 → 23.
    let want = [0, 20, 31, 31, 16, 31, 16];
    assert_eq!((0..7).map(value).collect::<Vec<_>>(), want);
    assert_eq!((value(16), value(31)), (13, 23));
    assert_eq!(high & 1, 0, "value 0's fifth bit");
    assert_ne!(high & (1 << 31), 0, "value 31's fifth bit (23 = 0b10111)");
    let m = Q5Matrix::from_rows(&x, 32);
    let mut back = [0.0; 32];
    m.dequantise_row(0, &mut back);
    assert_eq!(&back[..7], &[-16.0, 4.0, 15.0, 15.0, 0.0, 15.0, 0.0]);
    assert_eq!((back[16], back[31]), (-3.0, 7.0));
    assert_eq!(
        m.bytes(),
        22,
        "GGUF's block: an f16, a word of high bits, 16 bytes"
    );
    let zero = Q5Matrix::from_rows(&[0.0; 32], 32);
    assert_eq!(zero.row(0).scales, &[f16::ZERO]);
}

/// Every kernel this CPU has computes the reference's float bit for bit (which is `Q8_0`'s
/// reference of the widened bytes), for rows of any number of blocks, extreme values too.
#[test]
fn every_kernel_gives_the_reference_bits() {
    for kb in [1, 2, 3, 4, 5, 7, 8, 9, 17, 18] {
        let k = kb * BLOCK;
        let mut w = Q5Matrix::from_rows(&values(k, kb as u32), k);
        let (nibbles, high, _) = w.row_mut(0);
        nibbles[0] = 0x0F;
        nibbles[k / 2 - 1] = 0xF0;
        high[0] = [0xFF; 4];
        high[kb - 1] = [0; 4];
        let mut x = Q8Rows::default();
        x.quantize(&values(k, 7 + kb as u32));
        let row = w.row(0);
        let want = dot_reference(row, &x.q, &x.d);
        let mut widened = vec![0i8; k];
        for (b, out) in widened.chunks_exact_mut(BLOCK).enumerate() {
            widen_block(row, b, out.try_into().expect("a block"));
        }
        assert_eq!(want, q8::dot_reference(&widened, row.scales, &x.q, &x.d));
        for blocks::Kernel { name, dot, .. } in kernels() {
            let got = dot(row, x.one());
            assert_eq!(got.to_bits(), want.to_bits(), "{name}, {kb} blocks");
        }
    }
    // Values 0 (-16) and 31 (15), scale 1, against bytes of ±127 (scale 1 too): the integer
    // sums exactly.
    let values: Vec<f32> = (0..64)
        .map(|i| if i % 3 == 0 { -127.0 } else { 127.0 })
        .collect();
    let mut x = Q8Rows::default();
    x.quantize(&values);
    assert_eq!(x.d, [1.0; 2]);
    for (n, high, w) in [(0x00, 0, -16), (0xFF, 0xFF, 15)] {
        let sum: i32 = x.q.iter().map(|&x| w * i32::from(x)).sum();
        let row = Row {
            nibbles: &[n; 32],
            high: &[[high; 4]; 2],
            scales: &[f16::ONE; 2],
        };
        for kernel in kernels() {
            let got = (kernel.dot)(row, x.one());
            assert_eq!(got, sum as f32, "{}, value {w}", kernel.name);
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
        let w = Q5Matrix::from_columns(&values(k * n, 8), k);
        let x = values(rows * k, 9);
        let b = values(n, 10);
        let mut out = vec![0.0; rows * n];
        product(&mut out, &x, &w, &b, Method::Alone);
        let mut q = Q8Rows::default();
        q.quantize(&x);
        let kb = k / BLOCK;
        for r in 0..rows {
            for j in 0..n {
                let (xq, xd) = (&q.q[r * k..(r + 1) * k], &q.d[r * kb..(r + 1) * kb]);
                let want = dot_reference(w.row(j), xq, xd) + b[j];
                assert_eq!(out[r * n + j].to_bits(), want.to_bits(), "row {r}, {j}");
            }
        }
        let mut first = Q8Rows::default();
        first.quantize(&x[..k]);
        for blocks::Kernel { name, rows, .. } in kernels() {
            let mut split = vec![0.0; n];
            rows(&mut split[..7], &first, &w, &b, 0);
            rows(&mut split[7..], &first, &w, &b, 7);
            assert_eq!(split, out[..n], "{name}: a row split in two ranges");
        }
    }
}

/// Weights in Burn's `[n_in, n_out]` layout come out as rows of outputs; the product is
/// within what five bits allow of f32's (half `Q4_0`'s bound), and the product of many rows
/// (dequantised weights in f32) within float rounding of the dequantised weights' own.
#[test]
fn products_are_close_to_f32() {
    let (k, n) = (96, 70);
    for (rows, method) in methods() {
        let (w, x, b) = (values(k * n, 4), values(rows * k, 5), values(n, 6));
        let q = Q5Matrix::from_columns(&w, k);
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
                assert!(
                    (got - exact).abs() < 0.075 * scale,
                    "{r} {j}: {got} {exact}"
                );
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

/// The kernels the tests of both block types go through are every one this CPU can run: a CPU
/// with AVX-512 VNNI (and a build with the `avx512` feature) has that kernel, one with AVX2 the
/// AVX2 kernel, every CPU the reference.
#[cfg(target_arch = "x86_64")]
#[test]
fn every_kernel_the_cpu_runs_is_listed() {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let vnni = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
    let mut want = Vec::new();
    if cfg!(feature = "avx512") && avx2 && vnni {
        want.push("avx512-vnni");
    }
    if avx2 {
        want.push("avx2");
    }
    want.push("reference");
    let q4: Vec<_> = crate::cpu::kernels::q4_0::kernels()
        .iter()
        .map(|k| k.name)
        .collect();
    let q5: Vec<_> = kernels().iter().map(|k| k.name).collect();
    let bitalg = want[0] == "avx512-vnni" && has!("avx512bitalg");
    let want5 = [&["avx512-vnni-bitalg"][..bitalg as usize], &want[..]].concat();
    assert_eq!((q4, q5), (want, want5));
}

/// A file's `Q5_0` bytes read into this layout are the matrix its own quantiser makes.
#[test]
fn a_files_blocks_read_as_the_quantiser_writes_them() {
    let (rows, cols) = (3, 96);
    let values = values(rows * cols, 6);
    let file: Vec<u8> = values
        .chunks_exact(BLOCK)
        .flat_map(|x| {
            let (d, high, q) = q5_0_block(x.try_into().unwrap());
            d.to_le_bytes()
                .into_iter()
                .chain(high.to_le_bytes())
                .chain(q)
        })
        .collect();
    let read = Q5Matrix::from_gguf(&file, rows, cols).unwrap();
    let made = Q5Matrix::from_rows(&values, cols);
    for j in 0..rows {
        let (a, b) = (read.row(j), made.row(j));
        assert_eq!((a.nibbles, a.high, a.scales), (b.nibbles, b.high, b.scales));
    }
    assert!(Q5Matrix::from_gguf(&file[..file.len() - 1], rows, cols).is_none());
}

//! A prompt's integer product: every type's bytes and scales are its values, the vector tile
//! kernel gives the reference's numbers bit for bit, and the product is near the f32 product
//! of the dequantised weights.

use super::*;
use crate::cpu::kernels::k_quants::q4_1::{Q41, Q51};
use crate::cpu::kernels::k_quants::q4_k::{Q4K, Q5K};
use crate::cpu::kernels::k_quants::q6_k::Q6K;
use crate::cpu::kernels::k_quants::tests::matrix;
use crate::cpu::kernels::q4_0::Q4Matrix;
use crate::cpu::kernels::q5_0::Q5Matrix;
use crate::cpu::kernels::q8::Q8Matrix;
use crate::cpu::kernels::q8::tests::values;

/// Row `j` of a matrix in f32.
type Dequantise<'a> = &'a dyn Fn(usize, &mut [f32]);

/// Runs `check` on a matrix of every type the integer product reads, with its name and its
/// rows' values: `n` rows of `k` (`k` a multiple of 256 for the k-quants).
fn each_type(n: usize, k: usize, check: &dyn Fn(&str, &dyn Any, Dequantise<'_>)) {
    let w = values(n * k, 3).iter().map(|v| v / 4.0).collect::<Vec<_>>();
    let q8 = Q8Matrix::from_rows(&w, k);
    check("q8_0", &q8, &|j, out| q8.dequantise_row(j, out));
    let q4 = Q4Matrix::from_rows(&w, k);
    check("q4_0", &q4, &|j, out| q4.dequantise_row(j, out));
    let q5 = Q5Matrix::from_rows(&w, k);
    check("q5_0", &q5, &|j, out| q5.dequantise_row(j, out));
    let q41 = matrix::<Q41>(n, k, 1, 0.02);
    check("q4_1", &q41, &|j, out| q41.dequantise_row(j, out));
    let q51 = matrix::<Q51>(n, k, 2, 0.02);
    check("q5_1", &q51, &|j, out| q51.dequantise_row(j, out));
    let q4k = matrix::<Q4K>(n, k, 3, 0.002);
    check("q4_k", &q4k, &|j, out| q4k.dequantise_row(j, out));
    let q5k = matrix::<Q5K>(n, k, 4, 0.002);
    check("q5_k", &q5k, &|j, out| q5k.dequantise_row(j, out));
    let q6k = matrix::<Q6K>(n, k, 5, 0.0005);
    check("q6_k", &q6k, &|j, out| q6k.dequantise_row(j, out));
}

use std::any::Any;

/// `f` for the matrix behind `any`, whichever type it is.
macro_rules! with_type {
    ($any:expr, $f:ident $(, $arg:expr)*) => {{
        let any: &dyn Any = $any;
        if let Some(w) = any.downcast_ref::<Q8Matrix>() {
            $f(w $(, $arg)*)
        } else if let Some(w) = any.downcast_ref::<Q4Matrix>() {
            $f(w $(, $arg)*)
        } else if let Some(w) = any.downcast_ref::<Q5Matrix>() {
            $f(w $(, $arg)*)
        } else if let Some(w) = any.downcast_ref::<crate::cpu::kernels::k_quants::KMatrix<Q41>>() {
            $f(w $(, $arg)*)
        } else if let Some(w) = any.downcast_ref::<crate::cpu::kernels::k_quants::KMatrix<Q51>>() {
            $f(w $(, $arg)*)
        } else if let Some(w) = any.downcast_ref::<crate::cpu::kernels::k_quants::KMatrix<Q4K>>() {
            $f(w $(, $arg)*)
        } else if let Some(w) = any.downcast_ref::<crate::cpu::kernels::k_quants::KMatrix<Q5K>>() {
            $f(w $(, $arg)*)
        } else if let Some(w) = any.downcast_ref::<crate::cpu::kernels::k_quants::KMatrix<Q6K>>() {
            $f(w $(, $arg)*)
        } else {
            unreachable!("a type each_type makes")
        }
    }};
}

/// Row `j`'s `s · (u − Z) + m`, as [`Unpack`] gives them.
fn unpacked<M: Unpack>(w: &M, j: usize) -> Vec<f32> {
    let (_, k) = w.dims();
    let groups = k / M::GROUP;
    let (mut u, mut s, mut m) = (vec![0; k], vec![0.0; groups], vec![0.0; groups]);
    w.unpack_row(j, &mut u, &mut s, &mut m);
    (0..k)
        .map(|i| {
            let g = i / M::GROUP;
            let q = (i32::from(u[i]) - M::ZERO) as f32;
            match M::MINIMUMS {
                true => s[g] * q + m[g],
                false => s[g] * q,
            }
        })
        .collect()
}

/// Every type's bytes, scales and minimums give its dequantised values exactly (the same
/// float operations as ggml's `dequantize_row_*`).
#[test]
fn every_types_bytes_are_its_values() {
    let (n, k) = (5, 512);
    each_type(n, k, &|name, w, dequantise| {
        let mut want = vec![0.0; k];
        for j in 0..n {
            dequantise(j, &mut want);
            let got = with_type!(w, unpacked, j);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{name} row {j} value {i}: {g} vs {w}"
                );
            }
        }
    });
}

/// `out [rows, n]` of `x` times `w` by the integer product with the tile kernels `tiles`.
fn product_by<M: Unpack>(
    w: &M,
    x: &[f32],
    b: &[f32],
    tiles: (TileFn<ROWS>, TileFn<1>),
) -> Vec<f32> {
    let (n, k) = w.dims();
    let mut out = vec![f32::NAN; x.len() / k * n];
    product_with(&mut out, x, w, b, tiles);
    out
}

/// Every vector tile kernel this CPU has gives the reference's floats bit for bit, for every
/// type it takes: rows of whole tiles and rows past them (an odd count: AVX2's pairs and its
/// last row alone), outputs past the last whole panel, a bias. A kernel the CPU lacks is
/// named as skipped.
#[test]
fn the_vector_kernels_compute_the_reference_numbers() {
    #[cfg(target_arch = "x86_64")]
    {
        let (vnni, avx2) = vector_sets();
        for (has, name) in [(vnni, "AVX-512 VNNI"), (avx2, "AVX2")] {
            if !has {
                eprintln!("skipped: the {name} tile kernel (this CPU or build lacks it)");
            }
        }
    }
    let (n, k, rows) = (37, 512, 2 * ROWS + 3);
    let x = values(rows * k, 7);
    let b: Vec<f32> = (0..n).map(|j| j as f32 / 8.0).collect();
    each_type(n, k, &|name, w, _| {
        fn each<M: Unpack>(w: &M, x: &[f32], b: &[f32]) -> Vec<(&'static str, Vec<f32>)> {
            let reference = (
                reference::<M, ROWS> as TileFn<ROWS>,
                reference::<M, 1> as TileFn<1>,
            );
            let mut all = vec![("reference", product_by(w, x, b, reference))];
            for (kernel, tiles) in vector_kernels::<M>() {
                all.push((kernel, product_by(w, x, b, tiles)));
            }
            all
        }
        let outputs = with_type!(w, each, &x, &b);
        let reference = &outputs[0].1;
        for (kernel, vector) in &outputs[1..] {
            for (i, (v, r)) in vector.iter().zip(reference).enumerate() {
                assert_eq!(v.to_bits(), r.to_bits(), "{name} {kernel} {i}: {v} vs {r}");
            }
        }
    });
}

/// AVX2's kernel takes every type but `Q8_0` (its bytes reach 255, past what 16-bit pairs
/// hold), AVX-512 VNNI's every type; a CPU with neither multiplies a prompt in f32.
#[test]
#[cfg(target_arch = "x86_64")]
fn each_kernel_takes_the_types_it_is_exact_for() {
    let names = |v: Vec<(&'static str, _)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    let (vnni, avx2) = vector_sets();
    let q8 = names(vector_kernels::<Q8Matrix>());
    let q6 = names(vector_kernels::<crate::cpu::kernels::k_quants::KMatrix<Q6K>>());
    assert_eq!(q8.contains(&"avx512-vnni"), vnni);
    assert!(!q8.contains(&"avx2"));
    assert_eq!(q6.contains(&"avx2"), avx2);
    assert_eq!(runs(), vnni || avx2);
}

/// `Q8_0`'s extreme bytes, −128 and 127 (a file's blocks may hold −128), against activations of
/// ±127, the largest products a kernel sums: every vector kernel gives the reference's floats
/// bit for bit, and they are the exact sums' (an overflowed sum would be off by thousands).
#[test]
fn q8_0s_extreme_bytes_are_exact_on_every_kernel() {
    let (n, k, rows) = (LANES + 3, 64, ROWS + 1);
    let mut w = Q8Matrix::zeros(n, k);
    let byte = |j: usize, i: usize| {
        if (i + j).is_multiple_of(3) {
            127i8
        } else {
            i8::MIN
        }
    };
    for j in 0..n {
        let (q, d) = w.row_mut(j);
        q.iter_mut().enumerate().for_each(|(i, q)| *q = byte(j, i));
        d.fill(half::f16::from_f32(0.5));
    }
    let sign = |r: usize, i: usize| if (r + i).is_multiple_of(5) { 1.0 } else { -1.0 };
    let x: Vec<f32> = (0..rows * k).map(|at| sign(at / k, at % k)).collect();
    let tiles = (
        reference::<Q8Matrix, ROWS> as TileFn<ROWS>,
        reference::<Q8Matrix, 1> as TileFn<1>,
    );
    let reference = product_by(&w, &x, &[], tiles);
    for r in 0..rows {
        for j in 0..n {
            // Each activation is ±127 of a scale 1/127; each weight byte of a scale 0.5.
            let sum: i32 = (0..k)
                .map(|i| i32::from(byte(j, i)) * 127 * sign(r, i) as i32)
                .sum();
            let exact = f64::from(sum) * 0.5 / 127.0;
            let got = f64::from(reference[r * n + j]);
            assert!(
                (got - exact).abs() <= 1e-5 * exact.abs().max(1.0),
                "{got} vs {exact}"
            );
        }
    }
    for (kernel, tiles) in vector_kernels::<Q8Matrix>() {
        let vector = product_by(&w, &x, &[], tiles);
        for (i, (v, r)) in vector.iter().zip(&reference).enumerate() {
            assert_eq!(v.to_bits(), r.to_bits(), "{kernel} {i}: {v} vs {r}");
        }
    }
}

/// The integer product is within what quantising the activations to 8 bits allows of the f32
/// product of the dequantised weights, for every type (the vector kernel where the CPU has
/// it, else the reference), and its integer sums are exact: a zero activation row gives the
/// bias.
#[test]
fn products_are_near_the_dequantised_f32_product() {
    let (n, k, rows) = (21, 256, ROWS + 2);
    let mut x = values(rows * k, 9);
    x[..k].fill(0.0);
    let b: Vec<f32> = (0..n).map(|j| 1.0 - j as f32 / 16.0).collect();
    each_type(n, k, &|name, w, dequantise| {
        fn integer<M: Unpack>(w: &M, x: &[f32], b: &[f32]) -> Vec<f32> {
            let reference = (
                reference::<M, ROWS> as TileFn<ROWS>,
                reference::<M, 1> as TileFn<1>,
            );
            product_by(w, x, b, kernels::<M>().unwrap_or(reference))
        }
        let got = with_type!(w, integer, &x, &b);
        let mut row = vec![0.0; k];
        for j in 0..n {
            dequantise(j, &mut row);
            assert_eq!(got[j], b[j], "{name}: a zero row gives the bias");
            for r in 1..rows {
                let x = &x[r * k..(r + 1) * k];
                let exact: f32 = x.iter().zip(&row).map(|(x, w)| x * w).sum::<f32>() + b[j];
                let scale: f32 = x.iter().zip(&row).map(|(x, w)| (x * w).abs()).sum();
                let g = got[r * n + j];
                assert!(
                    (g - exact).abs() <= 0.01 * scale,
                    "{name} {r} {j}: {g} vs {exact}"
                );
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
/// The vector interleave puts every byte where the plain one does, for rows of whole 64-byte
/// columns and rows with a part column after them.
#[test]
fn the_vector_interleave_is_the_plain_one() {
    if !vector_sets().0 {
        eprintln!("skipped: the AVX-512 interleave (this CPU or build lacks it)");
        return;
    }
    for k in [64, 96, 576, 2048] {
        let rows: Vec<u8> = (0..LANES * k).map(|i| (i * 31 % 251) as u8).collect();
        let (mut plain, mut vector) = (vec![0; LANES * k], vec![0; LANES * k]);
        interleave_words(&rows, k, &mut plain, 0);
        let done = avx512::interleave(&rows, k, &mut vector);
        assert_eq!(done, k / 64 * 16);
        interleave_words(&rows, k, &mut vector, done);
        assert_eq!(plain, vector, "k = {k}");
    }
}

//! The k-quants' values as ggml's, their products against their plain reference bit for bit on
//! every kernel the CPU has, and against the f64 product of the dequantised values.

use half::f16;

use super::q4_1::{Q41, Q51};
use super::q4_k::{self, Q4K, Q4KMatrix, Q5K};
use super::q6_k::{self, Q6K, Q6KMatrix};
use super::{KMatrix, KType, SUPER};
use crate::cpu::kernels::blocks::{self, Method};
use crate::cpu::kernels::q8::tests::values;
use crate::cpu::kernels::q8::{GEMM_ROWS, Q8Rows};

/// Bytes from `seed`, the same on every run.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

/// `rows` rows of `cols` of random super-blocks of `T`, their f16 scales set to `d` (and
/// `Q4_K`'s `dmin` to `d / 2`) so that every value is finite.
pub(in crate::cpu::kernels) fn matrix<T: KType>(
    rows: usize,
    cols: usize,
    seed: u64,
    d: f32,
) -> KMatrix<T> {
    let mut data = bytes(rows * KMatrix::<T>::stride(cols), seed);
    for block in data.chunks_exact_mut(T::BYTES) {
        let mut put =
            |at: usize, v: f32| block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        match T::BYTES {
            // d and dmin (the k-quants with minimums), or d and m (`Q4_1`, `Q5_1`).
            144 | 176 | 20 | 24 => {
                put(0, d);
                put(2, d / 2.0);
            }
            _ => put(208, d),
        }
    }
    KMatrix::from_bytes(data.into(), rows, cols).expect("whole super-blocks")
}

/// ggml's `dequantize_row_q4_K` worked out by hand: group 0's scale 3 and minimum 1 (bytes 0
/// and 4), group 4's 50 and 21 (their low four bits in byte 8, their top two in bytes 0 and 4);
/// group 0 reads low nibbles of bytes 16.., group 1 their high nibbles, group 4 bytes 80...
#[test]
fn q4_k_values_are_ggmls() {
    let mut b = vec![0u8; 144];
    b[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
    b[4] = 3 | (50 >> 4) << 6; // group 0's scale, the top bits of group 4's
    b[8] = 1 | (21 >> 4) << 6; // group 0's minimum, the top bits of group 4's
    b[9] = 1; // group 1's minimum
    b[12] = (50 & 0x0F) | (21 & 0x0F) << 4;
    b[16] = 0x74; // group 0 value 0: 4; group 1 value 0: 7
    b[16 + 64] = 0x0A; // group 4 value 0: 10
    let mut v = [0.0; SUPER];
    Q4K::dequantise(&b, &mut v);
    assert_eq!(v[0], 0.25 * 3.0 * 4.0 - 2.0 * 1.0);
    assert_eq!(v[32], -2.0, "group 1: scale 0, minimum 1 · 2");
    assert_eq!(v[128], 0.25 * 50.0 * 10.0 - 2.0 * 21.0);
    assert_eq!(q4_k::scales(&b[4..16]).0[4], 50);
}

/// ggml's `dequantize_row_q5_K`: `Q4_K`'s values with bit `g` of byte `i` of the 32 bytes
/// after the scales as value `i`'s fifth bit in group `g` (the nibbles after those bytes).
#[test]
fn q5_k_values_are_q4_ks_with_fifth_bits() {
    let mut b = vec![0u8; 176];
    b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    b[4] = 2; // group 0's scale
    b[5] = 3; // group 1's scale
    b[8] = 1; // group 0's minimum
    b[16] = 0b0000_0011; // value 0's fifth bits in groups 0 and 1
    b[48] = 0x57; // value 0: nibble 7 in group 0, 5 in group 1
    let mut v = [0.0; SUPER];
    Q5K::dequantise(&b, &mut v);
    assert_eq!(v[0], 0.5 * 2.0 * (7.0 + 16.0) - 1.0);
    assert_eq!(v[32], 0.5 * 3.0 * (5.0 + 16.0));
    assert_eq!(v[1], -1.0, "q 0, less group 0's minimum");
}

/// ggml's `dequantize_row_q4_1` and `_q5_1`: `d · q + m`, value `i` the low nibble of byte `i`,
/// value `i + 16` its high nibble, `Q5_1`'s fifth bit `i` of the word after `m`.
#[test]
fn q4_1_and_q5_1_values_are_ggmls() {
    let mut b = vec![0u8; 24];
    b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(-3.0).to_le_bytes());
    b[4] = 0x96; // Q4_1: value 0 6, value 16 9
    let mut v = [0.0; 32];
    Q41::dequantise(&b[..20], &mut v);
    assert_eq!(
        (v[0], v[16], v[1]),
        (0.5 * 6.0 - 3.0, 0.5 * 9.0 - 3.0, -3.0)
    );
    b[4..8].copy_from_slice(&(1u32 | 1 << 16).to_le_bytes()); // fifth bits of values 0, 16
    b[8] = 0x96;
    Q51::dequantise(&b, &mut v);
    assert_eq!(
        (v[0], v[16], v[1]),
        (0.5 * 22.0 - 3.0, 0.5 * 25.0 - 3.0, -3.0)
    );
}

/// ggml's `dequantize_row_q6_K` worked out by hand: value 0 (low nibble of byte 0, bits 0–1 of
/// byte 128, scale 0), value 32 (byte 32's low nibble, bits 2–3 of byte 128, scale 2), value 64
/// (byte 0's high nibble, bits 4–5, scale 4).
#[test]
fn q6_k_values_are_ggmls() {
    let mut b = vec![0u8; 210];
    b[208..].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[192] = 3;
    b[194] = (-2i8) as u8;
    b[196] = 5;
    b[0] = 0x25; // value 0: low 5; value 64: low 2
    b[32] = 0x01; // value 32: low 1
    b[128] = 0b0001_1011; // value 0: high 3; value 32: high 2; value 64: high 1
    let mut v = [0.0; SUPER];
    Q6K::dequantise(&b, &mut v);
    assert_eq!(v[0], 0.5 * 3.0 * ((5 | 3 << 4) - 32) as f32);
    assert_eq!(v[32], 0.5 * -2.0 * ((1 | 2 << 4) - 32) as f32);
    assert_eq!(v[64], 0.5 * 5.0 * ((2 | 1 << 4) - 32) as f32);
    assert_eq!(
        v[1],
        0.5 * 3.0 * -32.0,
        "value 1: q 0, so −32 times scale 0's 3"
    );
}

/// Bytes of a file's tensor that do not fill its rows are refused.
#[test]
fn a_tensor_of_the_wrong_length_is_refused() {
    let zeros = |n: usize| -> std::sync::Arc<[u8]> { vec![0; n].into() };
    assert!(Q4KMatrix::from_bytes(zeros(144), 1, 256).is_some());
    assert!(Q4KMatrix::from_bytes(zeros(143), 1, 256).is_none());
    assert!(Q6KMatrix::from_bytes(zeros(210), 1, 255).is_none());
    assert!(Q6KMatrix::from_bytes(zeros(420), 2, 256).is_some());
}

/// Every kernel's row product is the reference's float bit for bit, and the reference is the
/// f64 product of the dequantised weights and activations within float rounding.
fn kernels_agree<T: KType>(kernels: Vec<blocks::Kernel<KMatrix<T>>>, extreme: impl Fn(&mut [u8])) {
    // Rows of whole super-blocks, and, for the types of blocks of 32, counts of blocks that
    // leave a part of eight (the kernels take eight blocks' scales at a time) or a lone block.
    let lengths: &[usize] = match T::VALUES {
        SUPER => &[SUPER, 2 * SUPER, 3 * SUPER, 5 * SUPER],
        _ => &[32, 96, 288, 576, 608, 1024],
    };
    for &k in lengths {
        for (seed, d) in [(1, 0.01), (2, 1.5), (3, 1e-3)] {
            let mut w = matrix::<T>(1, k, seed, d);
            if seed == 3 {
                let mut data = w.data.to_vec();
                extreme(&mut data[..T::BYTES]);
                w = KMatrix::from_bytes(data.into(), 1, k).expect("the same length");
            }
            let mut values = values(k, 11 + seed as u32);
            (values[0], values[k - 1]) = (10.0, -10.0); // bytes 127 and -127
            let mut x = Q8Rows::default();
            x.quantize(&values);
            assert_eq!((x.q[0], x.q[k - 1]), (127, -127));
            let reference = kernels.last().expect("the reference");
            let want = (reference.dot)(w.row(0), x.one());
            for kernel in &kernels {
                let got = (kernel.dot)(w.row(0), x.one());
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{} at {k}: {got} vs {want}",
                    kernel.name
                );
            }
            let mut wv = vec![0.0; k];
            w.dequantise_row(0, &mut wv);
            let (mut exact, mut size) = (0.0f64, 0.0f64);
            for (i, v) in wv.iter().enumerate() {
                let xv = f64::from(x.d[i / 32]) * f64::from(x.q[i]);
                exact += f64::from(*v) * xv;
                size += (f64::from(*v) * xv).abs();
            }
            let err = (f64::from(want) - exact).abs();
            assert!(
                err <= 1e-5 * size + 1e-30,
                "{} at {k}: {want} vs {exact}",
                std::any::type_name::<T>()
            );
        }
    }
}

#[test]
fn every_q4_k_kernel_gives_the_reference_bits() {
    kernels_agree::<Q4K>(super::kernels::<Q4K>(), |b| {
        b[4..16].fill(0xFF); // every scale and minimum 63
        b[16..].fill(0xFF); // every nibble 15
    });
}

#[test]
fn every_q5_k_kernel_gives_the_reference_bits() {
    kernels_agree::<Q5K>(super::kernels::<Q5K>(), |b| {
        b[4..16].fill(0xFF); // every scale and minimum 63
        b[16..].fill(0xFF); // every fifth bit set, every nibble 15: q 31
    });
}

#[test]
fn every_q4_1_and_q5_1_kernel_gives_the_reference_bits() {
    kernels_agree::<Q41>(super::kernels::<Q41>(), |b| b[4..].fill(0xFF));
    kernels_agree::<Q51>(super::kernels::<Q51>(), |b| b[4..].fill(0xFF));
}

#[test]
fn every_q6_k_kernel_gives_the_reference_bits() {
    kernels_agree::<Q6K>(super::kernels::<Q6K>(), |b| {
        b[..192].fill(0xFF); // every q 63
        b[192..208].fill(0x80); // every scale −128
    });
}

/// This CPU's kernels for both types: the vector ones where it has their features (a path it
/// lacks is named as skipped).
#[test]
fn the_vector_kernels_run_where_the_cpu_has_them() {
    let names = |v: Vec<&'static str>| v.join(", ");
    let q4 = names(super::kernels::<Q4K>().iter().map(|k| k.name).collect());
    let q6 = names(super::kernels::<Q6K>().iter().map(|k| k.name).collect());
    assert_eq!(q4, q6, "both types have the same kernels");
    #[cfg(target_arch = "x86_64")]
    {
        let (vnni, avx2) = blocks::vector_sets();
        assert_eq!(q4.contains("avx512-vnni"), vnni);
        assert_eq!(q4.contains("avx2"), avx2);
        if !vnni {
            eprintln!("skipped: the AVX-512 VNNI k-quant kernels (this CPU or build lacks them)");
        }
        if !avx2 {
            eprintln!("skipped: the AVX2 k-quant kernels (this CPU lacks them)");
        }
    }
}

/// A product of several rows and a row's outputs in two shares (as threads take them) give
/// each output as the row's product alone does; a prompt's rows (f32 of the dequantised
/// weights) are near them.
#[test]
fn products_are_each_rows_product() {
    let (rows, k, n) = (3, 512, 37);
    let w = matrix::<Q6K>(n, k, 9, 0.02);
    let x = values(rows * k, 5);
    let b: Vec<f32> = (0..n).map(|j| j as f32 / 10.0).collect();
    let mut out = vec![0.0; rows * n];
    super::product(&mut out, &x, &w, &b, Method::Alone);
    let mut q = Q8Rows::default();
    for r in 0..rows {
        q.quantize(&x[r * k..(r + 1) * k]);
        let mut share = vec![0.0; n];
        super::row_range(&mut share[..20], &q, &w, &b, 0);
        super::row_range(&mut share[20..], &q, &w, &b, 20);
        for j in 0..n {
            let alone = q6_k::dot_reference(w.row(j), q.one()) + b[j];
            assert_eq!(out[r * n + j].to_bits(), alone.to_bits());
            assert_eq!(share[j].to_bits(), alone.to_bits());
        }
    }
    let w4 = matrix::<Q4K>(n, k, 4, 0.02);
    let x = values(GEMM_ROWS * k, 6);
    let (mut quantised, mut f32s) = (vec![0.0; GEMM_ROWS * n], vec![0.0; GEMM_ROWS * n]);
    super::product(&mut quantised, &x, &w4, &b, Method::Alone);
    super::product(&mut f32s, &x, &w4, &b, Method::Dequantised);
    let largest = f32s.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, f) in quantised.iter().zip(&f32s) {
        assert!((a - f).abs() <= 0.02 * largest, "{a} vs {f}");
    }
}

//! Each product of baby's fused step (one thread's 384 rows: 6 sequences of 64, width 128, MLP
//! 512), forward and backward, timed through gemm and matrixmultiply; best of five runs of 80.
//! Beside them, the core's peak: independent fused multiply-adds and nothing else, on the
//! vector width the products use.

use std::time::Instant;

/// `(m, k, n, a transposed, b transposed, what)`: `out[m, n] += a[m, k] · b[k, n]`.
const SHAPES: &[(usize, usize, usize, bool, bool, &str)] = &[
    (384, 128, 384, false, false, "qkv forward"),
    (384, 128, 128, false, false, "proj forward"),
    (384, 128, 512, false, false, "fc forward"),
    (384, 512, 128, false, false, "mlp proj forward"),
    (384, 384, 128, false, true, "qkv dX = dY·Wᵀ"),
    (128, 384, 384, true, false, "qkv dW = Xᵀ·dY"),
    (384, 512, 128, false, true, "fc dX"),
    (128, 384, 512, true, false, "fc dW"),
    (384, 128, 512, false, true, "mlp proj dX"),
    (512, 384, 128, true, false, "mlp proj dW"),
];

/// Row and column strides of a `[rows, cols]` matrix, stored transposed or not.
fn strides(rows: usize, cols: usize, transposed: bool) -> (isize, isize) {
    match transposed {
        true => (1, rows as isize),
        false => (cols as isize, 1),
    }
}

/// The best seconds per call of `f` over five runs of 80 calls, after 20.
fn best(mut f: impl FnMut()) -> f64 {
    (0..20).for_each(|_| f());
    (0..5)
        .map(|_| {
            let start = Instant::now();
            (0..80).for_each(|_| f());
            start.elapsed().as_secs_f64() / 80.0
        })
        .fold(f64::MAX, f64::min)
}

/// GFLOP/s of twelve independent chains of 256-bit fused multiply-adds (no loads): the most a
/// product's inner loop can reach on this core at this width.
#[cfg(not(feature = "avx512"))]
fn peak() -> f64 {
    #[target_feature(enable = "avx2,fma")]
    fn chains(rounds: usize) -> f32 {
        use std::arch::x86_64::*;
        let (a, b) = (
            _mm256_set1_ps(std::hint::black_box(0.999_999)),
            _mm256_set1_ps(1e-7),
        );
        let mut acc = [_mm256_set1_ps(1.0); 12];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight floats.
        unsafe {
            _mm256_storeu_ps(
                lanes.as_mut_ptr(),
                acc.iter().fold(acc[0], |s, &x| _mm256_add_ps(s, x)),
            )
        };
        lanes.iter().sum()
    }
    let rounds = 1 << 22;
    // SAFETY: the AVX2 and FMA kernels are what this build runs; the machine has them.
    let s = best(|| {
        std::hint::black_box(unsafe { chains(std::hint::black_box(rounds)) });
    });
    (rounds * 12 * 8 * 2) as f64 / s / 1e9
}

/// As above with 512-bit fused multiply-adds.
#[cfg(feature = "avx512")]
fn peak() -> f64 {
    #[target_feature(enable = "avx512f")]
    fn chains(rounds: usize) -> f32 {
        use std::arch::x86_64::*;
        let (a, b) = (
            _mm512_set1_ps(std::hint::black_box(0.999_999)),
            _mm512_set1_ps(1e-7),
        );
        let mut acc = [_mm512_set1_ps(1.0); 12];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(acc[0], |s, &x| _mm512_add_ps(s, x)))
    }
    let rounds = 1 << 22;
    // SAFETY: run only on a CPU with AVX-512 (the feature's purpose).
    let s = best(|| {
        std::hint::black_box(unsafe { chains(std::hint::black_box(rounds)) });
    });
    (rounds * 12 * 16 * 2) as f64 / s / 1e9
}

fn main() {
    println!("the core's peak at this width: {:.1} GFLOP/s", peak());
    println!(
        "{:<18} {:>16} {:>22} {:>8}",
        "product", "gemm GFLOP/s", "matrixmultiply GFLOP/s", "ratio"
    );
    let (mut gemm_s, mut mm_s, mut flops) = (0.0, 0.0, 0.0);
    for &(m, k, n, ta, tb, what) in SHAPES {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut out = vec![0f32; m * n];
        let ((ars, acs), (brs, bcs)) = (strides(m, k, ta), strides(k, n, tb));
        // SAFETY: every index lies within `a`, `b` and `out` by the shapes and strides above.
        let g = best(|| unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr(),
                1,
                n as isize,
                true,
                a.as_ptr(),
                acs,
                ars,
                b.as_ptr(),
                bcs,
                brs,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        });
        // SAFETY: as above.
        let mm = best(|| unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                ars,
                acs,
                b.as_ptr(),
                brs,
                bcs,
                1.0,
                out.as_mut_ptr(),
                n as isize,
                1,
            );
        });
        let f = 2.0 * (m * k * n) as f64;
        (gemm_s, mm_s, flops) = (gemm_s + g, mm_s + mm, flops + f);
        println!(
            "{what:<18} {:>16.1} {:>22.1} {:>8.2}",
            f / g / 1e9,
            f / mm / 1e9,
            mm / g
        );
    }
    println!(
        "{:<18} {:>16.1} {:>22.1} {:>8.2}",
        "all ten",
        flops / gemm_s / 1e9,
        flops / mm_s / 1e9,
        mm_s / gemm_s
    );
}

//! GGUF's k-quants for decoding, kept in the blocks a file stores them in: `Q4_K` (super-blocks
//! of 256 values in eight groups of 32, each group a 6-bit scale and a 6-bit minimum: value =
//! `d · sc · q − dmin · m`, `q` four bits), `Q5_K` (the same, `q` five bits) and `Q6_K`
//! (sixteen groups of 16, each an 8-bit scale: value = `d · sc · (q − 32)`, `q` six bits).
//! llama.cpp writes a "Q4_K_M" or "Q5_K_M" file's matrices in them where rows are a multiple
//! of 256 long (SmolLM2-1.7B's 2048; the 135M's 1536-long down projections).
//!
//! Beside them, the older types with a minimum per block of 32, `Q4_1` and `Q5_1` (a "Q5_K_M"
//! file's type where rows are not a multiple of 256, as `Q5_0` is a "Q4_K_M" file's): the same
//! product, a block a group.
//!
//! The activations are quantised as for `Q8_0` ([`q8::Q8Rows`]: blocks of 32, an f32 scale
//! each), finer than ggml's `q8_K` (one scale per 256), so each group of 32 of a row's product
//! is exact in integers and takes one float scale: [`Sets`] defines the sum (eight lanes of four
//! products, four sets of lanes, `Q8_0`'s order), and every kernel computes it bit for bit.

use std::sync::Arc;

use half::f16;

use super::blocks::{self, BlockMatrix, Method, each_row};
use super::prefill::Unpack;
use super::q8::{BLOCK, Q8Rows, XRow, across};

/// Implements [`Kernels`] for the type `$t` from its module's kernels: `$reference`, and on
/// x86-64 `$avx2` and `$avx512` with their shares of rows (`$avx2_rows`, `$avx512_rows`,
/// compiled with their kernel's features so that the row's product is inlined); the fastest is
/// chosen once, in a static of the type's own (one in a generic function would be one for all
/// its instances).
macro_rules! kernels_of {
    ($t:ty, $reference:path, $avx2:path, $avx2_rows:path, $avx512:path, $avx512_rows:path) => {
        impl crate::cpu::kernels::k_quants::Kernels for $t {
            fn reference(w: &[u8], x: crate::cpu::kernels::q8::XRow<'_>) -> f32 {
                $reference(w, x)
            }

            #[cfg(target_arch = "x86_64")]
            unsafe fn avx2(w: &[u8], x: crate::cpu::kernels::q8::XRow<'_>) -> f32 {
                // SAFETY: the caller's contract is the kernel's.
                unsafe { $avx2(w, x) }
            }

            #[cfg(target_arch = "x86_64")]
            unsafe fn avx2_rows(
                out: &mut [f32],
                x: &crate::cpu::kernels::q8::Q8Rows,
                w: &crate::cpu::kernels::k_quants::KMatrix<Self>,
                b: &[f32],
                j0: usize,
            ) {
                // SAFETY: the caller's contract is the kernel's.
                unsafe { $avx2_rows(out, x, w, b, j0) }
            }

            #[cfg(target_arch = "x86_64")]
            unsafe fn avx512(w: &[u8], x: crate::cpu::kernels::q8::XRow<'_>) -> f32 {
                // SAFETY: the caller's contract is the kernel's.
                unsafe { $avx512(w, x) }
            }

            #[cfg(target_arch = "x86_64")]
            unsafe fn avx512_rows(
                out: &mut [f32],
                x: &crate::cpu::kernels::q8::Q8Rows,
                w: &crate::cpu::kernels::k_quants::KMatrix<Self>,
                b: &[f32],
                j0: usize,
            ) {
                // SAFETY: the caller's contract is the kernel's.
                unsafe { $avx512_rows(out, x, w, b, j0) }
            }

            fn fastest() -> crate::cpu::kernels::k_quants::Kernel<$t> {
                use crate::cpu::kernels::k_quants::{Kernel, kernels};
                static FASTEST: std::sync::OnceLock<Kernel<$t>> = std::sync::OnceLock::new();
                *FASTEST.get_or_init(|| kernels::<$t>()[0])
            }
        }
    };
}

pub(crate) mod columns;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q6_k;

/// Values in a super-block (the format's, defined once in `arch/quants`).
pub use crate::arch::quants::SUPER;

/// Groups of 32 (activation blocks) in a super-block.
const GROUPS: usize = SUPER / BLOCK;

/// A type's block (a k-quant's super-block): its bytes and its values.
pub(crate) trait KType: Sync + Send + 'static {
    /// Values in a block: [`SUPER`] for the k-quants, 32 for `Q4_1` and `Q5_1`.
    const VALUES: usize = SUPER;
    /// Bytes of a block.
    const BYTES: usize;
    /// The block's values, as ggml's `dequantize_row_*` computes them.
    fn dequantise(block: &[u8], out: &mut [f32]);
    /// Values a scale covers in a prompt's integer product ([`Unpack::GROUP`]).
    const GROUP: usize = BLOCK;
    /// [`Unpack::ZERO`].
    const ZERO: i32 = 0;
    /// [`Unpack::MINIMUMS`].
    const MINIMUMS: bool;
    /// [`Unpack::LARGEST`].
    const LARGEST: u8;
    /// The block as bytes `u [VALUES]`, its groups' scales and minimums
    /// ([`Unpack::unpack_row`]).
    fn unpack(block: &[u8], u: &mut [u8], scales: &mut [f32], minimums: &mut [f32]);
}

/// A matrix `[rows, cols]` of blocks along each row (`cols` a multiple of a block's values),
/// stored as GGUF stores it: row after row, each row its super-blocks' bytes.
#[derive(Debug, Clone)]
pub(crate) struct KMatrix<T> {
    pub rows: usize,
    pub cols: usize,
    data: Arc<[u8]>,
    kind: std::marker::PhantomData<T>,
}

impl<T: KType> KMatrix<T> {
    /// `bytes`, a file's tensor of `rows` rows of `cols`, as it stores them (shared, not
    /// copied); `None` where its length or `cols` does not fit.
    pub(crate) fn from_bytes(bytes: Arc<[u8]>, rows: usize, cols: usize) -> Option<Self> {
        let fits = cols > 0 && cols.is_multiple_of(T::VALUES);
        (fits && bytes.len() == rows * Self::stride(cols)).then_some(Self {
            rows,
            cols,
            data: bytes,
            kind: std::marker::PhantomData,
        })
    }

    /// Bytes of a row of `cols`.
    pub(crate) fn stride(cols: usize) -> usize {
        cols / T::VALUES * T::BYTES
    }

    /// Bytes it holds: GGUF's.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `j`'s super-blocks.
    #[inline]
    pub(crate) fn row(&self, j: usize) -> &[u8] {
        let stride = Self::stride(self.cols);
        &self.data[j * stride..(j + 1) * stride]
    }

    /// Row `j`'s values into `out [cols]`.
    pub(crate) fn dequantise_row(&self, j: usize, out: &mut [f32]) {
        let blocks = self.row(j).chunks_exact(T::BYTES);
        for (block, values) in blocks.zip(out.chunks_exact_mut(T::VALUES)) {
            T::dequantise(block, values);
        }
    }
}

impl<T: KType> Unpack for KMatrix<T> {
    const GROUP: usize = T::GROUP;
    const ZERO: i32 = T::ZERO;
    const MINIMUMS: bool = T::MINIMUMS;
    const LARGEST: u8 = T::LARGEST;

    fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn unpack_row(&self, j: usize, u: &mut [u8], scales: &mut [f32], minimums: &mut [f32]) {
        let groups = T::VALUES / T::GROUP;
        let blocks = self.row(j).chunks_exact(T::BYTES);
        let parts = u
            .chunks_exact_mut(T::VALUES)
            .zip(scales.chunks_exact_mut(groups));
        for ((block, (u, s)), m) in blocks.zip(parts).zip(minimums.chunks_exact_mut(groups)) {
            T::unpack(block, u, s, m);
        }
    }
}

impl<T: KType> BlockMatrix for KMatrix<T> {
    type Row<'a> = &'a [u8];

    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    #[inline]
    fn row(&self, j: usize) -> &[u8] {
        KMatrix::row(self, j)
    }

    fn dequantise_row(&self, j: usize, out: &mut [f32]) {
        KMatrix::dequantise_row(self, j, out)
    }
}

/// The f16 at `bytes[at..at + 2]` as f32.
#[inline]
fn half(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The sum every k-quant kernel computes, in plain Rust: group `b`'s eight integer lane sums
/// (lane `l`: values `4l..4l + 4`), times its float scale, into set `b mod 4` by one fused
/// multiply-add each (`Q8_0`'s [`super::q8::dot_reference`]); and, for types with minimums,
/// group `b`'s activation sum times its minimum's scale into lane `b mod 8` of `mins`. The
/// result is the sets' total less the minimums'.
pub(crate) struct Sets {
    sets: [[f32; 8]; 4],
    mins: [f32; 8],
}

impl Sets {
    pub(crate) fn new() -> Self {
        Self {
            sets: [[0.0; 8]; 4],
            mins: [0.0; 8],
        }
    }

    /// Group `b`'s lanes times `scale`.
    pub(crate) fn add(&mut self, b: usize, lanes: [i32; 8], scale: f32) {
        for (acc, lane) in self.sets[b % 4].iter_mut().zip(lanes) {
            *acc = (lane as f32).mul_add(scale, *acc);
        }
    }

    /// Group `b`'s activation sum times its minimum's scale.
    pub(crate) fn add_min(&mut self, b: usize, sum: f32, scale: f32) {
        self.mins[b % 8] = sum.mul_add(scale, self.mins[b % 8]);
    }

    pub(crate) fn total(&self) -> f32 {
        let s = &self.sets;
        let lanes: [f32; 8] = std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
        across(lanes) - across(self.mins)
    }
}

/// Group `b`'s lanes `Σ_{i<4} w(4l + i) · x[4l + i]` of a row's values `w(i)` (as `i32`).
#[inline]
fn lanes(x: XRow<'_>, b: usize, w: impl Fn(usize) -> i32) -> [i32; 8] {
    let x = &x.q[b * BLOCK..(b + 1) * BLOCK];
    std::array::from_fn(|l| (4 * l..4 * l + 4).map(|i| w(i) * i32::from(x[i])).sum())
}

/// A type's kernels, each a row's product and a share of rows with it inlined: the plain
/// reference and, on x86-64, AVX2 and AVX-512 VNNI, each the reference's floats bit for bit.
pub(crate) trait Kernels: KType + Sized {
    /// The numbers every kernel computes.
    fn reference(w: &[u8], x: XRow<'_>) -> f32;
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(w: &[u8], x: XRow<'_>) -> f32;
    /// # Safety
    /// As [`Kernels::avx2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_rows(out: &mut [f32], x: &Q8Rows, w: &KMatrix<Self>, b: &[f32], j0: usize);
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI, with AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(w: &[u8], x: XRow<'_>) -> f32;
    /// # Safety
    /// As [`Kernels::avx512`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_rows(out: &mut [f32], x: &Q8Rows, w: &KMatrix<Self>, b: &[f32], j0: usize);
    /// The first of [`kernels`], chosen once.
    fn fastest() -> Kernel<Self>;
}

/// A kernel of type `T`'s matrices.
pub(crate) type Kernel<T> = blocks::Kernel<KMatrix<T>>;

/// Every kernel this CPU runs for `T`, fastest first; the last is the reference.
pub(crate) fn kernels<T: Kernels>() -> Vec<Kernel<T>> {
    let reference = Kernel::<T> {
        name: "reference",
        dot: T::reference,
        rows: |out, x, w, b, j0| each_row(out, x, w, b, j0, T::reference),
    };
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (all four): `runnable` keeps a kernel only where the CPU has the features it
        // is compiled for.
        let avx512 = Kernel::<T> {
            name: "avx512-vnni",
            dot: |w, x| unsafe { T::avx512(w, x) },
            rows: |out, x, w, b, j0| unsafe { T::avx512_rows(out, x, w, b, j0) },
        };
        let avx2 = Kernel::<T> {
            name: "avx2",
            dot: |w, x| unsafe { T::avx2(w, x) },
            rows: |out, x, w, b, j0| unsafe { T::avx2_rows(out, x, w, b, j0) },
        };
        blocks::runnable(avx512, avx2, reference)
    }
    #[cfg(not(target_arch = "x86_64"))]
    vec![reference]
}

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` by `method` ([`blocks::product`]).
pub(crate) fn product<T: Kernels>(
    out: &mut [f32],
    x: &[f32],
    w: &KMatrix<T>,
    b: &[f32],
    method: Method,
) {
    blocks::product(out, x, w, b, method, T::fastest())
}

/// Outputs `j0..j0 + out.len()` of one quantised row `x` times `wᵀ` plus `b`: a thread's share
/// of a token's product.
pub(crate) fn row_range<T: Kernels>(
    out: &mut [f32],
    x: &Q8Rows,
    w: &KMatrix<T>,
    b: &[f32],
    j0: usize,
) {
    (T::fastest().rows)(out, x, w, b, j0)
}

#[cfg(target_arch = "x86_64")]
pub(in crate::cpu::kernels) mod avx2 {
    use crate::cpu::kernels::q8::avx2::{across, sets_total};
    use std::arch::x86_64::*;

    /// [`super::Sets::total`] of four set registers and a register of minimums.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::cpu::kernels) fn total(sets: [__m256; 4], mins: __m256) -> f32 {
        sets_total(sets) - across(mins)
    }

    /// The f16 at `bytes[at..at + 2]` as f32, by F16C ([`super::half`]'s value).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(in crate::cpu::kernels) fn half(bytes: &[u8], at: usize) -> f32 {
        let bits = i32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }

    /// The eight lane sums of 32 bytes `w` (unsigned, at most 63) times `x`, as `i16` pairs
    /// (`maddubs`: a pair at most 2 · 63 · 127).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::cpu::kernels) fn pairs(w: __m256i, x: __m256i) -> __m256i {
        _mm256_maddubs_epi16(w, x)
    }
}

#[cfg(target_arch = "x86_64")]
pub(in crate::cpu::kernels) mod avx512 {
    use crate::cpu::kernels::q8::{avx2::across, avx512::sets_total};
    use std::arch::x86_64::*;

    /// [`super::Sets::total`] of the register of sets 0 and 1 (`low`), of sets 2 and 3
    /// (`high`), and a register of minimums.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(in crate::cpu::kernels) fn total(low: __m512, high: __m512, mins: __m256) -> f32 {
        sets_total(low, high) - across(mins)
    }

    /// Sixteen scales for a pair of groups: `scales[i]` in the low eight lanes,
    /// `scales[i + 1]` in the high eight.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::cpu::kernels) fn pair_scale(scales: __m256, i: usize) -> __m512 {
        let pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let index = _mm512_add_epi32(pick, _mm512_set1_epi32(i as i32));
        _mm512_permutexvar_ps(index, _mm512_castps256_ps512(scales))
    }
}

#[cfg(test)]
pub(in crate::cpu::kernels) mod tests;

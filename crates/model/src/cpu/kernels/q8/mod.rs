//! Int8 weights for decoding: GGUF's `Q8_0` (blocks of 32 signed bytes along a weight row, one
//! f16 scale each: value = `q · d`), and the products of such rows with activations quantised
//! the same way on the fly (per block of 32, an f32 scale).
//!
//! A token of decoding reads every weight once, so its time is the bytes read: 1.0625 bytes
//! per weight here against f32's 4. The sum of a block is exact in integers; only the scales'
//! products are float:
//!
//! ```text
//! row · x = Σ_blocks (d_w · d_x) · Σ_{i<32} q_w[i] · q_x[i]
//! ```
//!
//! [`dot_reference`] defines the numbers in plain Rust (eight lanes of four products, as the
//! vector instructions group them, four sets of lanes for consecutive blocks, and the sums in
//! the order the vector code takes). Two kernels compute exactly the same floats, which the
//! tests check bit for bit: AVX-512 VNNI (`dpbusd`: a block pair's 64 byte products into
//! sixteen `i32` lanes in one instruction, without AVX2's `i16` step) and AVX2 (`maddubs` +
//! `madd`), chosen once at run time. CPUs with AVX-VNNI but no AVX-512
//! (Intel's client cores) take the AVX2 kernel. A product of many rows (a prompt) instead
//! multiplies the dequantised weights in f32 ([`GEMM_ROWS`]).

use half::f16;

use super::matmul::{View, matmul_into};
use super::prefetch;
use super::rows::F32Rows;
use crate::fast_math::vectorized;

use crate::arch::q8_0::quantize_block;
pub(crate) mod columns;

pub use crate::arch::q8_0::{BLOCK, q8_0_block};

/// A matrix `[rows, cols]` of `Q8_0` blocks along each row (`cols` a multiple of [`BLOCK`]),
/// stored row after row as the row's f16 scales (`cols / 32`) and then its bytes (`cols`, two
/// to an `f16` slot). With the scales beside the bytes a thread's share of a token's product
/// is one stream of reads, not two (a few percent faster on a Zen 4: docs/perf.md).
#[derive(Debug, Clone, Default)]
pub(crate) struct Q8Matrix {
    pub rows: usize,
    pub cols: usize,
    data: Vec<f16>,
}

impl Q8Matrix {
    /// `values [rows, cols]` quantised row by row as ggml's reference quantiser does it
    /// (`quantize_row_q8_0_ref`): `d = max|x| / 127` rounded to f16, `q = round(x / d)` with
    /// `1 / d` taken from the f32 `d` (ties away from zero).
    pub(crate) fn from_rows(values: &[f32], cols: usize) -> Self {
        assert!(cols.is_multiple_of(BLOCK), "a Q8_0 row is whole blocks");
        let rows = values.len() / cols;
        let mut m = Self::zeros(rows, cols);
        for (j, values) in values.chunks_exact(cols).enumerate() {
            let (q, d) = m.row_mut(j);
            for ((x, q), d) in values
                .chunks_exact(BLOCK)
                .zip(q.chunks_exact_mut(BLOCK))
                .zip(d)
            {
                *d = f16::from_f32(quantize_block(x, q));
            }
        }
        m
    }

    /// A file's `Q8_0` tensor of `rows` rows of `cols` as it stores it (blocks of an f16 scale
    /// and 32 bytes); `None` where its length or `cols` does not fit.
    pub(crate) fn from_gguf(bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let fits = cols > 0 && cols.is_multiple_of(BLOCK);
        if !fits || bytes.len() != rows * cols / BLOCK * (2 + BLOCK) {
            return None;
        }
        let mut m = Self::zeros(rows, cols);
        for (j, row) in bytes.chunks_exact(cols / BLOCK * (2 + BLOCK)).enumerate() {
            let (q, d) = m.row_mut(j);
            let blocks = row.chunks_exact(2 + BLOCK).zip(q.chunks_exact_mut(BLOCK));
            for ((block, q), d) in blocks.zip(d) {
                *d = f16::from_le_bytes([block[0], block[1]]);
                q.iter_mut()
                    .zip(&block[2..])
                    .for_each(|(q, &b)| *q = b as i8);
            }
        }
        Some(m)
    }

    /// `rows` rows of `cols` zeros (`cols` whole blocks), to be written row by row.
    pub(crate) fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![f16::ZERO; rows * (cols / BLOCK + cols / 2)],
        }
    }

    /// Bytes it holds: a byte a weight and two a block's scale.
    pub(crate) fn bytes(&self) -> usize {
        2 * self.data.len()
    }

    /// Row `j`'s slots: its scales, then its bytes.
    fn slots(&self, j: usize) -> std::ops::Range<usize> {
        let stride = self.cols / BLOCK + self.cols / 2;
        j * stride..(j + 1) * stride
    }

    /// Row `j`: its bytes `[cols]` and its blocks' scales `[cols / 32]`.
    #[inline]
    pub(crate) fn row(&self, j: usize) -> (&[i8], &[f16]) {
        let (d, q) = self.data[self.slots(j)].split_at(self.cols / BLOCK);
        // SAFETY: `q` is `cols / 2` initialised `f16`s, `cols` bytes; `i8` has no alignment
        // and every bit pattern is a value.
        let q = unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<i8>(), self.cols) };
        (q, d)
    }

    /// [`Self::row`], to write.
    pub(crate) fn row_mut(&mut self, j: usize) -> (&mut [i8], &mut [f16]) {
        let (cols, slots) = (self.cols, self.slots(j));
        let (d, q) = self.data[slots].split_at_mut(cols / BLOCK);
        // SAFETY: as in `row`, and `q` is borrowed mutably once, here.
        let q = unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr().cast::<i8>(), cols) };
        (q, d)
    }

    /// Asks the CPU for row `j`'s scales and bytes ahead of the product reaching them.
    #[inline]
    fn ask_for_row(&self, j: usize) {
        prefetch::lines(&self.data[self.slots(j)]);
    }

    /// A linear layer's weight `w [n_in, n_out]` (Burn's layout) as `n_out` rows of `n_in`: each
    /// output's weights contiguous, as a row of GGUF's `[n_out, n_in]` tensors.
    pub(crate) fn from_columns(w: &[f32], n_in: usize) -> Self {
        Self::from_rows(&F32Rows::from_columns(w, n_in).w, n_in)
    }

    /// Its values dequantised into `out` as `[rows, cols]` f32 rows (`q · d`, what every
    /// product by it computes with), `out`'s allocation reused.
    pub(crate) fn dequantise_into(&self, out: &mut F32Rows) {
        out.rows = self.rows;
        out.cols = self.cols;
        out.w.resize(self.rows * self.cols, 0.0);
        for (j, values) in out.w.chunks_exact_mut(self.cols).enumerate() {
            self.dequantise_row(j, values);
        }
    }

    /// Row `j`'s values `q · d` into `out` `[cols]`.
    pub(crate) fn dequantise_row(&self, j: usize, out: &mut [f32]) {
        let (q, d) = self.row(j);
        dequantise_blocks(q, d, out);
    }
}

/// Blocks of 32 bytes `q` with scales `d` as their values `q · d` into `out`.
fn dequantise_blocks(q: &[i8], d: &[f16], out: &mut [f32]) {
    let blocks = out.chunks_exact_mut(BLOCK).zip(q.chunks_exact(BLOCK));
    for ((values, q), d) in blocks.zip(d) {
        let d = d.to_f32();
        values
            .iter_mut()
            .zip(q)
            .for_each(|(v, &q)| *v = f32::from(q) * d);
    }
}

/// Activation rows quantised for the products: `q [rows · cols]`, f32 scales per block, and
/// each block's sum of bytes (exact in f32: at most 32 · 127), which the types with a minimum
/// per block (`Q4_K`) multiply by it once per block instead of once per value.
#[derive(Debug, Default)]
pub(crate) struct Q8Rows {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sums: Vec<f32>,
}

/// One quantised activation row of [`Q8Rows`]: its bytes `[k]`, its blocks' scales and sums
/// `[k / 32]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XRow<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub sums: &'a [f32],
}

impl Q8Rows {
    /// `x [rows, cols]` quantised block by block (f32 scales: the activations change every
    /// token, so nothing is saved by rounding their scales to f16).
    pub(crate) fn quantize(&mut self, x: &[f32]) {
        self.q.resize(x.len(), 0);
        self.d.resize(x.len() / BLOCK, 0.0);
        self.sums.resize(x.len() / BLOCK, 0.0);
        quantize_blocks(x, &mut self.q, &mut self.d, &mut self.sums);
    }

    /// Row `r` of rows `k` long.
    #[inline]
    pub(crate) fn row(&self, r: usize, k: usize) -> XRow<'_> {
        let kb = k / BLOCK;
        XRow {
            q: &self.q[r * k..(r + 1) * k],
            d: &self.d[r * kb..(r + 1) * kb],
            sums: &self.sums[r * kb..(r + 1) * kb],
        }
    }

    /// The whole of a single row.
    #[inline]
    pub(crate) fn one(&self) -> XRow<'_> {
        self.row(0, self.q.len())
    }
}

vectorized! {
    /// [`quantize_block`] over consecutive blocks, compiled for the CPU's vector width: on the
    /// baseline target `round` is a libm call per value (a few percent of a token at
    /// SmolLM2-135M's size); with SSE4.1 and up it is a few vector instructions, with the
    /// same results.
    fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], sums: &mut [f32]) {
        let blocks = x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK));
        for (((x, q), d), sum) in blocks.zip(d).zip(sums) {
            *d = quantize_block(x, q);
            *sum = q.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
        }
    }
}

/// Below this many rows a product runs in int8 row by row; from it on (a prompt's chunk, a
/// window scored) as one blocked product: in integers by AVX-512 VNNI ([`super::prefill`]),
/// or the weights dequantised a panel at a time into the blocked f32 product, which on AVX2
/// does more multiply-adds per instruction than byte products do (those win only where the
/// weights' bytes are the cost: a token at a time). Measured: an AVX2 kernel of `Q8_0`'s
/// signed bytes (`maddubs` of `|w|` by `x` carrying `w`'s sign, each pair widened at once)
/// gave 0.65–0.74× (135M's shape) and 0.79–0.86× (1.7B's) of this product's prompt on a
/// Zen 4, 2026-12-07 (docs/perf/2026-12.md).
pub(crate) const GEMM_ROWS: usize = 16;

/// Output rows of the weight panel dequantised at a time: `[PANEL, cols]` f32 stays in L2.
const PANEL: usize = 64;

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` in int8 (each row as it would be alone)
/// or, `int8` false, by f32 products of the dequantised weights (a prompt's integer product
/// is [`super::prefill::product`]).
pub(crate) fn product(out: &mut [f32], x: &[f32], w: &Q8Matrix, b: &[f32], int8: bool) {
    match int8 {
        true => quantized(x, |rows| rows_times(out, rows, w, b)),
        false => dequantised_product(out, x, w.cols, w.rows, b, |j, values| {
            w.dequantise_row(j, values)
        }),
    }
}

/// `out [rows, n] = x [rows, k] · wᵀ + b` for a quantised `w` of `n` rows of `k`, whose row `j`
/// `dequantise(j, values)` writes: panels of [`PANEL`] rows dequantised into this thread's
/// scratch, each multiplied by all of `x` in f32 (a prompt's chunk).
pub(crate) fn dequantised_product(
    out: &mut [f32],
    x: &[f32],
    k: usize,
    n: usize,
    b: &[f32],
    dequantise: impl Fn(usize, &mut [f32]),
) {
    thread_local! {
        static PANEL: std::cell::RefCell<Vec<f32>> = std::cell::RefCell::default();
    }
    PANEL.with_borrow_mut(|panel| dequantised(out, x, k, n, b, panel, dequantise))
}

fn dequantised(
    out: &mut [f32],
    x: &[f32],
    k: usize,
    n: usize,
    b: &[f32],
    panel: &mut Vec<f32>,
    dequantise: impl Fn(usize, &mut [f32]),
) {
    let rows = x.len() / k;
    for j0 in (0..n).step_by(PANEL) {
        let j1 = (j0 + PANEL).min(n);
        panel.resize((j1 - j0) * k, 0.0);
        for (values, j) in panel.chunks_exact_mut(k).zip(j0..j1) {
            dequantise(j, values);
        }
        let weights = View::new(panel, j1 - j0, k).t();
        matmul_into(
            &mut out[j0..],
            n,
            View::new(x, rows, k),
            weights,
            1.0,
            false,
        );
    }
    if !b.is_empty() {
        out.chunks_exact_mut(n)
            .for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
    }
}

/// `f(x quantised)`, the quantised rows kept in this thread's scratch (a token allocates
/// nothing).
pub(crate) fn quantized<R>(x: &[f32], f: impl FnOnce(&Q8Rows) -> R) -> R {
    thread_local! {
        static ROWS: std::cell::RefCell<Q8Rows> = std::cell::RefCell::default();
    }
    ROWS.with_borrow_mut(|rows| {
        rows.quantize(x);
        f(rows)
    })
}

/// Outputs `j0..j0 + out.len()` of one quantised row `x` times `wᵀ` plus `b`: a thread's share
/// of a token's product, each output computed as [`rows_times`] computes it.
pub(crate) fn row_range(out: &mut [f32], x: &Q8Rows, w: &Q8Matrix, b: &[f32], j0: usize) {
    (kernel().rows)(out, x, w, b, j0)
}

/// [`row_range`] with `dot`: inlined into each kernel's `rows`, so that the kernel's product
/// is inlined into the loop too (no call through a pointer for each row of 576 bytes at
/// SmolLM2-135M's width).
#[inline(always)]
fn each_row(
    out: &mut [f32],
    x: &Q8Rows,
    w: &Q8Matrix,
    b: &[f32],
    j0: usize,
    dot: impl Fn(&[i8], &[f16], &[i8], &[f32]) -> f32,
) {
    let (ahead, end) = (prefetch::rows_ahead(w.cols), j0 + out.len());
    for (o, j) in out.iter_mut().zip(j0..) {
        if j + ahead < end {
            w.ask_for_row(j + ahead);
        }
        let (wq, ws) = w.row(j);
        *o = dot(wq, ws, &x.q, &x.d) + b.get(j).copied().unwrap_or(0.0);
    }
}

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` (`b` empty = no bias), `x` already
/// quantised: every row is computed as it would be alone. Each weight row goes past every
/// activation row while it is in cache, so it is read from memory once for all of them. (A
/// kernel of four weight rows at once, sharing each activation block's load, measured slower
/// on AVX2: 22–25 tokens/s against 39–52 at SmolLM2-135M's shape.)
pub(crate) fn rows_times(out: &mut [f32], x: &Q8Rows, w: &Q8Matrix, b: &[f32]) {
    let (k, n) = (w.cols, w.rows);
    let kb = k / BLOCK;
    let rows = x.q.len() / k;
    let (dot, ahead) = (kernel().dot, prefetch::rows_ahead(k));
    for j in 0..n {
        if j + ahead < n {
            w.ask_for_row(j + ahead);
        }
        let (wq, ws) = w.row(j);
        let bias = b.get(j).copied().unwrap_or(0.0);
        for r in 0..rows {
            let (xq, xd) = (&x.q[r * k..(r + 1) * k], &x.d[r * kb..(r + 1) * kb]);
            out[r * n + j] = dot(wq, ws, xq, xd) + bias;
        }
    }
}

/// A weight row (`wq [k]`, its scales `ws [k / 32]`) times a quantised activation row.
type Dot = fn(&[i8], &[f16], &[i8], &[f32]) -> f32;

/// A thread's share of a token's product, as [`row_range`].
type Rows = fn(&mut [f32], &Q8Rows, &Q8Matrix, &[f32], usize);

/// One exact kernel: a row's product, and a share of rows with that product inlined.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    /// What the tests call it when its floats differ from the reference's.
    #[cfg_attr(not(test), allow(dead_code))]
    name: &'static str,
    dot: Dot,
    rows: Rows,
}

/// The fastest exact kernel this CPU runs, chosen once.
fn kernel() -> Kernel {
    static FASTEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *FASTEST.get_or_init(|| kernels()[0])
}

/// Every kernel this CPU runs, fastest first; the last is the reference. Each computes the
/// same floats bit for bit.
pub(crate) fn kernels() -> Vec<Kernel> {
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
        if cfg!(feature = "avx512") && avx2 && avx512 {
            // SAFETY (both): the features the kernel is compiled for were just detected.
            found.push(Kernel {
                name: "avx512-vnni",
                dot: |wq, ws, xq, xd| unsafe { avx512::dot(wq, ws, xq, xd) },
                rows: |out, x, w, b, j0| unsafe { avx512::row_range(out, x, w, b, j0) },
            });
        }
        if avx2 {
            // SAFETY (both): as above.
            found.push(Kernel {
                name: "avx2",
                dot: |wq, ws, xq, xd| unsafe { avx2::dot(wq, ws, xq, xd) },
                rows: |out, x, w, b, j0| {
                    each_row(out, x, w, b, j0, |wq, ws, xq, xd| unsafe {
                        avx2::dot(wq, ws, xq, xd)
                    })
                },
            });
        }
    }
    found.push(Kernel {
        name: "reference",
        dot: dot_reference,
        rows: |out, x, w, b, j0| each_row(out, x, w, b, j0, dot_reference),
    });
    found
}

/// The numbers every kernel computes for a row. A block's 32 byte products make eight lanes
/// of four (lane `l` sums bytes `4l..4l + 4`, exact in `i32`); the lane sums of block `b` go,
/// times the block's `d_w · d_x`, into accumulator set `b mod 4` by one fused multiply-add
/// each (four sets so that consecutive blocks do not wait on each other's addition). At the
/// end, lane `l` is `(set0 + set2) + (set1 + set3)`, and the lanes are summed as
/// `((0+4) + (2+6)) + ((1+5) + (3+7))`.
pub(crate) fn dot_reference(wq: &[i8], ws: &[f16], xq: &[i8], xd: &[f32]) -> f32 {
    dot_reference_with(ws, xq, xd, |b, w| {
        w.copy_from_slice(&wq[b * BLOCK..(b + 1) * BLOCK])
    })
}

/// [`dot_reference`] of weight blocks that `block(b, bytes)` writes as 32 signed bytes (another
/// type's blocks widened to `Q8_0`'s, one at a time: nothing allocated).
pub(crate) fn dot_reference_with(
    ws: &[f16],
    xq: &[i8],
    xd: &[f32],
    block: impl Fn(usize, &mut [i8; BLOCK]),
) -> f32 {
    let mut sets = [[0f32; 8]; 4];
    let mut w = [0i8; BLOCK];
    for (b, (x, (&dw, &dx))) in xq.chunks_exact(BLOCK).zip(ws.iter().zip(xd)).enumerate() {
        block(b, &mut w);
        let s = dw.to_f32() * dx;
        for (l, acc) in sets[b % 4].iter_mut().enumerate() {
            let sum: i32 = (4 * l..4 * l + 4)
                .map(|i| i32::from(w[i]) * i32::from(x[i]))
                .sum();
            *acc = (sum as f32).mul_add(s, *acc);
        }
    }
    across(std::array::from_fn(|l| {
        (sets[0][l] + sets[2][l]) + (sets[1][l] + sets[3][l])
    }))
}

/// Eight lanes summed as the vector kernels sum a register:
/// `((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7))`.
pub(in crate::cpu::kernels) fn across(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

#[cfg(target_arch = "x86_64")]
pub(in crate::cpu::kernels) mod avx2 {
    use super::BLOCK;
    use half::f16;
    use std::arch::x86_64::*;

    /// Block `b`'s eight lane sums as floats ([`products`] of its bytes).
    ///
    /// # Safety
    /// The CPU has AVX2, and block `b` of both rows is in bounds.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lanes(wq: &[i8], xq: &[i8], b: usize) -> __m256 {
        // SAFETY: the caller keeps block `b` of both rows in bounds.
        unsafe {
            let w = _mm256_loadu_si256(wq.as_ptr().add(b * BLOCK).cast());
            products(w, _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK).cast()))
        }
    }

    /// Two blocks of 32 signed bytes' eight lane sums (lane `l`: bytes `4l..4l + 4`) as
    /// floats: `maddubs` (unsigned `|w|` times `x` carrying `w`'s sign; pairs of products, at
    /// most 2·128·127, fit `i16`) and `madd` with ones into eight `i32` lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::cpu::kernels) fn products(w: __m256i, x: __m256i) -> __m256 {
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }

    /// [`super::dot_reference`] in AVX2: four accumulator registers (the sets), the weights'
    /// scales eight blocks at a time by F16C.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the lengths are asserted).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(wq: &[i8], ws: &[f16], xq: &[i8], xd: &[f32]) -> f32 {
        let kb = ws.len();
        assert!(wq.len() >= kb * BLOCK && xq.len() >= kb * BLOCK && xd.len() >= kb);
        // SAFETY: blocks `< kb` of both rows are in bounds (asserted).
        unsafe { dot_with(ws, xd, |b| lanes(wq, xq, b)) }
    }

    /// The sum [`super::dot_reference`] makes of `lanes(b)`, block `b`'s eight lane sums, for
    /// blocks `0..ws.len()` (`Q8_0`'s lanes, or another type's widened to them): block `b`
    /// times `ws[b] · xd[b]` into accumulator set `b mod 4`, the scales eight blocks at a
    /// time by F16C, then the sets and the lanes summed in the reference's order.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `xd` holds `ws.len()` scales; `lanes` may be called
    /// for every block `< ws.len()`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::cpu::kernels) unsafe fn dot_with(
        ws: &[f16],
        xd: &[f32],
        lanes: impl Fn(usize) -> __m256,
    ) -> f32 {
        let kb = ws.len();
        let mut sets = [_mm256_setzero_ps(); 4];
        let mut scales = [0f32; 8];
        for b0 in (0..kb).step_by(8) {
            let n = (kb - b0).min(8);
            match n {
                // SAFETY: `ws[b0..b0 + 8]` is 16 bytes in bounds; `scales` 8 f32.
                8 => unsafe {
                    let bits = _mm_loadu_si128(ws.as_ptr().add(b0).cast());
                    _mm256_storeu_ps(scales.as_mut_ptr(), _mm256_cvtph_ps(bits));
                },
                _ => scales
                    .iter_mut()
                    .zip(&ws[b0..])
                    .for_each(|(s, d)| *s = d.to_f32()),
            }
            // `b0` is a multiple of 8, so local block `i` goes to set `i mod 4`. Every set is
            // named by a constant so that the four stay in registers.
            // SAFETY: block `b0 + i < kb` (the caller's contract), and `xd` holds it.
            let step = |i: usize, set: __m256| unsafe {
                let s = _mm256_set1_ps(scales[i] * *xd.get_unchecked(b0 + i));
                _mm256_fmadd_ps(lanes(b0 + i), s, set)
            };
            let mut i = 0;
            while i + 4 <= n {
                sets = [
                    step(i, sets[0]),
                    step(i + 1, sets[1]),
                    step(i + 2, sets[2]),
                    step(i + 3, sets[3]),
                ];
                i += 4;
            }
            let rest = n - i;
            if rest > 0 {
                sets[0] = step(i, sets[0]);
            }
            if rest > 1 {
                sets[1] = step(i + 1, sets[1]);
            }
            if rest > 2 {
                sets[2] = step(i + 2, sets[2]);
            }
        }
        sets_total(sets)
    }

    /// The four sets' total, lane `l` `(set0 + set2) + (set1 + set3)`, then [`across`].
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::cpu::kernels) fn sets_total(sets: [__m256; 4]) -> f32 {
        across(_mm256_add_ps(
            _mm256_add_ps(sets[0], sets[2]),
            _mm256_add_ps(sets[1], sets[3]),
        ))
    }

    /// [`super::across`] of a register.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::cpu::kernels) fn across(v: __m256) -> f32 {
        let half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
        _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)))
    }
}

#[cfg(target_arch = "x86_64")]
pub(in crate::cpu::kernels) mod avx512 {
    use super::BLOCK;
    use half::f16;
    use std::arch::x86_64::*;

    /// Blocks `b` and `b + 1`'s lane sums as sixteen floats (`two` false: block `b` only, the
    /// upper eight zero): `dpbusd` sums four products of unsigned `|w|` and `x` carrying `w`'s
    /// sign into each `i32` lane in one instruction, without the `i16` step of AVX2.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI, and the blocks read are in bounds.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn lanes(wq: &[i8], xq: &[i8], b: usize, two: bool) -> __m512 {
        // SAFETY: the caller keeps the blocks read in bounds.
        unsafe {
            let (w, x) = match two {
                true => (
                    _mm512_loadu_si512(wq.as_ptr().add(b * BLOCK).cast()),
                    _mm512_loadu_si512(xq.as_ptr().add(b * BLOCK).cast()),
                ),
                false => (
                    _mm512_zextsi256_si512(_mm256_loadu_si256(wq.as_ptr().add(b * BLOCK).cast())),
                    _mm512_zextsi256_si512(_mm256_loadu_si256(xq.as_ptr().add(b * BLOCK).cast())),
                ),
            };
            let negative = _mm512_movepi8_mask(w);
            let x = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
            let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), x);
            _mm512_cvtepi32_ps(sums)
        }
    }

    /// [`super::row_range`], compiled with the kernel's features so that [`dot`] is inlined
    /// into the loop over the share's rows.
    ///
    /// # Safety
    /// The CPU has every feature named below.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn row_range(
        out: &mut [f32],
        x: &super::Q8Rows,
        w: &super::Q8Matrix,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |wq, ws, xq, xd| unsafe {
            dot(wq, ws, xq, xd)
        })
    }

    /// [`super::dot_reference`] with AVX-512 VNNI.
    ///
    /// # Safety
    /// The CPU has every feature named below (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot(wq: &[i8], ws: &[f16], xq: &[i8], xd: &[f32]) -> f32 {
        let kb = ws.len();
        assert!(wq.len() >= kb * BLOCK && xq.len() >= kb * BLOCK && xd.len() >= kb);
        // SAFETY: blocks `< kb` of both rows are in bounds (asserted).
        unsafe { dot_with(ws, xd, |b, two| lanes(wq, xq, b, two)) }
    }

    /// The sum [`super::dot_reference`] makes of `lanes(b, two)`, blocks `b` and `b + 1`'s
    /// lane sums as sixteen floats (`two` false: block `b`'s, the upper eight +0), for blocks
    /// `0..ws.len()`: two blocks per register, so one register holds sets 0 and 1 (blocks
    /// `4i`, `4i + 1`) and another sets 2 and 3; the scales of sixteen blocks converted and
    /// multiplied at once, each pair's picked by a permute.
    ///
    /// # Safety
    /// The CPU has every feature named below; `xd` holds `ws.len()` scales; `lanes` may be
    /// called for every block `< ws.len()` (and `b + 1` with `two`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(in crate::cpu::kernels) unsafe fn dot_with(
        ws: &[f16],
        xd: &[f32],
        lanes: impl Fn(usize, bool) -> __m512,
    ) -> f32 {
        let kb = ws.len();
        let (mut low, mut high) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        for b0 in (0..kb).step_by(16) {
            let n = (kb - b0).min(16);
            // SAFETY: blocks `b0..b0 + n` are in `ws` and `xd`; the blocks below are `< kb`.
            unsafe {
                let scales = scales16(ws, xd, b0, n);
                let scale = |i: usize| {
                    _mm512_permutexvar_ps(
                        _mm512_add_epi32(pick, _mm512_set1_epi32(i as i32)),
                        scales,
                    )
                };
                // `b0` is a multiple of 16: local pairs at 0, 4, 8, 12 are sets 0/1, those at
                // 2, 6, 10, 14 sets 2/3. A lone last block leaves the upper lanes +0, which
                // adds nothing.
                let step = |i: usize, two: bool, set: __m512| {
                    _mm512_fmadd_ps(lanes(b0 + i, two), scale(i), set)
                };
                let mut i = 0;
                while i + 4 <= n {
                    low = step(i, true, low);
                    high = step(i + 2, true, high);
                    i += 4;
                }
                let rest = n - i;
                if rest > 0 {
                    low = step(i, rest > 1, low);
                }
                if rest > 2 {
                    high = step(i + 2, false, high);
                }
            }
        }
        sets_total(low, high)
    }

    /// Blocks `b0..b0 + n`'s scales `ws[b] · xd[b]` (`n` in `1..=16`), sixteen at a time by
    /// F16C; the lanes past `n` +0 (a block past the row's end then adds +0 to its set, which
    /// changes no sum: a set is never -0).
    ///
    /// Inlined always, with no features of its own: compiled with its caller's.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW; blocks `b0..b0 + n` are in `ws` and `xd`.
    #[inline(always)]
    pub(in crate::cpu::kernels) unsafe fn scales16(
        ws: &[f16],
        xd: &[f32],
        b0: usize,
        n: usize,
    ) -> __m512 {
        debug_assert!((1..=16).contains(&n) && b0 + n <= ws.len().min(xd.len()));
        let mask = ((1u32 << n) - 1) as u16;
        // SAFETY: the masked loads read `ws`/`xd[b0..b0 + n]`, in bounds (the caller's word).
        unsafe {
            let dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, ws.as_ptr().add(b0).cast()));
            let dx = _mm512_maskz_loadu_ps(mask, xd.as_ptr().add(b0));
            _mm512_mul_ps(dw, dx)
        }
    }

    /// The total of the register of sets 0 and 1 (`low`) and that of sets 2 and 3 (`high`):
    /// lane `l` `(set0 + set2) + (set1 + set3)`, then [`super::avx2::across`].
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    pub(in crate::cpu::kernels) fn sets_total(low: __m512, high: __m512) -> f32 {
        let sets = _mm512_add_ps(low, high);
        let upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sets), 1));
        super::avx2::across(_mm256_add_ps(_mm512_castps512_ps256(sets), upper))
    }
}

#[cfg(test)]
pub(in crate::cpu::kernels) mod tests;

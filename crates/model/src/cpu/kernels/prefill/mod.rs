//! A prompt's products by a file's blocks in integers: many activation rows times a matrix of
//! `Q4_0`, `Q5_0`, `Q8_0`, `Q4_1`, `Q5_1`, `Q4_K`, `Q5_K` or `Q6_K` blocks, the activations
//! quantised as a token's are (blocks of 32, [`Q8Rows`]), the products summed in integers by
//! AVX-512 VNNI (or AVX2's byte products, for every type but `Q8_0`), as llama.cpp's prompt is.
//!
//! Every type becomes one shape first, a panel at a time: [`LANES`] weight rows as unsigned
//! bytes `u`, and per group of [`Unpack::GROUP`] values a float scale `s` and (for types with
//! minimums) a float minimum `m`, so that a weight is `s · (u − Z) + m` with `Z` the type's
//! [`Unpack::ZERO`]. The panel interleaves its rows four bytes at a time, so that one vector
//! of bytes holds four values of each of the sixteen rows, and one byte product
//! (`vpdpbusd`) against four activation bytes broadcast adds to all sixteen rows' sums: no
//! sum across a vector, ever. A group's product with an activation block `xd · xq` is then
//!
//! `xd · s · (Σ u · xq − Z · Σ xq) + m · (xd · Σ xq)`
//!
//! the bracket exact in integers (the sum starts at `−Z · Σ xq`), one multiply-add for the
//! scale and one for the minimum. Unpacking costs once per weight per product; the panel
//! (16 rows of a row's bytes and scales) stays in L2 while every activation row goes past it,
//! [`ROWS`] at a time, so each weight vector loaded serves [`ROWS`] products.
//!
//! Outputs differ from a token's kernel only in the order floats are summed (the integer
//! sums are the same); tests hold the vector kernel to [`reference`] bit for bit, and both
//! to the f32 product of the dequantised weights within a bound.

use super::q8::{BLOCK, Q8Matrix, Q8Rows, quantized};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

/// Weight rows a panel interleaves: sixteen 32-bit lanes of an AVX-512 vector.
pub(crate) const LANES: usize = 16;

/// Activation rows a tile multiplies at once: each weight vector loaded serves this many.
pub(crate) const ROWS: usize = 8;

/// A matrix of blocks that a prompt's product can read as bytes and group scales.
pub(crate) trait Unpack: Sync {
    /// Values a group's scale covers: 32, or 16 (`Q6_K`).
    const GROUP: usize;
    /// What every byte stands above: a weight is `scale · (u − ZERO) + minimum`.
    const ZERO: i32;
    /// Whether the groups have minimums (`Q4_1`, `Q5_1`, `Q4_K`, `Q5_K`).
    const MINIMUMS: bool;
    /// The largest byte a row holds: AVX2's byte products (`maddubs`, pairs summed in 16
    /// bits) are exact only up to 63.
    const LARGEST: u8;
    /// `(rows, cols)`.
    fn dims(&self) -> (usize, usize);
    /// Row `j` as bytes `u [cols]`, its groups' scales `[cols / GROUP]` and, with
    /// [`Self::MINIMUMS`], their minimums `[cols / GROUP]` (otherwise left as they are).
    fn unpack_row(&self, j: usize, u: &mut [u8], scales: &mut [f32], minimums: &mut [f32]);
}

impl Unpack for Q8Matrix {
    const GROUP: usize = BLOCK;
    const ZERO: i32 = 128;
    const MINIMUMS: bool = false;
    const LARGEST: u8 = 255;

    fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Each signed byte `q` as the unsigned `q + 128`, `d`.
    fn unpack_row(&self, j: usize, u: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
        let (q, d) = self.row(j);
        u.iter_mut()
            .zip(q)
            .for_each(|(u, &q)| *u = (q as u8) ^ 0x80);
        scales.iter_mut().zip(d).for_each(|(s, d)| *s = d.to_f32());
    }
}

/// Whether this CPU runs the tile kernels `(AVX-512 VNNI, AVX2)`: AVX-512 F and BW with VNNI
/// and FMA (in a build with the `avx512` feature), and AVX2 with FMA.
#[cfg(target_arch = "x86_64")]
fn vector_sets() -> (bool, bool) {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma");
    let vnni = has!("avx512f") && has!("avx512bw") && has!("avx512vnni") && avx2;
    (cfg!(feature = "avx512") && vnni, avx2)
}

/// Whether this CPU runs a prompt's products in integers: with AVX-512 VNNI every type, with
/// AVX2 the types whose bytes stay under 64 (all but `Q8_0`, whose prompt then multiplies its
/// dequantised weights in f32, as every type's does elsewhere).
pub(crate) fn runs() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let (vnni, avx2) = vector_sets();
        vnni || avx2
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`LANES`] rows of a matrix as one kernel reads them: bytes four at a time from each row in
/// turn (`[cols / 4][LANES][4]`), group scales and minimums lane by lane
/// (`[cols / GROUP][LANES]`). Rows past the matrix's end are zeros.
#[derive(Default)]
pub(crate) struct Panel {
    pub q: Vec<u8>,
    pub scales: Vec<f32>,
    pub minimums: Vec<f32>,
    /// The rows unpacked one after another, before they are interleaved.
    rows: Vec<u8>,
    row_scales: Vec<f32>,
    row_minimums: Vec<f32>,
}

impl Panel {
    /// Rows `j0..j0 + LANES` of `w` (those it has).
    pub(crate) fn pack<M: Unpack>(&mut self, w: &M, j0: usize) {
        let (n, k) = w.dims();
        let groups = k / M::GROUP;
        let lanes = n.saturating_sub(j0).min(LANES);
        self.rows.resize(LANES * k, 0);
        self.row_scales.resize(LANES * groups, 0.0);
        self.row_minimums.resize(LANES * groups, 0.0);
        let rows = self.rows.chunks_exact_mut(k);
        let scales = self.row_scales.chunks_exact_mut(groups);
        let minimums = self.row_minimums.chunks_exact_mut(groups);
        for (l, ((u, s), m)) in rows.zip(scales).zip(minimums).enumerate() {
            if l < lanes {
                w.unpack_row(j0 + l, u, s, m);
            } else {
                u.fill(0);
                s.fill(0.0);
                m.fill(0.0);
            }
        }
        self.interleave(k, groups);
    }

    /// The unpacked rows into the kernel's order.
    fn interleave(&mut self, k: usize, groups: usize) {
        self.q.resize(LANES * k, 0);
        #[cfg(target_arch = "x86_64")]
        let done = match vector_sets().0 {
            true => avx512::interleave(&self.rows, k, &mut self.q),
            false => 0,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        interleave_words(&self.rows, k, &mut self.q, done);
        self.scales.resize(LANES * groups, 0.0);
        self.minimums.resize(LANES * groups, 0.0);
        for g in 0..groups {
            for l in 0..LANES {
                self.scales[g * LANES + l] = self.row_scales[l * groups + g];
                self.minimums[g * LANES + l] = self.row_minimums[l * groups + g];
            }
        }
    }
}

/// Words `from..` (four bytes each) of [`LANES`] rows `k` bytes long into `q` in the kernel's
/// order: word `t` of row `l` at `(t · LANES + l) · 4`.
fn interleave_words(rows: &[u8], k: usize, q: &mut [u8], from: usize) {
    for (t, out) in q.chunks_exact_mut(4 * LANES).enumerate().skip(from) {
        for (l, four) in out.chunks_exact_mut(4).enumerate() {
            four.copy_from_slice(&rows[l * k + 4 * t..l * k + 4 * t + 4]);
        }
    }
}

/// What the kernel takes of each activation row's group `g` (`[rows, cols / GROUP]`): the
/// integer sum's start `−Z · Σ xq`, the block's scale `xd`, and `xd · Σ xq` for minimums.
#[derive(Default)]
pub(crate) struct Groups {
    pub start: Vec<i32>,
    pub d: Vec<f32>,
    pub d_sum: Vec<f32>,
}

impl Groups {
    /// The groups of `x`'s rows `cols` long, for a matrix of type `M`.
    pub(crate) fn of<M: Unpack>(&mut self, x: &Q8Rows, cols: usize) {
        let len = x.q.len() / M::GROUP;
        self.start.resize(len, 0);
        self.d.resize(len, 0.0);
        self.d_sum.resize(len, 0.0);
        let per_block = BLOCK / M::GROUP;
        for (g, q) in x.q.chunks_exact(M::GROUP).enumerate() {
            let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
            let d = x.d[g / per_block];
            self.start[g] = -M::ZERO * sum;
            self.d[g] = d;
            self.d_sum[g] = d * sum as f32;
        }
        debug_assert_eq!(x.q.len() % cols, 0);
    }
}

/// A tile's activations: quantised rows `[rows, cols]` and their groups.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'a> {
    pub q: &'a [i8],
    pub groups: &'a Groups,
    pub cols: usize,
}

/// Outputs `[R][LANES]` of activation rows `r0..r0 + R` times a panel.
pub(crate) type TileFn<const R: usize> = fn(&Panel, Tile<'_>, usize, &mut [[f32; LANES]; R]);

/// Asserts every bound a vector tile kernel reads within, for rows `r0..r0 + R` of `x` in
/// groups of `G` (a multiple of `step`, the bytes one of its loads takes a row): whole groups,
/// the panel's `LANES` rows of bytes, scales (and minimums, with `MIN`) for each group, and the
/// tile's rows and their groups. The kernels' `unsafe` reads rest on this one check.
#[cfg(target_arch = "x86_64")]
fn check_tile<const G: usize, const MIN: bool, const R: usize>(
    p: &Panel,
    x: Tile<'_>,
    r0: usize,
    step: usize,
) {
    let k = x.cols;
    let groups = k / G;
    assert!(
        k.is_multiple_of(G) && G.is_multiple_of(step),
        "rows of whole groups"
    );
    assert!(p.q.len() >= LANES * k && p.scales.len() >= LANES * groups);
    assert!(!MIN || p.minimums.len() >= LANES * groups);
    assert!(x.q.len() >= (r0 + R) * k);
    let g = x.groups;
    let len = (r0 + R) * groups;
    assert!(g.start.len() >= len && g.d.len() >= len && g.d_sum.len() >= len);
}

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` (`b` empty: no bias) in integers, the
/// activations quantised per block of 32, where this CPU has a kernel for `M`; false where it
/// has none (nothing written: the caller multiplies the dequantised weights).
pub(crate) fn product<M: Unpack>(out: &mut [f32], x: &[f32], w: &M, b: &[f32]) -> bool {
    match kernels::<M>() {
        Some(tiles) => product_with(out, x, w, b, tiles),
        None => return false,
    }
    true
}

/// [`product`] with the tile kernels `(wide, one)` ([`ROWS`] rows, one row).
pub(crate) fn product_with<M: Unpack>(
    out: &mut [f32],
    x: &[f32],
    w: &M,
    b: &[f32],
    (wide, one): (TileFn<ROWS>, TileFn<1>),
) {
    thread_local! {
        static SCRATCH: std::cell::RefCell<(Panel, Groups)> = std::cell::RefCell::default();
    }
    let (n, k) = w.dims();
    let rows = x.len() / k;
    quantized(x, |xq| {
        SCRATCH.with_borrow_mut(|(panel, groups)| {
            groups.of::<M>(xq, k);
            let tile = Tile {
                q: &xq.q,
                groups,
                cols: k,
            };
            for j0 in (0..n).step_by(LANES) {
                panel.pack(w, j0);
                let lanes = (n - j0).min(LANES);
                let mut put = |r0: usize, results: &[[f32; LANES]]| {
                    for (r, result) in (r0..).zip(results) {
                        let row = &mut out[r * n + j0..r * n + j0 + lanes];
                        for (l, (o, v)) in row.iter_mut().zip(result).enumerate() {
                            *o = v + b.get(j0 + l).copied().unwrap_or(0.0);
                        }
                    }
                };
                let wide_rows = rows - rows % ROWS;
                for r0 in (0..wide_rows).step_by(ROWS) {
                    let mut results = [[0.0; LANES]; ROWS];
                    wide(panel, tile, r0, &mut results);
                    put(r0, &results);
                }
                for r0 in wide_rows..rows {
                    let mut results = [[0.0; LANES]; 1];
                    one(panel, tile, r0, &mut results);
                    put(r0, &results);
                }
            }
        })
    })
}

/// The fastest tile kernels this CPU has for `M`, if any (AVX-512 VNNI, then AVX2).
fn kernels<M: Unpack>() -> Option<(TileFn<ROWS>, TileFn<1>)> {
    vector_kernels::<M>()
        .into_iter()
        .next()
        .map(|(_, tiles)| tiles)
}

/// Every vector kernel this CPU has for `M`, fastest first, with its name.
fn vector_kernels<M: Unpack>() -> Vec<(&'static str, (TileFn<ROWS>, TileFn<1>))> {
    #[cfg(target_arch = "x86_64")]
    {
        let (vnni, avx2) = vector_sets();
        let avx2 = avx2.then(avx2::tiles::<M>).flatten();
        let vnni = vnni.then(avx512::tiles::<M>);
        [("avx512-vnni", vnni), ("avx2", avx2)]
            .into_iter()
            .filter_map(|(name, tiles)| Some((name, tiles?)))
            .collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

/// The numbers every tile kernel computes, in plain Rust: for each lane and row, group by
/// group, the integer sum from its start, then `acc = sum · (s · xd) + acc` and, with
/// minimums, `acc = m · (xd · Σ xq) + acc`, each one fused multiply-add: what the tests hold
/// the vector kernels to.
#[cfg(test)]
pub(crate) fn reference<M: Unpack, const R: usize>(
    p: &Panel,
    x: Tile<'_>,
    r0: usize,
    out: &mut [[f32; LANES]; R],
) {
    let (k, g_len) = (x.cols, M::GROUP);
    let groups = k / g_len;
    for (r, out) in (r0..).zip(out.iter_mut()) {
        for (l, out) in out.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for g in 0..groups {
                let mut sum = x.groups.start[r * groups + g];
                for i in g * g_len..(g + 1) * g_len {
                    let u = p.q[(i / 4 * LANES + l) * 4 + i % 4];
                    sum += i32::from(u) * i32::from(x.q[r * k + i]);
                }
                let d = x.groups.d[r * groups + g];
                acc = (sum as f32).mul_add(p.scales[g * LANES + l] * d, acc);
                if M::MINIMUMS {
                    let m = p.minimums[g * LANES + l];
                    acc = m.mul_add(x.groups.d_sum[r * groups + g], acc);
                }
            }
            *out = acc;
        }
    }
}

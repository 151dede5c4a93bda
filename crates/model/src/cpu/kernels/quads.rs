//! Four blocks a register: the AVX-512 VNNI products of the nibble types (`Q4_0`, `Q5_0`) with
//! one token's `Q8_0` activations, laid out once a product so each weight byte is unpacked in
//! two instructions.
//!
//! A block's 16 bytes hold values `0..16` in their low nibbles and `16..32` in their high ones.
//! Unpacked in value order (what [`super::q8`]'s pairs of blocks want), every two blocks cost a
//! cross-lane permute, a shift, a blend and a mask. Four blocks' 64 bytes are one register
//! instead: its low nibbles (one `and`) are values `0..16` of the four blocks, its high nibbles
//! (a shift and an `and`) values `16..32`. The activations are put in that order once, as
//! [`avx512::Quads`] (with each lane's `Σ zero · x`, which a `dpbusd` then starts from instead
//! of computing it for every row): about half the instructions a weight of the pairwise
//! kernels, 1.3–1.5× faster a product on a Zen 4 (docs/perf/2026-12.md).
//!
//! The floats are the reference's bit for bit ([`super::q8::dot_reference_with`]): a lane's four
//! products are the same four values (`4l..4l + 4` of one block), each block's lanes are
//! multiplied and added in the same order into the same one of four sets, and the sets are
//! put back in the pairwise kernels' registers before the same total.

#[cfg(target_arch = "x86_64")]
pub(in crate::cpu::kernels) mod avx512 {
    use crate::cpu::kernels::q8::BLOCK;
    use crate::cpu::kernels::q8::avx512::{scales16, sets_total};
    use half::f16;
    use std::arch::x86_64::*;

    /// Bytes of a group of four blocks' activations: values `0..16` of each, then `16..32`.
    const GROUP: usize = 4 * BLOCK;

    /// One token's activations `[k]` in groups of four blocks (the last one padded with
    /// zeros): each group's values `0..16` of its four blocks (64 bytes), then `16..32` (64
    /// bytes); and for each of those registers its sixteen lanes' `-Σ zero · x` (the `i32`
    /// that a lane's `dpbusd` starts from, so unsigned weights `q` sum to `Σ (q - zero) · x`).
    pub(in crate::cpu::kernels) struct Quads {
        x: Vec<i8>,
        start: Vec<i32>,
    }

    impl Quads {
        /// `xq [kb · 32]`'s blocks for weights stored as `q` with value `q - zero`.
        ///
        /// # Safety
        /// The CPU has AVX-512 F, BW and VNNI.
        #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
        pub(in crate::cpu::kernels) fn new(xq: &[i8], zero: u8) -> Self {
            let groups = xq.len().div_ceil(GROUP);
            let mut quads = Self {
                x: vec![0; groups * 2 * 64],
                start: vec![0; groups * 2 * 16],
            };
            let mut padded = [0i8; GROUP];
            for (g, x) in xq.chunks(GROUP).enumerate() {
                padded.fill(0);
                padded[..x.len()].copy_from_slice(x);
                // SAFETY: `padded` is 128 bytes; group `g`'s 128 bytes and 32 `i32`s are in
                // `quads`' vectors, sized for every group above.
                unsafe {
                    let a = _mm512_loadu_si512(padded.as_ptr().cast());
                    let b = _mm512_loadu_si512(padded.as_ptr().add(64).cast());
                    // 128-bit lanes 0 and 2 of each: the blocks' values 0..16; 1 and 3: 16..32.
                    let low = _mm512_shuffle_i64x2(a, b, 0b10_00_10_00);
                    let high = _mm512_shuffle_i64x2(a, b, 0b11_01_11_01);
                    for (i, v) in [low, high].into_iter().enumerate() {
                        let r = 2 * g + i;
                        _mm512_storeu_si512(quads.x.as_mut_ptr().add(r * 64).cast(), v);
                        let zeros = _mm512_dpbusd_epi32(
                            _mm512_setzero_si512(),
                            _mm512_set1_epi8(zero as i8),
                            v,
                        );
                        let start = _mm512_sub_epi32(_mm512_setzero_si512(), zeros);
                        _mm512_storeu_si512(quads.start.as_mut_ptr().add(r * 16).cast(), start);
                    }
                }
            }
            quads
        }

        /// Blocks it holds, with the padding.
        pub(in crate::cpu::kernels) fn blocks(&self) -> usize {
            self.x.len() / GROUP * 4
        }

        /// Group `g`'s two registers of activations and their lanes' starts.
        ///
        /// # Safety
        /// The CPU has AVX-512 F, and `g` is one of the groups.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn group(&self, g: usize) -> [(__m512i, __m512i); 2] {
            debug_assert!(2 * g + 1 < self.x.len() / 64);
            // SAFETY: the caller keeps `g` among the groups.
            unsafe {
                let at = |r: usize| {
                    (
                        _mm512_loadu_si512(self.x.as_ptr().add(r * 64).cast()),
                        _mm512_loadu_si512(self.start.as_ptr().add(r * 16).cast()),
                    )
                };
                [at(2 * g), at(2 * g + 1)]
            }
        }
    }

    /// The low and high nibbles of blocks `b..b + n` (`n` in `1..=4`) of a row's 16-byte blocks
    /// `nibbles`: the two registers [`dot`]'s `weights` gives for `Q4_0`, and `Q5_0`'s before
    /// its fifth bits.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW, and blocks `b..b + n` are in `nibbles`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(in crate::cpu::kernels) unsafe fn nibbles(
        nibbles: &[u8],
        b: usize,
        n: usize,
    ) -> [__m512i; 2] {
        // SAFETY: the caller keeps blocks `b..b + n` in bounds; a short group's load is masked.
        let bytes = unsafe {
            let at = nibbles.as_ptr().add(b * 16);
            match n {
                4 => _mm512_loadu_si512(at.cast()),
                _ => _mm512_maskz_loadu_epi8((1u64 << (16 * n)) - 1, at.cast()),
            }
        };
        let mask = _mm512_set1_epi8(0x0F);
        [
            _mm512_and_si512(bytes, mask),
            _mm512_and_si512(_mm512_srli_epi16(bytes, 4), mask),
        ]
    }

    /// The sum [`crate::cpu::kernels::q8::dot_reference_with`] makes of a row of `ws.len()`
    /// blocks (`weights`) times the activations `x` (scales `xd`): each group's two registers
    /// `dpbusd` from their starts, as floats, times their blocks' scales into the four sets'
    /// lanes `0..4` (`low`) and `4..8` (`high`), then the pairwise kernels' total. (Two rows
    /// side by side, sharing the activations' loads, measured slower on a Zen 4.)
    ///
    /// Inlined always, with no features of its own: it is compiled with its caller's, which
    /// `weights` may need more of.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C; `x` was made from
    /// `ws.len()` blocks, `xd` holds as many scales, and `weights(b, n)` may be called for
    /// every group of them: blocks `b..b + n` (`n` in `1..=4`) of the row as unsigned bytes `q`
    /// in a group's order, values `0..16` of each block in the first register, `16..32` in the
    /// second (past `n` anything not read out of bounds: their activations are zero).
    #[inline(always)]
    pub(in crate::cpu::kernels) unsafe fn dot(
        ws: &[f16],
        xd: &[f32],
        x: &Quads,
        weights: impl Fn(usize, usize) -> [__m512i; 2],
    ) -> f32 {
        let kb = ws.len();
        assert!(xd.len() >= kb && x.blocks() >= kb);
        // SAFETY: the CPU has the features (the caller's word).
        let (mut low, mut high) = unsafe { (_mm512_setzero_ps(), _mm512_setzero_ps()) };
        let pick = unsafe { _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) };
        for b0 in (0..kb).step_by(16) {
            let n = (kb - b0).min(16);
            // SAFETY: blocks `b0..b0 + n` are in `ws` and `xd`; the groups below hold blocks
            // `< kb` (the caller's promise for `x` and `weights`).
            unsafe {
                // Blocks past `n` have scale +0 and activations 0: their lanes add +0.
                let scales = scales16(ws, xd, b0, n);
                for i in (0..n).step_by(4) {
                    let [(xl, sl), (xh, sh)] = x.group((b0 + i) / 4);
                    let [ql, qh] = weights(b0 + i, (n - i).min(4));
                    let at = _mm512_add_epi32(pick, _mm512_set1_epi32(i as i32));
                    let scale = _mm512_permutexvar_ps(at, scales);
                    let lanes = |start, q, x| _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, q, x));
                    low = _mm512_fmadd_ps(lanes(sl, ql, xl), scale, low);
                    high = _mm512_fmadd_ps(lanes(sh, qh, xh), scale, high);
                }
            }
        }
        // SAFETY: as above.
        unsafe { total(low, high) }
    }

    /// A row's total from its sets' lanes `0..4` (`low`: 128-bit lane `s` for set `s`) and
    /// `4..8` (`high`), put back in the pairwise kernels' registers (sets 0 and 1 in one, 2
    /// and 3 in another) for their total.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn total(low: __m512, high: __m512) -> f32 {
        let sets01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
        let sets23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
        let (low, high) = (_mm512_castps_si512(low), _mm512_castps_si512(high));
        sets_total(
            _mm512_castsi512_ps(_mm512_permutex2var_epi64(low, sets01, high)),
            _mm512_castsi512_ps(_mm512_permutex2var_epi64(low, sets23, high)),
        )
    }
}

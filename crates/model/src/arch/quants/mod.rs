//! GGUF's quantised types as blocks of bytes ([`BlockType`]): each written by ggml's
//! reference quantiser ([`reference`]) and read by its dequantiser ([`dequant`]), bit for bit
//! as llama.cpp writes and reads them. The decoder multiplies by them (`cpu/kernels/`), the
//! trainer's exports write them, and a LoRA run's frozen base is rounded to and held in them.

mod dequant;
mod reference;

pub use reference::SUPER;
pub(crate) use reference::{quantize_q4_0, quantize_q5_0};

use crate::arch::q8_0::{BLOCK, q8_0_block};

/// A GGUF type of blocks: `Q8_0`, `Q5_0`, `Q4_0`, `Q4_1` and `Q5_1` (32 values a block), and
/// the k-quants `Q4_K`, `Q5_K` and `Q6_K` (256 a super-block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum BlockType {
    Q8_0,
    Q5_0,
    Q4_0,
    Q4_1,
    Q5_1,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl BlockType {
    /// Values in one of the type's blocks: 256 for the k-quants, 32 for the others.
    pub fn values(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q5_0 | Self::Q4_0 | Self::Q4_1 | Self::Q5_1 => BLOCK,
            Self::Q4_K | Self::Q5_K | Self::Q6_K => SUPER,
        }
    }

    /// The type llama.cpp writes instead where a row is not whole blocks of this one (its
    /// `tensor_type_fallback`: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0); `None` for the types of
    /// blocks of 32, which have none (llama.cpp then keeps such a matrix in f16).
    pub fn fallback(self) -> Option<Self> {
        match self {
            Self::Q4_K => Some(Self::Q5_0),
            Self::Q5_K => Some(Self::Q5_1),
            Self::Q6_K => Some(Self::Q8_0),
            Self::Q8_0 | Self::Q5_0 | Self::Q4_0 | Self::Q4_1 | Self::Q5_1 => None,
        }
    }

    /// `values` (whole blocks: a multiple of [`values`](Self::values)) in the type's blocks, one
    /// after another, as GGUF stores them, by ggml's reference quantiser.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        assert!(values.len().is_multiple_of(self.values()), "whole blocks");
        let mut out = Vec::new();
        for x in values.chunks(self.values()) {
            match self {
                Self::Q8_0 => {
                    let (d, q) = q8_0_block(x.try_into().expect("a block"));
                    out.extend_from_slice(&d.to_le_bytes());
                    out.extend(q.iter().map(|&q| q as u8));
                }
                Self::Q5_0 => {
                    let mut q = [0; BLOCK / 2];
                    let (d, high) = quantize_q5_0(x, &mut q);
                    out.extend_from_slice(&d.to_le_bytes());
                    out.extend_from_slice(&high.to_le_bytes());
                    out.extend_from_slice(&q);
                }
                Self::Q4_0 => {
                    let mut q = [0; BLOCK / 2];
                    let d = quantize_q4_0(x, &mut q);
                    out.extend_from_slice(&d.to_le_bytes());
                    out.extend_from_slice(&q);
                }
                Self::Q4_1 => reference::minimum_block::<4>(x, &mut out),
                Self::Q5_1 => reference::minimum_block::<5>(x, &mut out),
                Self::Q4_K => reference::k_block::<15>(x, &mut out),
                Self::Q5_K => reference::k_block::<31>(x, &mut out),
                Self::Q6_K => reference::q6_k_block(x, &mut out),
            }
        }
        out
    }

    /// `bytes` (whole blocks of the type, as [`encode`](Self::encode) writes them) as their
    /// values into `out`, as ggml's `dequantize_row_*` computes them.
    pub fn decode(self, bytes: &[u8], out: &mut [f32]) {
        let blocks = bytes.chunks_exact(self.block_bytes());
        for (b, out) in blocks.zip(out.chunks_exact_mut(self.values())) {
            match self {
                Self::Q8_0 => dequant::q8_0(b, out),
                Self::Q5_0 => dequant::q5_0(b, out),
                Self::Q4_0 => dequant::q4_0(b, out),
                Self::Q4_1 => dequant::minimums::<false>(b, out),
                Self::Q5_1 => dequant::minimums::<true>(b, out),
                Self::Q4_K => dequant::k_minimums::<false>(b, out),
                Self::Q5_K => dequant::k_minimums::<true>(b, out),
                Self::Q6_K => dequant::q6_k(b, out),
            }
        }
    }

    /// Bytes of one of the type's blocks.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 34,
            Self::Q5_0 => 22,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_1 => 24,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
        }
    }

    /// [`encode`](Self::encode) of rows `n_in` long, the rows split over the machine's cores
    /// (the same bytes: each block is quantised on its own).
    pub fn encode_rows(self, values: &[f32], n_in: usize) -> Vec<u8> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rows = values.len() / n_in.max(1);
        let per = rows.div_ceil(threads).max(1) * n_in.max(1);
        std::thread::scope(|s| {
            let parts: Vec<_> = values
                .chunks(per)
                .map(|part| s.spawn(move || self.encode(part)))
                .collect();
            let parts = parts.into_iter().map(|p| p.join().expect("no panic"));
            parts.collect::<Vec<_>>().concat()
        })
    }
}

/// `w [n_in, n_out]` rounded to `kind`'s blocks along each output's inputs (`n_in` whole
/// blocks of it), by its quantiser until its blocks give the values back: the values a LoRA
/// run's frozen base held in those blocks computes with. One rounding almost always is that
/// point; where quantising a row's rounding picks other scales (k-quants' fitted ones can),
/// the row is rounded again (at most a few times; the engine keeps a row still moving in f32).
pub(crate) fn rounded(w: &[f32], n_in: usize, kind: BlockType) -> Vec<f32> {
    let n_out = w.len() / n_in;
    let mut rows: Vec<f32> = (0..n_out * n_in)
        .map(|k| w[(k % n_in) * n_out + k / n_in])
        .collect();
    let mut back = vec![0.0; rows.len()];
    for _ in 0..ROUNDS {
        kind.decode(&kind.encode_rows(&rows, n_in), &mut back);
        let settled = back == rows;
        std::mem::swap(&mut rows, &mut back);
        if settled {
            break;
        }
    }
    (0..w.len())
        .map(|k| rows[(k % n_out) * n_in + k / n_out])
        .collect()
}

/// Roundings at most, in [`rounded`].
const ROUNDS: usize = 4;

#[cfg(test)]
mod tests {
    use super::reference::nearest_int;
    use super::*;

    /// `len` values shaped like a trained matrix's (a sum of three uniforms: bell-shaped, a few
    /// larger), the same on every run.
    fn weights(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut uniform = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        (0..len)
            .map(|_| 0.03 * (uniform() + uniform() + uniform()))
            .collect()
    }

    /// `values` encoded as `kind` and read back.
    fn round_trip(kind: BlockType, values: &[f32]) -> Vec<f32> {
        let bytes = kind.encode(values);
        assert_eq!(
            bytes.len(),
            values.len() / kind.values() * kind.block_bytes()
        );
        let mut out = vec![0.0; values.len()];
        kind.decode(&bytes, &mut out);
        out
    }

    /// The root-mean-square error of `back` against `x`, relative to `x`'s own.
    fn relative_rms(x: &[f32], back: &[f32]) -> f64 {
        let square = |it: &mut dyn Iterator<Item = f64>| it.map(|v| v * v).sum::<f64>();
        let err = square(&mut x.iter().zip(back).map(|(&a, &b)| f64::from(a - b)));
        let own = square(&mut x.iter().map(|&a| f64::from(a)));
        (err / own).sqrt()
    }

    /// Each type gives its values back as its bits allow: the more bits, the closer; and the
    /// k-quants' fitted scales closer than the plain minimum and step of `Q4_1`/`Q5_1` at the
    /// same bits.
    #[test]
    fn each_type_gives_its_values_back_within_its_bits() {
        let x = weights(256 * 64, 7);
        let q4_1 = relative_rms(&x, &round_trip(BlockType::Q4_1, &x));
        let q5_1 = relative_rms(&x, &round_trip(BlockType::Q5_1, &x));
        let q4_k = relative_rms(&x, &round_trip(BlockType::Q4_K, &x));
        let q5_k = relative_rms(&x, &round_trip(BlockType::Q5_K, &x));
        let q6_k = relative_rms(&x, &round_trip(BlockType::Q6_K, &x));
        // Uniform steps over a bell's range: about range / (2^bits · √12) of its spread.
        assert!(q4_1 < 0.12 && q5_1 < 0.06, "{q4_1} {q5_1}");
        assert!(
            q4_k < 0.12 && q5_k < 0.06 && q6_k < 0.03,
            "{q4_k} {q5_k} {q6_k}"
        );
        assert!(q6_k < q5_k && q5_k < q4_k && q5_1 < q4_1);
        assert!(q4_k < q4_1 && q5_k < q5_1, "{q4_k} {q4_1} {q5_k} {q5_1}");
    }

    /// Blocks of zeros, of one value, of values of one sign, and with an outlier: the cases
    /// that take the quantisers' special branches.
    #[test]
    fn special_blocks_come_back_as_they_should() {
        let zeros = vec![0.0; 256];
        for back in [
            round_trip(BlockType::Q4_K, &zeros),
            round_trip(BlockType::Q5_K, &zeros),
            round_trip(BlockType::Q6_K, &zeros),
            round_trip(BlockType::Q4_1, &zeros),
        ] {
            assert!(back.iter().all(|&v| v == 0.0));
        }
        assert!(BlockType::Q6_K.encode(&zeros).iter().all(|&b| b == 0));
        // One positive value: the minimum is clamped at zero, so Q4_K's levels reach it.
        let same = vec![0.5; 256];
        let back = round_trip(BlockType::Q4_K, &same);
        assert!(
            back.iter().all(|&v| (v - 0.5).abs() < 0.5 / 15.0),
            "{back:?}"
        );
        let mut outlier = weights(256, 3);
        outlier[17] = 3.0;
        for back in [
            round_trip(BlockType::Q4_K, &outlier),
            round_trip(BlockType::Q6_K, &outlier),
        ] {
            assert!((back[17] - 3.0).abs() < 0.2, "{}", back[17]);
        }
    }

    /// C's rounding through the mantissa: halves to even, as ggml's `nearest_int`.
    #[test]
    fn nearest_int_rounds_halves_to_even() {
        let cases = [
            (2.5, 2),
            (3.5, 4),
            (-2.5, -2),
            (-3.5, -4),
            (0.49, 0),
            (7.51, 8),
        ];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    /// Rows quantised over several threads are the bytes of one.
    #[test]
    fn rows_over_threads_are_the_bytes_of_one() {
        let x = weights(256 * 37, 5);
        for kind in [BlockType::Q4_K, BlockType::Q6_K, BlockType::Q5_1] {
            assert_eq!(kind.encode_rows(&x, 256), kind.encode(&x), "{kind:?}");
            assert_eq!(kind.encode_rows(&x, kind.values()), kind.encode(&x));
        }
    }

    /// llama.cpp's fallbacks, and each type's blocks the size GGUF gives them.
    #[test]
    fn fallbacks_and_block_sizes_are_llama_cpps() {
        assert_eq!(BlockType::Q4_K.fallback(), Some(BlockType::Q5_0));
        assert_eq!(BlockType::Q5_K.fallback(), Some(BlockType::Q5_1));
        assert_eq!(BlockType::Q6_K.fallback(), Some(BlockType::Q8_0));
        let x = weights(256, 1);
        let sizes = [
            (BlockType::Q8_0, 34 * 8),
            (BlockType::Q5_0, 22 * 8),
            (BlockType::Q4_0, 18 * 8),
            (BlockType::Q4_1, 20 * 8),
            (BlockType::Q5_1, 24 * 8),
            (BlockType::Q4_K, 144),
            (BlockType::Q5_K, 176),
            (BlockType::Q6_K, 210),
        ];
        for (kind, bytes) in sizes {
            assert_eq!(kind.encode(&x).len(), bytes, "{kind:?}");
        }
    }
}

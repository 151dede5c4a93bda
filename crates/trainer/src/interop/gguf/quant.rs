//! f32 values to and from GGUF's storage types.
//!
//! Read: every type of [`TensorType`], each block dequantised as ggml's `dequantize_row_*`
//! does it (the same f32 operations in the same order). Written: F32, F16, BF16 and every
//! quantised type (`Q8_0`, `Q5_0`, `Q4_0`, `Q4_1`, `Q5_1`, `Q4_K`, `Q5_K`, `Q6_K`), each by
//! ggml's reference quantiser ([`BlockType::encode`]: what llama.cpp's `llama_model_quantize`
//! writes without an importance matrix; `tests/gguf_llamacpp.rs` compares the bytes).
//!
//! `Q8_0` is ggml's block of 32 values: one f16 scale `d` then 32 signed bytes `q`, each value
//! `q · d`. It is written bit for bit as ggml's reference quantiser (`quantize_row_q8_0_ref`)
//! writes it: `d = max|x| / 127` in f32, rounded to f16 (nearest, ties to even); each
//! `q = round(x · (1/d))` with ties away from zero (C's `roundf`), `1/d` taken from the f32 `d`.

use anyhow::{Result, bail};
use half::{bf16, f16};
use tinygpt_model::BlockType;

use super::file::TensorType;

/// `values` stored as `kind` (for the quantised types, whole blocks of it).
pub fn encode(values: &[f32], kind: TensorType) -> Result<Vec<u8>> {
    Ok(match kind {
        TensorType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        TensorType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        TensorType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        TensorType::Q8_0
        | TensorType::Q5_0
        | TensorType::Q4_0
        | TensorType::Q4_1
        | TensorType::Q5_1
        | TensorType::Q4_K
        | TensorType::Q5_K
        | TensorType::Q6_K => {
            let block = block_type(kind).expect("a quantised type");
            if !values.len().is_multiple_of(block.values()) {
                bail!(
                    "{} values are not whole {} blocks",
                    values.len(),
                    kind.name()
                );
            }
            block.encode_rows(values, block.values())
        }
    })
}

/// The decoder's type for a quantised GGUF type (`None` for the float types).
pub(crate) fn block_type(kind: TensorType) -> Option<BlockType> {
    match kind {
        TensorType::Q8_0 => Some(BlockType::Q8_0),
        TensorType::Q5_0 => Some(BlockType::Q5_0),
        TensorType::Q4_0 => Some(BlockType::Q4_0),
        TensorType::Q4_1 => Some(BlockType::Q4_1),
        TensorType::Q5_1 => Some(BlockType::Q5_1),
        TensorType::Q4_K => Some(BlockType::Q4_K),
        TensorType::Q5_K => Some(BlockType::Q5_K),
        TensorType::Q6_K => Some(BlockType::Q6_K),
        TensorType::F32 | TensorType::F16 | TensorType::BF16 => None,
    }
}

/// The f32 values of `bytes` stored as `kind` (the quantised types by ggml's dequantisers,
/// [`BlockType::decode`]).
pub fn decode(bytes: &[u8], kind: TensorType) -> Result<Vec<f32>> {
    let (block, size) = kind.block();
    if !bytes.len().is_multiple_of(size) {
        bail!(
            "{} bytes do not hold whole {} blocks of {size}",
            bytes.len(),
            kind.name()
        );
    }
    let values = bytes.len() / size * block;
    Ok(match kind {
        TensorType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        TensorType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        TensorType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        TensorType::Q8_0
        | TensorType::Q5_0
        | TensorType::Q4_0
        | TensorType::Q4_1
        | TensorType::Q5_1
        | TensorType::Q4_K
        | TensorType::Q5_K
        | TensorType::Q6_K => {
            let mut out = vec![0.0; values];
            block_type(kind)
                .expect("a quantised type")
                .decode(bytes, &mut out);
            out
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's reference quantiser, written out for one block with its C types: the scale in f32,
    /// `roundf` rounding halves away from zero.
    #[test]
    fn q8_0_rounds_as_ggml_does() {
        // A scale of exactly 1 (127 / 127), so each value's rounding is visible as such.
        let mut x = [0.0f32; 32];
        x[..7].copy_from_slice(&[127.0, -127.0, 0.5, -0.5, 2.5, -2.5, 1.49]);
        let bytes = encode(&x, TensorType::Q8_0).unwrap();
        assert_eq!(bytes.len(), 34);
        assert_eq!(f16::from_le_bytes([bytes[0], bytes[1]]), f16::ONE);
        let q: Vec<i8> = bytes[2..].iter().map(|&b| b as i8).collect();
        // Ties away from zero (2.5 -> 3), not to even.
        assert_eq!(&q[..8], &[127, -127, 1, -1, 3, -3, 1, 0]);
        let back = decode(&bytes, TensorType::Q8_0).unwrap();
        assert_eq!(&back[..4], &[127.0, -127.0, 1.0, -1.0]);
        // A scale f16 cannot hold exactly: rounded to nearest, and the values divided by the
        // f32 scale, not the rounded one.
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.0173).collect();
        let bytes = encode(&x, TensorType::Q8_0).unwrap();
        let d = 16.0f32 * 0.0173 / 127.0;
        assert_eq!(f16::from_le_bytes([bytes[0], bytes[1]]), f16::from_f32(d));
        for (i, &v) in x.iter().enumerate() {
            assert_eq!(bytes[2 + i] as i8, (v * (1.0 / d)).round() as i8);
        }
    }

    /// `Q5_0` and `Q4_0` are written in GGUF's block layout (read back by the reader, which
    /// follows ggml's `dequantize_row_*`), within half a step of each value (a whole step for
    /// the top of the range: the scale is signed, so a value as large as the largest but of
    /// the other sign stops one step short), and a file's
    /// blocks read and written again are the same bytes: the reference quantiser maps its own
    /// values back to themselves (the largest magnitude sets the scale exactly).
    #[test]
    fn q5_0_and_q4_0_are_written_as_ggml_reads_them() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) / 3.0)
            .collect();
        for (kind, size, steps) in [(TensorType::Q5_0, 22, 16.0), (TensorType::Q4_0, 18, 8.0)] {
            let bytes = encode(&x, kind).unwrap();
            assert_eq!(bytes.len(), 3 * size, "{kind:?}");
            let back = decode(&bytes, kind).unwrap();
            for (block, values) in x.chunks(32).zip(back.chunks(32)) {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let step = amax / steps;
                for (a, b) in block.iter().zip(values) {
                    let bound = if a.abs() > amax - step {
                        step
                    } else {
                        step / 2.0
                    };
                    assert!((a - b).abs() <= bound * 1.001, "{kind:?}: {a} {b}");
                }
            }
            assert_eq!(
                encode(&back, kind).unwrap(),
                bytes,
                "{kind:?} written again"
            );
        }
    }

    #[test]
    fn an_all_zero_block_has_a_zero_scale() {
        let bytes = encode(&[0.0; 32], TensorType::Q8_0).unwrap();
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn float_types_round_trip() {
        let x = [0.1f32, -2.5, 65504.0, 1e-8];
        for kind in [TensorType::F32, TensorType::F16, TensorType::BF16] {
            let back = decode(&encode(&x, kind).unwrap(), kind).unwrap();
            for (a, b) in x.iter().zip(&back) {
                let scale = match kind {
                    TensorType::F32 => 0.0,
                    TensorType::F16 => 1e-3,
                    _ => 1e-2,
                };
                assert!((a - b).abs() <= scale * a.abs() + 1e-7, "{kind:?} {a} {b}");
            }
        }
        assert!(decode(&[0; 3], TensorType::F16).is_err());
    }

    /// One block of each read-only type, built by hand, against ggml's formulas worked out
    /// here; `tests/gguf.rs` checks random blocks against llama.cpp's Python reader.
    #[test]
    fn q4_0_q4_k_and_q6_k_blocks_decode_as_ggml_does() {
        let mut q4_0 = vec![0u8; 18];
        q4_0[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        q4_0[2] = 0x8F; // value 0: 15 - 8; value 16: 8 - 8
        q4_0[3] = 0x01; // value 1: 1 - 8; value 17: 0 - 8
        let v = decode(&q4_0, TensorType::Q4_0).unwrap();
        assert_eq!(
            (v.len(), v[0], v[16], v[1], v[17]),
            (32, 3.5, 0.0, -3.5, -4.0)
        );

        let mut q4_k = vec![0u8; 144];
        q4_k[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        q4_k[2..4].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        let scales = &mut q4_k[4..16];
        scales[0] = 0b11_000011; // group 0: scale 3; its top bits are group 4's scale's
        scales[4] = 0b01_000001; // group 0: minimum 1; its top bits are group 4's minimum's
        scales[8] = 0x52; // group 4: scale 2 | 3 << 4 = 50, minimum 5 | 1 << 4 = 21
        q4_k[16] = 0x74; // group 0 value 0: nibble 4; group 1 value 0: nibble 7
        q4_k[16 + 64] = 0x0A; // group 4 value 0: nibble 10
        let v = decode(&q4_k, TensorType::Q4_K).unwrap();
        assert_eq!(v.len(), 256);
        assert_eq!(v[0], 0.25 * 3.0 * 4.0 - 2.0 * 1.0);
        assert_eq!(v[32], 0.0, "group 1: scale and minimum 0");
        assert_eq!(v[128], 0.25 * 50.0 * 10.0 - 2.0 * 21.0);

        let mut q6_k = vec![0u8; 210];
        q6_k[208..].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        q6_k[192] = 3; // scale of values 0..16
        q6_k[194] = (-2i8) as u8; // scale of values 32..48
        q6_k[0] = 0x05; // value 0: low 5; value 64: low 0
        q6_k[128] = 0b0000_1011; // value 0: high 3; value 32: high 2
        q6_k[32] = 0x01; // value 32: low 1
        let v = decode(&q6_k, TensorType::Q6_K).unwrap();
        assert_eq!(v.len(), 256);
        assert_eq!(v[0], 0.5 * 3.0 * ((5 | 3 << 4) - 32) as f32);
        assert_eq!(v[32], 0.5 * -2.0 * ((1 | 2 << 4) - 32) as f32);
        assert_eq!(v[64], 0.0, "scale 0");
    }

    /// The types llama.cpp falls back to (and `Q4_1`, `Q5_K`), one block each built by hand,
    /// against ggml's formulas worked out here.
    #[test]
    fn q4_1_q5_0_q5_1_and_q5_k_blocks_decode_as_ggml_does() {
        let f16 = |v: f32| f16::from_f32(v).to_le_bytes();
        let mut q4_1 = vec![0u8; 20];
        q4_1[..2].copy_from_slice(&f16(0.5));
        q4_1[2..4].copy_from_slice(&f16(-1.0));
        q4_1[4] = 0x3F; // value 0: nibble 15; value 16: nibble 3
        let v = decode(&q4_1, TensorType::Q4_1).unwrap();
        assert_eq!((v.len(), v[0], v[16], v[1]), (32, 6.5, 0.5, -1.0));

        // Fifth bits: value 0's (bit 0) and value 17's (bit 17).
        let high = (1u32 | 1 << 17).to_le_bytes();
        let mut q5_0 = vec![0u8; 22];
        q5_0[..2].copy_from_slice(&f16(0.25));
        q5_0[2..6].copy_from_slice(&high);
        q5_0[6] = 0x02; // value 0: nibble 2; value 16: nibble 0
        q5_0[7] = 0x31; // value 1: nibble 1; value 17: nibble 3
        let v = decode(&q5_0, TensorType::Q5_0).unwrap();
        assert_eq!(v.len(), 32);
        assert_eq!(
            (v[0], v[16], v[1], v[17]),
            (
                ((2 | 16) - 16) as f32 * 0.25,
                -16.0 * 0.25,
                (1 - 16) as f32 * 0.25,
                ((3 | 16) - 16) as f32 * 0.25
            )
        );

        let mut q5_1 = vec![0u8; 24];
        q5_1[..2].copy_from_slice(&f16(0.5));
        q5_1[2..4].copy_from_slice(&f16(2.0));
        q5_1[4..8].copy_from_slice(&high);
        q5_1[8] = 0x02;
        q5_1[9] = 0x31;
        let v = decode(&q5_1, TensorType::Q5_1).unwrap();
        assert_eq!(
            (v[0], v[16], v[1], v[17]),
            (18.0 * 0.5 + 2.0, 2.0, 1.0 * 0.5 + 2.0, 19.0 * 0.5 + 2.0)
        );

        // Q4_K's scales (group 0: scale 3, minimum 1; group 4: 50 and 21), and fifth bits: byte
        // 0's bit 0 (group 0, value 0) and bit 5 (group 5, value 0).
        let mut q5_k = vec![0u8; 176];
        q5_k[..2].copy_from_slice(&f16(0.25));
        q5_k[2..4].copy_from_slice(&f16(2.0));
        let scales = &mut q5_k[4..16];
        scales[0] = 0b11_000011;
        scales[4] = 0b01_000001;
        scales[8] = 0x52;
        scales[9] = 0x07; // group 5: scale 7 (| 0 << 4), minimum 0
        q5_k[16] = 0b10_0001;
        q5_k[48] = 0x74; // group 0 value 0: nibble 4; group 1 value 0: nibble 7
        q5_k[48 + 64] = 0x5A; // group 4 value 0: nibble 10; group 5 value 0: nibble 5
        let v = decode(&q5_k, TensorType::Q5_K).unwrap();
        assert_eq!(v.len(), 256);
        assert_eq!(v[0], 0.25 * 3.0 * 20.0 - 2.0 * 1.0);
        assert_eq!(v[32], 0.0, "group 1: scale and minimum 0");
        assert_eq!(v[128], 0.25 * 50.0 * 10.0 - 2.0 * 21.0);
        assert_eq!(v[160], 0.25 * 7.0 * 21.0);
        for kind in [TensorType::Q4_1, TensorType::Q5_1, TensorType::Q5_K] {
            let err = encode(&v[..100], kind).unwrap_err().to_string();
            assert!(err.contains("not whole"), "{err}");
        }
        assert!(decode(&q5_k[..175], TensorType::Q5_K).is_err());
    }
}

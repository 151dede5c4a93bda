//! f32 values to and from GGUF's storage types.
//!
//! `Q8_0` is ggml's block of 32 values: one f16 scale `d` then 32 signed bytes `q`, each value
//! `q · d`. It is written bit for bit as ggml's reference quantiser (`quantize_row_q8_0_ref`)
//! writes it: `d = max|x| / 127` in f32, rounded to f16 (nearest, ties to even); each
//! `q = round(x · (1/d))` with ties away from zero (C's `roundf`), `1/d` taken from the f32 `d`.

use anyhow::{Result, bail};
use half::{bf16, f16};

use super::file::TensorType;

/// Values per `Q8_0` block.
pub const Q8_0_BLOCK: usize = 32;

/// `values` stored as `kind` (for `Q8_0`, their count a multiple of 32).
pub fn encode(values: &[f32], kind: TensorType) -> Vec<u8> {
    match kind {
        TensorType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        TensorType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        TensorType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        TensorType::Q8_0 => values.chunks(Q8_0_BLOCK).flat_map(q8_0_block).collect(),
    }
}

/// One block of 32 values as `Q8_0`'s 34 bytes.
fn q8_0_block(x: &[f32]) -> [u8; 34] {
    debug_assert_eq!(x.len(), Q8_0_BLOCK);
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut block = [0u8; 34];
    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (q, &v) in block[2..].iter_mut().zip(x) {
        // |v · id| <= 127 (up to rounding of `id`, which `as` saturates).
        *q = ((v * id).round() as i8) as u8;
    }
    block
}

/// The f32 values of `bytes` stored as `kind`.
pub fn decode(bytes: &[u8], kind: TensorType) -> Result<Vec<f32>> {
    let (block, size) = kind.block();
    if !bytes.len().is_multiple_of(size) {
        bail!(
            "{} bytes do not hold whole {} blocks of {size}",
            bytes.len(),
            kind.name()
        );
    }
    let mut out = Vec::with_capacity(bytes.len() / size * block);
    for b in bytes.chunks_exact(size) {
        match kind {
            TensorType::F32 => out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            TensorType::F16 => out.push(f16::from_le_bytes([b[0], b[1]]).to_f32()),
            TensorType::BF16 => out.push(bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            TensorType::Q8_0 => {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                out.extend(b[2..].iter().map(|&q| f32::from(q as i8) * d));
            }
        }
    }
    Ok(out)
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
        let bytes = encode(&x, TensorType::Q8_0);
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
        let bytes = encode(&x, TensorType::Q8_0);
        let d = 16.0f32 * 0.0173 / 127.0;
        assert_eq!(f16::from_le_bytes([bytes[0], bytes[1]]), f16::from_f32(d));
        for (i, &v) in x.iter().enumerate() {
            assert_eq!(bytes[2 + i] as i8, (v * (1.0 / d)).round() as i8);
        }
    }

    #[test]
    fn an_all_zero_block_has_a_zero_scale() {
        let bytes = encode(&[0.0; 32], TensorType::Q8_0);
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn float_types_round_trip() {
        let x = [0.1f32, -2.5, 65504.0, 1e-8];
        for kind in [TensorType::F32, TensorType::F16, TensorType::BF16] {
            let back = decode(&encode(&x, kind), kind).unwrap();
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
}

//! Dropout masks from a small counter-based generator, so a mask depends only on (seed,
//! sequence, site) and not on how the batch was split across threads.

/// SplitMix64: one multiply-xorshift round per number; plenty for dropout.
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for one (seed, sequence, site) triple.
    pub(crate) fn new(seed: u64, sequence: u64, site: u64) -> Self {
        let mut rng = Self(seed);
        let a = rng.next_u64() ^ sequence.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let b = Self(a).next_u64() ^ site.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7);
        Self(b)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 24 bits.
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Fills `mask` as Burn's and PyTorch's dropout scale their inputs: each entry 0 with
    /// probability `p`, else `1/(1-p)`, so the expected value is unchanged.
    pub(crate) fn fill_mask(&mut self, mask: &mut [f32], p: f32) {
        let keep = 1.0 / (1.0 - p);
        for m in mask {
            *m = if self.next_f32() < p { 0.0 } else { keep };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn masks_drop_about_p_and_keep_the_mean() {
        let mut mask = vec![0.0; 100_000];
        Rng::new(7, 3, 1).fill_mask(&mut mask, 0.2);
        let dropped = mask.iter().filter(|&&m| m == 0.0).count() as f64 / mask.len() as f64;
        assert!((dropped - 0.2).abs() < 0.01, "dropped {dropped}");
        let mean = mask.iter().map(|&m| m as f64).sum::<f64>() / mask.len() as f64;
        assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
        assert!(mask.iter().all(|&m| m == 0.0 || (m - 1.25).abs() < 1e-6));
    }

    #[test]
    fn each_sequence_and_site_gets_its_own_mask() {
        let draw = |seq, site| {
            let mut mask = vec![0.0; 256];
            Rng::new(7, seq, site).fill_mask(&mut mask, 0.5);
            mask
        };
        assert_eq!(draw(0, 0), draw(0, 0));
        assert_ne!(draw(0, 0), draw(1, 0));
        assert_ne!(draw(0, 0), draw(0, 1));
    }
}

//! The lowest room: `exp` and the normal CDF without branches or libm calls, so the compiler
//! vectorises the loops that use them (libm's `expf`/`erff` are scalar calls, and were a fifth
//! of the step), and [`vectorized!`], which compiles a loop for the CPU's vector width. The
//! fused engine's kernels and the sampler's loops over a vocabulary use them; it imports
//! nothing of the crate.

use std::f32::consts::{FRAC_1_SQRT_2, LOG2_E};

/// `e^x` with a relative error below 2e-7 on [-87, 88] (Cephes' `expf`: `x = n·ln2 + r`,
/// a degree-6 polynomial for `e^r`, `2^n` built in the exponent bits); saturates outside.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest by adding and removing 1.5·2²³ (exact for |n| < 2²²); the integer n is
    // then the low bits of the shifted float. `round()` and `as i32` would be a libm call and a
    // saturating conversion that keep the loop from vectorising.
    const SHIFT: f32 = 12_582_912.0;
    let shifted = x * LOG2_E + SHIFT;
    let n = shifted - SHIFT;
    let n_int = shifted.to_bits().wrapping_sub(SHIFT.to_bits()) as i32;
    // ln2 split in two so that n·ln2 is exact to f32 precision.
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n_int + 127) as u32) << 23)
}

/// `tanh(x) = 1 − 2 / (e^{2x} + 1)`, through the vectorisable [`exp`]; saturates to ±1 (its
/// error near 0 is absolute, about 1e-7).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// The standard normal CDF `Φ(x)` and density `φ(x)`. `Φ` comes from Abramowitz & Stegun
/// 7.1.26 (`|erf error| < 1.5e-7`) written for `erfc`, so the left tail keeps its relative
/// precision instead of cancelling in `1 + erf`.
#[inline(always)]
pub(crate) fn normal_cdf_pdf(x: f32) -> (f32, f32) {
    let z = x.abs() * FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let gauss = exp(-z * z);
    let tail = 0.5 * poly * gauss; // Φ(-|x|)
    let cdf = if x < 0.0 { tail } else { 1.0 - tail };
    (cdf, gauss * 0.398_942_3)
}

/// Defines a function whose body is compiled three times: for AVX-512, for AVX2 + FMA, and for
/// the baseline (SSE2); each call runs the widest one the CPU has (the feature check is a
/// cached flag read), AVX-512 only in a build with the `avx512` feature. The body's loops then
/// vectorise 16 or 8 lanes wide, where the default x86-64 target would give 4.
macro_rules! vectorized {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                match $crate::fast_math::instruction_set() {
                    // SAFETY: `instruction_set` names the features the CPU has.
                    $crate::fast_math::InstructionSet::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::fast_math::InstructionSet::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::fast_math::InstructionSet::Baseline => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use vectorized;

/// The widest vector instructions the fused engine's kernels (gemm's products and `vectorized`
/// loops) take on this CPU in this build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstructionSet {
    /// AVX-512 (with AVX2 and FMA): a build with the `avx512` feature on a CPU that has it.
    Avx512,
    /// AVX2 and FMA.
    Avx2,
    /// What every x86-64 (or other) CPU has.
    Baseline,
}

impl InstructionSet {
    /// `"avx512"`, `"avx2"` or `"baseline"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Baseline => "baseline",
        }
    }
}

/// See [`InstructionSet`]: the one rule `vectorized` functions dispatch by (each check is a
/// cached flag read).
pub fn instruction_set() -> InstructionSet {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma");
        if cfg!(feature = "avx512") && avx2 && has!("avx512f") {
            return InstructionSet::Avx512;
        }
        if avx2 {
            return InstructionSet::Avx2;
        }
    }
    InstructionSet::Baseline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_to_float_precision() {
        let mut worst = 0f32;
        for i in -8700..8800 {
            let x = i as f32 * 0.01 + 0.003;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
    }

    #[test]
    fn tanh_matches_std_to_float_precision() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.01;
            let err = (tanh(x) - x.tanh()).abs();
            assert!(err < 3e-7, "tanh({x}) = {}, want {}", tanh(x), x.tanh());
        }
    }

    #[test]
    fn normal_cdf_and_pdf_match_erf() {
        for i in -1000..=1000 {
            let x = i as f32 * 0.01;
            let (cdf, pdf) = normal_cdf_pdf(x);
            let want = 0.5 * (1.0 + libm::erf(x as f64 * std::f64::consts::FRAC_1_SQRT_2));
            let want_pdf = (-0.5 * (x as f64).powi(2)).exp() / (2.0 * std::f64::consts::PI).sqrt();
            // A&S bound (0.75e-7 on Φ) plus f32 rounding of the arithmetic.
            assert!(
                (cdf as f64 - want).abs() < 3e-7,
                "Φ({x}) = {cdf}, want {want}"
            );
            assert!((pdf as f64 - want_pdf).abs() < 1e-7, "φ({x})");
        }
    }
}

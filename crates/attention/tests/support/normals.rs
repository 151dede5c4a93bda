//! N(0, 1) draws on the host from a fixed seed (xorshift64 and Box–Muller): the same numbers on
//! every run and every backend, without Burn's generators, which every test thread shares.
//! Included with `#[path]` by the attention crate's test files.

// Each test file uses what it needs of this.
#![allow(dead_code)]

/// A generator's first state for `seed`.
pub const fn start(seed: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// The next `n` draws of the generator whose state is `state`.
pub fn normals_from(state: &mut u64, n: usize) -> Vec<f32> {
    let mut uniform = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        ((*state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

/// `n` draws from a generator of its own started at `seed`.
pub fn normal(n: usize, seed: u64) -> Vec<f32> {
    normals_from(&mut start(seed), n)
}

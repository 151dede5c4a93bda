//! Where the validation split starts: the one rule every reader and writer of splits uses.

/// How many of `total` tokens are training tokens: all but the last `val_fraction`.
pub fn train_tokens(total: usize, val_fraction: f64) -> usize {
    ((1.0 - val_fraction) * total as f64) as usize
}

//! [`Store`]: a split's conversations as they are kept in memory and on disk.

use super::mask::Mask;
use crate::data::tokens::Tokens;

/// A split's conversations end to end: ids `[tokens]`, taught marks `[tokens]`, and where each
/// conversation starts, then the end `[conversations + 1]`.
#[derive(Clone)]
pub struct Store {
    pub ids: Tokens,
    pub taught: Mask,
    pub offsets: Vec<u64>,
}

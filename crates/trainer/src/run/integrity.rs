//! Checksums of checkpoints. A checkpoint's `state.json` lists the SHA-256 of every other file
//! of the checkpoint, and is sealed with the SHA-256 of its own text: flipping, truncating or
//! zeroing any byte of any of its files is noticed, and the damaged file is named.
//!
//! The seal is the hash of the text with the seal itself replaced by [`UNSEALED`]; the field is
//! serialised first, so the seal is the first 64-hex-digit string of the text.

use crate::checksum::sha256_hex;

/// The seal's placeholder while hashing: 64 zeros.
const UNSEALED: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The placeholder to serialise as the seal before [`seal`] replaces it.
pub(crate) fn placeholder() -> String {
    UNSEALED.to_string()
}

/// `text` (serialised with [`placeholder`] as its seal) with the placeholder replaced by the
/// text's own hash.
pub(crate) fn seal(text: &str) -> String {
    text.replacen(UNSEALED, &sha256_hex(text.as_bytes()), 1)
}

/// Whether `text` carries `seal` as its seal and hashes to it.
pub(crate) fn seal_holds(text: &str, seal: &str) -> bool {
    seal.len() == UNSEALED.len()
        && text.contains(seal)
        && sha256_hex(text.replacen(seal, UNSEALED, 1).as_bytes()) == seal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_text_holds_and_any_changed_byte_breaks_it() {
        let text = format!("{{\"checksum\": \"{}\", \"step\": 12}}", placeholder());
        let sealed = seal(&text);
        let seal = sealed[14..78].to_string();
        assert!(seal_holds(&sealed, &seal));
        for i in 0..sealed.len() {
            let mut bytes = sealed.clone().into_bytes();
            bytes[i] ^= 0x01;
            let Ok(changed) = String::from_utf8(bytes) else {
                continue;
            };
            let changed_seal = &changed[14..78];
            assert!(!seal_holds(&changed, changed_seal), "byte {i}");
            assert!(!seal_holds(&changed, &seal), "byte {i}");
        }
    }
}

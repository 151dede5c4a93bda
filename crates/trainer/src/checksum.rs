//! SHA-256 in lowercase hex: what prepared corpora record of their inputs and checkpoints of
//! their files.

use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The SHA-256 of the file at `path` in hex, read in pieces.
pub(crate) fn sha256_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    use std::io::Read;
    let read = || -> std::io::Result<String> {
        let mut file = std::fs::File::open(path)?;
        let (mut hasher, mut buffer) = (Sha256::new(), vec![0; 1 << 20]);
        loop {
            match file.read(&mut buffer)? {
                0 => return Ok(hex(&hasher.finalize())),
                n => hasher.update(&buffer[..n]),
            }
        }
    };
    read().with_context(|| format!("cannot read {}", path.display()))
}

/// Lowercase hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_input() {
        // FIPS 180-2, appendix B.1.
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

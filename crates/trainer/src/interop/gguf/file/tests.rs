//! The GGUF container read and written: round trips, truncations, unread types, mutated files.
use super::*;
use proptest::prelude::*;

fn sample() -> Gguf {
    Gguf {
        metadata: vec![
            ("general.architecture".into(), Value::Str("gpt2".into())),
            ("gpt2.block_count".into(), Value::U32(2)),
            ("gpt2.attention.layer_norm_epsilon".into(), Value::F32(1e-5)),
            ("flag".into(), Value::Bool(true)),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(vec![Value::Str("a".into()), Value::Str("Ġb".into())]),
            ),
            ("big".into(), Value::I64(-3)),
        ],
        tensors: vec![
            Tensor {
                name: "w".into(),
                ne: vec![3, 2],
                kind: TensorType::F32,
                data: (0..24).collect(),
            },
            Tensor {
                name: "q".into(),
                ne: vec![32, 1],
                kind: TensorType::Q8_0,
                data: vec![7; 34],
            },
        ],
    }
}

#[test]
fn a_file_reads_back_as_written() {
    let bytes = sample().to_bytes().unwrap();
    assert_eq!(&bytes[..4], b"GGUF");
    assert_eq!(Gguf::from_bytes(&bytes).unwrap(), sample());
    // Tensor data starts aligned, and each tensor's bytes too.
    let file = Gguf::from_bytes(&bytes).unwrap();
    assert_eq!(file.tensor("q").unwrap().data, vec![7; 34]);
    assert_eq!(bytes.len() % DEFAULT_ALIGNMENT, 0);
}

#[test]
fn a_tensor_of_the_wrong_size_is_not_written() {
    let mut file = sample();
    file.tensors[1].data.pop();
    let e = file.to_bytes().unwrap_err().to_string();
    assert!(e.contains("tensor q: 33 bytes"), "{e}");
    file.tensors[1].ne = vec![31, 1];
    assert!(file.to_bytes().is_err());
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample().to_bytes().unwrap();
    // The last tensor's padding is not needed to read it.
    let needed = bytes.len() - (DEFAULT_ALIGNMENT - 34 % DEFAULT_ALIGNMENT);
    for len in 0..needed {
        assert!(Gguf::from_bytes(&bytes[..len]).is_err(), "read {len} bytes");
    }
    let e = Gguf::from_bytes(b"GGUG\x03\0\0\0").unwrap_err().to_string();
    assert!(e.contains("not a GGUF file"), "{e}");
    let mut v4 = bytes.clone();
    v4[4] = 4;
    let e = Gguf::from_bytes(&v4).unwrap_err().to_string();
    assert!(e.contains("GGUF version 4"), "{e}");
}

/// A file read from the disk (the header from a prefix grown as it needs, each tensor read
/// where it lies) is the file read from its bytes, and every truncation fails alike.
#[test]
fn a_file_read_a_piece_at_a_time_is_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.gguf");
    let bytes = sample().to_bytes().unwrap();
    std::fs::write(&path, &bytes).unwrap();
    for prefix in [1, 7, 64, 1 << 20] {
        assert_eq!(
            Gguf::read_from(&path, prefix).unwrap(),
            sample(),
            "{prefix}"
        );
    }
    for len in (0..bytes.len()).step_by(5) {
        std::fs::write(&path, &bytes[..len]).unwrap();
        let whole =
            Gguf::from_bytes(&bytes[..len]).map_err(|e| format!("{}: {e:#}", path.display()));
        let read = Gguf::read_from(&path, 3).map_err(|e| e.to_string());
        assert_eq!(read, whole, "the first {len} bytes");
    }
}

/// A tensor of a type tinygpt does not read is refused in one line that names the type,
/// by ggml's name where it has one, and the types that are read.
#[test]
fn an_unread_type_is_named() {
    let bytes = sample().to_bytes().unwrap();
    // Tensor `q`'s header: its name, two dimensions (32, 1), then its type (8, Q8_0).
    let mut header = vec![1, 0, 0, 0, 0, 0, 0, 0, b'q', 2, 0, 0, 0];
    header.extend(32u64.to_le_bytes());
    header.extend(1u64.to_le_bytes());
    let at = bytes
        .windows(header.len())
        .position(|w| w == header)
        .unwrap()
        + header.len();
    assert_eq!(bytes[at..at + 4], 8u32.to_le_bytes());
    for (id, named) in [(23u32, "IQ4_XS (ggml type 23)"), (99, "ggml type 99")] {
        let mut bad = bytes.clone();
        bad[at..at + 4].copy_from_slice(&id.to_le_bytes());
        let e = Gguf::from_bytes(&bad).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "tensor q is stored as {named}, which tinygpt does not read"
            )) && e.contains("it reads F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// Any byte changed, anywhere, gives a file or an error: never a panic, never an
    /// allocation a corrupt count asks for.
    #[test]
    fn mutated_files_never_panic(at in 0usize..4096, value: u8, cut in 0usize..4096) {
        let mut bytes = sample().to_bytes().unwrap();
        let at = at % bytes.len();
        bytes[at] = value;
        bytes.truncate(bytes.len() - cut % 64);
        let _ = Gguf::from_bytes(&bytes);
    }
}

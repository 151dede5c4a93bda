//! The GGUF container, version 3, as llama.cpp's `gguf.cpp` and `gguf-py` read and write it:
//!
//! ```text
//! "GGUF" | version u32 = 3 | tensor count u64 | metadata count u64
//! metadata:  key (u64 length + UTF-8) | value type u32 | value
//! tensors:   name | dims u32 | ne[0..dims] u64 (ne[0] the innermost, contiguous one)
//!            | type u32 | offset u64 (from the start of the data, a multiple of the alignment)
//! padding to `general.alignment` (32 unless the file says otherwise), then the data
//! ```
//!
//! Everything little-endian. A tensor `[rows, cols]` in row-major order (PyTorch's `[out, in]`
//! weight) has `ne = [cols, rows]`. Reading checks every length against the bytes that are
//! there, so a truncated or corrupt file is an error naming what and where, never a panic or an
//! allocation the file's numbers ask for.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail, ensure};

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
/// `general.alignment` when a file does not set it.
pub(crate) const DEFAULT_ALIGNMENT: usize = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Elements of one type (nested arrays are allowed by the format, not written here).
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The type id the format gives this value.
    fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// An unsigned integer of any width, as llama.cpp accepts for counts and ids.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// How a tensor's elements are stored: the ggml types tinygpt reads (all of them) and writes
/// (F32, F16, BF16, Q8_0). Named as ggml names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum TensorType {
    F32,
    F16,
    /// 32 values: an f16 scale and 32 four-bit values.
    Q4_0,
    /// 32 values: an f16 scale and minimum, 32 four-bit values.
    Q4_1,
    /// 32 values: an f16 scale, 32 five-bit values (their fifth bits in one 32-bit word).
    Q5_0,
    /// 32 values: an f16 scale and minimum, 32 five-bit values.
    Q5_1,
    Q8_0,
    /// 256 values in 8 groups of 32: f16 scale and minimum, six-bit group scales and minimums,
    /// four-bit values.
    Q4_K,
    /// 256 values in 8 groups of 32: as `Q4_K`, with a fifth bit per value.
    Q5_K,
    /// 256 values in 16 groups of 16: an f16 scale, eight-bit group scales, six-bit values.
    Q6_K,
    BF16,
}

impl TensorType {
    const ALL: [TensorType; 11] = [
        TensorType::F32,
        TensorType::F16,
        TensorType::Q4_0,
        TensorType::Q4_1,
        TensorType::Q5_0,
        TensorType::Q5_1,
        TensorType::Q8_0,
        TensorType::Q4_K,
        TensorType::Q5_K,
        TensorType::Q6_K,
        TensorType::BF16,
    ];

    pub fn id(self) -> u32 {
        match self {
            TensorType::F32 => 0,
            TensorType::F16 => 1,
            TensorType::Q4_0 => 2,
            TensorType::Q4_1 => 3,
            TensorType::Q5_0 => 6,
            TensorType::Q5_1 => 7,
            TensorType::Q8_0 => 8,
            TensorType::Q4_K => 12,
            TensorType::Q5_K => 13,
            TensorType::Q6_K => 14,
            TensorType::BF16 => 30,
        }
    }

    /// The type ggml calls `name`.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// ggml's name for it.
    pub fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "F32",
            TensorType::F16 => "F16",
            TensorType::Q4_0 => "Q4_0",
            TensorType::Q4_1 => "Q4_1",
            TensorType::Q5_0 => "Q5_0",
            TensorType::Q5_1 => "Q5_1",
            TensorType::Q8_0 => "Q8_0",
            TensorType::Q4_K => "Q4_K",
            TensorType::Q5_K => "Q5_K",
            TensorType::Q6_K => "Q6_K",
            TensorType::BF16 => "BF16",
        }
    }

    /// Elements per block and bytes per block (ggml's `blck_size`, `type_size`).
    pub fn block(self) -> (usize, usize) {
        match self {
            TensorType::F32 => (1, 4),
            TensorType::F16 | TensorType::BF16 => (1, 2),
            TensorType::Q4_0 => (32, 18),
            TensorType::Q4_1 => (32, 20),
            TensorType::Q5_0 => (32, 22),
            TensorType::Q5_1 => (32, 24),
            TensorType::Q8_0 => (32, 34),
            TensorType::Q4_K => (256, 144),
            TensorType::Q5_K => (256, 176),
            TensorType::Q6_K => (256, 210),
        }
    }

    fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The names of the types tinygpt reads, for errors.
    fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The bytes of a tensor of `ne` elements per row and `rows` rows, or why it cannot be.
    pub fn bytes(self, ne: &[u64]) -> Result<usize> {
        let (block, size) = self.block();
        let row = *ne
            .first()
            .ok_or_else(|| anyhow!("a tensor without dimensions"))?;
        ensure!(
            row.is_multiple_of(block as u64),
            "{} rows of {row} values: {} stores whole blocks of {block}",
            self.name(),
            self.name()
        );
        let elements = ne
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| anyhow!("a tensor of {ne:?} elements overflows"))?;
        (elements / block as u64)
            .checked_mul(size as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| anyhow!("a tensor of {ne:?} elements is too large"))
    }
}

/// ggml's names of the types tinygpt does not read, by id (ggml.h's `ggml_type`, as of
/// gguf-py 0.19).
const UNREAD: [(u32, &str); 23] = [
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

/// Why tensor `name` of ggml type `id` cannot be read, naming the type and those that can.
fn unread_type(name: &str, id: u32) -> anyhow::Error {
    let kind = match UNREAD.iter().find(|(i, _)| *i == id) {
        Some((_, known)) => format!("{known} (ggml type {id})"),
        None => format!("ggml type {id}"),
    };
    anyhow!(
        "tensor {name} is stored as {kind}, which tinygpt does not read; it reads {}",
        TensorType::names()
    )
}

/// One tensor: its name, `ne` (innermost first), storage type and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub ne: Vec<u64>,
    pub kind: TensorType,
    pub data: Vec<u8>,
}

/// A whole GGUF file in memory: metadata in file order, then tensors in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gguf {
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<Tensor>,
}

impl Gguf {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn alignment(&self) -> Result<usize> {
        match self.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => Ok(a as usize),
                _ => bail!("general.alignment {v:?} is not a power of two"),
            },
        }
    }

    /// The file's bytes. Fails only on a tensor whose bytes disagree with its type and shape.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let align = self.alignment()?;
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            let expected = t.kind.bytes(&t.ne)?;
            ensure!(
                expected == t.data.len(),
                "tensor {}: {} bytes for {} {:?}, which takes {expected}",
                t.name,
                t.data.len(),
                t.kind.name(),
                t.ne
            );
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.kind.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.data.len().next_multiple_of(align);
        }
        out.resize(out.len().next_multiple_of(align), 0);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            out.resize(out.len().next_multiple_of(align), 0);
        }
        Ok(out)
    }

    /// Reads a whole file, checking every length and offset against `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::parse(bytes, bytes.len(), |start, size| {
            Ok(bytes[start..start + size].to_vec())
        })
    }

    /// Reads the file at `path`: its header from its first bytes (more of them while the header
    /// needs more), then each tensor's bytes from where they lie, so that the file is never
    /// held whole beside its tensors. Checks as [`Gguf::from_bytes`] does; its errors name the
    /// file.
    pub fn read(path: &Path) -> Result<Self> {
        Self::read_from(path, 1 << 20)
    }

    /// [`Gguf::read`], the header looked for in the first `prefix` bytes first.
    fn read_from(path: &Path, mut prefix: usize) -> Result<Self> {
        use std::os::unix::fs::FileExt;
        let cannot = || format!("cannot read {}", path.display());
        let file = std::fs::File::open(path).with_context(cannot)?;
        let len = usize::try_from(file.metadata().with_context(cannot)?.len())?;
        loop {
            let mut head = vec![0; prefix.min(len)];
            file.read_exact_at(&mut head, 0).with_context(cannot)?;
            let data = |start: usize, size: usize| -> Result<Vec<u8>> {
                let mut bytes = vec![0; size];
                file.read_exact_at(&mut bytes, start as u64)
                    .with_context(cannot)?;
                Ok(bytes)
            };
            match Self::parse(&head, len, data) {
                Err(e) if e.downcast_ref::<Short>().is_some() => prefix = prefix.saturating_mul(4),
                read => return read.map_err(|e| anyhow!("{}: {e:#}", path.display())),
            }
        }
    }

    /// A file of `len` bytes whose first bytes are `head` (all of them, or enough for the
    /// header: else [`Short`]), each tensor's bytes from `read_tensor(start, size)` once checked to lie
    /// within the file.
    fn parse(
        head: &[u8],
        len: usize,
        mut read_tensor: impl FnMut(usize, usize) -> Result<Vec<u8>>,
    ) -> Result<Self> {
        let mut r = Reader {
            bytes: head,
            at: 0,
            len,
        };
        let magic = r.take(4, "the magic number")?;
        ensure!(
            magic == MAGIC,
            "not a GGUF file (it starts with {magic:02x?}, not \"GGUF\")"
        );
        let version = r.u32("the version")?;
        ensure!(
            version == 2 || version == VERSION,
            "GGUF version {version}: tinygpt reads versions 2 and 3"
        );
        let tensors = r.u64("the tensor count")?;
        let kvs = r.u64("the metadata count")?;
        let mut file = Gguf::default();
        for i in 0..kvs {
            let key = r.string(&format!("metadata key {i}"))?;
            let kind = r.u32(&format!("the type of {key}"))?;
            let value = r.value(kind, &key, 0)?;
            file.metadata.push((key, value));
        }
        let mut infos = Vec::new();
        for i in 0..tensors {
            let name = r.string(&format!("the name of tensor {i}"))?;
            let dims = r.u32(&format!("the dimensions of {name}"))?;
            ensure!(
                (1..=4).contains(&dims),
                "tensor {name} has {dims} dimensions (GGUF has 1 to 4)"
            );
            let ne = (0..dims)
                .map(|_| r.u64(&format!("the shape of {name}")))
                .collect::<Result<Vec<_>>>()?;
            let id = r.u32(&format!("the type of {name}"))?;
            let kind = TensorType::from_id(id).ok_or_else(|| unread_type(&name, id))?;
            let offset = r.u64(&format!("the offset of {name}"))?;
            infos.push((name, ne, kind, offset));
        }
        let align = file.alignment()?;
        let data = r.at.next_multiple_of(align);
        for (name, ne, kind, offset) in infos {
            let size = kind.bytes(&ne).map_err(|e| anyhow!("tensor {name}: {e}"))?;
            ensure!(
                offset.is_multiple_of(align as u64),
                "tensor {name} starts at {offset}, not a multiple of the alignment {align}"
            );
            let start = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(data))
                .filter(|&s| s.checked_add(size).is_some_and(|end| end <= len))
                .ok_or_else(|| {
                    anyhow!(
                        "tensor {name} ({} {ne:?}, {size} bytes at {offset}) lies past the end \
                         of the file ({len} bytes): truncated?",
                        kind.name(),
                    )
                })?;
            let data = read_tensor(start, size)?;
            file.tensors.push(Tensor {
                name,
                ne,
                kind,
                data,
            });
        }
        Ok(file)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::Str(s) => put_str(out, s),
        Value::Array(items) => {
            // An empty array has no element to take the type from: the only ones tinygpt
            // writes are string arrays (a char vocabulary's merges when it is all ASCII).
            let kind = items.first().map_or(8, Value::type_id);
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// A cursor over a file's bytes whose every read says what it was reading when it fails.
struct Reader<'a> {
    /// The file's first bytes: all of them, or a prefix that may hold the header.
    bytes: &'a [u8],
    at: usize,
    /// The whole file's length.
    len: usize,
}

/// A read past the end of the file's first bytes that the file has: [`Gguf::read`] reads more
/// of them and parses again.
#[derive(Debug)]
struct Short;

impl std::fmt::Display for Short {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the header runs past the bytes read")
    }
}

impl std::error::Error for Short {}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n);
        if end.is_some_and(|e| e > self.bytes.len() && e <= self.len) {
            return Err(Short.into());
        }
        let end = end.filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            anyhow!(
                "the file ends at byte {} inside {what} (truncated?)",
                self.len
            )
        })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| anyhow!("{what}: a length of {len}"))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| anyhow!("{what} is not UTF-8"))
    }

    fn value(&mut self, kind: u32, key: &str, depth: usize) -> Result<Value> {
        Ok(match kind {
            0 => Value::U8(self.array::<1>(key)?[0]),
            1 => Value::I8(i8::from_le_bytes(self.array(key)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => bail!("{key}: {b} is not a boolean"),
            },
            8 => Value::Str(self.string(key)?),
            9 => {
                ensure!(depth < 4, "{key}: arrays nested too deep");
                let inner = self.u32(key)?;
                let n = self.u64(key)?;
                // Each element takes at least a byte: a count beyond the bytes left is corrupt,
                // and refusing it here keeps a bad count from asking for memory.
                ensure!(
                    n <= (self.len - self.at) as u64,
                    "{key}: an array of {n} elements in a file with {} bytes left",
                    self.len - self.at
                );
                let items = (0..n)
                    .map(|_| self.value(inner, key, depth + 1))
                    .collect::<Result<Vec<_>>>()?;
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            other => bail!("{key}: metadata type {other} is not a GGUF type"),
        })
    }
}

#[cfg(test)]
mod tests;

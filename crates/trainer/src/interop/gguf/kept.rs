//! The storage types of an imported GGUF file's matrices, kept with the run
//! (`file-types.json`), so that `--weights file` decodes each range of a matrix's rows in the
//! type the file stores it in: a "Q4_K_M" file's `Q5_0` and `Q8_0` matrices as such, a file's
//! `attn_q`, `attn_k` and `attn_v` (one matrix in tinygpt) each its own way. Every quantised
//! matrix's blocks are kept with the run (`file-blocks.bin`, rows in tinygpt's order, a SHA-256
//! for each tensor), and the decoder multiplies them as the file stores them.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use tinygpt_model::parts::Mlp;
use tinygpt_model::{BlockPlan, FileBlocks, GptConfig, Segment, Storage, WeightFormat, WeightPlan};

use super::file::{Gguf, Tensor, TensorType};
use super::quant::block_type;
use crate::checksum::sha256_hex;

/// The run file that holds them.
pub const FILE: &str = "file-types.json";

/// The run file that holds the quantised tensors' own blocks.
pub const BLOCKS: &str = "file-blocks.bin";

/// `rows` consecutive output rows stored as ggml's `type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub rows: usize,
    #[serde(rename = "type")]
    pub kind: String,
    /// Where the file's own blocks of these rows are in [`BLOCKS`] (a quantised type's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Kept>,
}

/// A tensor's blocks kept in [`BLOCKS`]: `bytes` from `offset`, whose SHA-256 is `sha256`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub tensor: String,
    pub offset: u64,
    pub bytes: u64,
    pub sha256: String,
    /// How the tensor's rows are reordered ([`rows_in_order`]): the bytes of a row, and the
    /// heads of a query or key projection. Set by [`FileTypes::of`], which reads the file;
    /// a run's `file-types.json` does not hold them.
    #[serde(skip)]
    order: (usize, Option<usize>),
}

impl Kept {
    /// This tensor's bytes in `gguf` as [`BLOCKS`] holds them (rows in tinygpt's order).
    fn bytes_in<'g>(&self, gguf: &'g Gguf) -> Result<std::borrow::Cow<'g, [u8]>> {
        let t = gguf
            .tensor(&self.tensor)
            .ok_or_else(|| anyhow!("tensor {} is missing", self.tensor))?;
        let (row, heads) = self.order;
        Ok(match heads {
            None => std::borrow::Cow::Borrowed(&t.data),
            Some(_) => std::borrow::Cow::Owned(rows_in_order(t, row, heads)),
        })
    }
}

/// `t`'s rows (each `row` bytes) in tinygpt's order: with `heads`, a query or key projection's
/// rows moved back from llama.cpp's rotary layout as the import moves its values.
fn rows_in_order(t: &Tensor, row: usize, heads: Option<usize>) -> Vec<u8> {
    let Some(heads) = heads else {
        return t.data.clone();
    };
    let n = t.data.len() / row;
    let index: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let order = super::llama::deinterleave(&index, heads, 1);
    order
        .iter()
        .flat_map(|&from| &t.data[from as usize * row..(from as usize + 1) * row])
        .copied()
        .collect()
}

/// The heads of a query or key projection named `name` whose rows a file stores in llama.cpp's
/// rotary layout (`interleaved`: a llama file's; the import moves them back), for
/// [`FileTypes::of`].
pub(super) fn rotary_heads(
    interleaved: bool,
    gpt: &GptConfig,
) -> impl Fn(&str) -> Option<usize> + '_ {
    move |name| match interleaved {
        true => super::llama::hf_name(name, gpt).and_then(|(_, heads)| heads),
        false => None,
    }
}

/// One block's matrices, each as its ranges (top to bottom).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockTypes {
    pub qkv: Vec<Range>,
    pub attn_proj: Vec<Range>,
    pub fc: Vec<Range>,
    pub mlp_proj: Vec<Range>,
}

/// Every matrix's storage in the file `file` the run was imported from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileTypes {
    pub file: String,
    pub blocks: Vec<BlockTypes>,
    pub head: Vec<Range>,
    /// An untied model's quantised embedding (`token_embd`), which the decoder looks up in its
    /// blocks; none where the head is the embedding's rows, or the file stores it as floats
    /// (and in a run imported before 2026-12-07).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embedding: Vec<Range>,
}

/// How many of each type `kinds` holds, in the types' order: "Q5_0 ×166, Q8_0 ×31".
pub(super) fn counted<'k>(kinds: impl Iterator<Item = &'k str>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for kind in kinds {
        *counts.entry(kind).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    counts.join(", ")
}

/// The file's tensors, by llama.cpp's name, that make up each decoder matrix of block `l` of a
/// model of `gpt`, top to bottom (`fused_qkv`: one `attn_qkv`, as llama.cpp's `gpt2`).
fn sources(fused_qkv: bool, gpt: &GptConfig, l: usize) -> [Vec<String>; 4] {
    let blk = |parts: &[&str]| {
        parts
            .iter()
            .map(|p| format!("blk.{l}.{p}.weight"))
            .collect()
    };
    let fc = match gpt.mlp {
        Mlp::SwiGlu => blk(&["ffn_gate", "ffn_up"]),
        Mlp::None => vec![],
        Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 => blk(&["ffn_up"]),
    };
    let down = match gpt.mlp {
        Mlp::None => vec![],
        Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu => blk(&["ffn_down"]),
    };
    let qkv = match fused_qkv {
        true => blk(&["attn_qkv"]),
        false => blk(&["attn_q", "attn_k", "attn_v"]),
    };
    [qkv, blk(&["attn_output"]), fc, down]
}

impl FileTypes {
    /// The types of `gguf`'s matrices (a model of `gpt`; `fused_qkv` as [`sources`]), read
    /// from `file`, and the quantised tensors' blocks; `heads(name)`: the heads of a tensor whose
    /// rows the import moved from llama.cpp's rotary layout.
    pub(super) fn of(
        gguf: &Gguf,
        gpt: &GptConfig,
        fused_qkv: bool,
        file: &Path,
        heads: impl Fn(&str) -> Option<usize>,
    ) -> Result<Self> {
        let mut offset = 0;
        let mut ranges = |names: &[String]| -> Result<Vec<Range>> {
            names
                .iter()
                .map(|name| {
                    let t = gguf
                        .tensor(name)
                        .ok_or_else(|| anyhow!("tensor {name} is missing"))?;
                    let rows = usize::try_from(t.ne.get(1).copied().unwrap_or(1))?;
                    let kept = match block_type(t.kind) {
                        None => None,
                        Some(_) => {
                            let mut kept = Kept {
                                tensor: name.clone(),
                                offset,
                                bytes: t.data.len() as u64,
                                sha256: String::new(),
                                order: (t.data.len() / rows.max(1), heads(name)),
                            };
                            kept.sha256 = sha256_hex(&kept.bytes_in(gguf)?);
                            offset += kept.bytes;
                            Some(kept)
                        }
                    };
                    Ok(Range {
                        rows,
                        kind: t.kind.name().to_string(),
                        kept,
                    })
                })
                .collect()
        };
        let mut blocks = Vec::with_capacity(gpt.n_layer);
        for l in 0..gpt.n_layer {
            let [qkv, proj, fc, down] = sources(fused_qkv, gpt, l);
            blocks.push(BlockTypes {
                qkv: ranges(&qkv)?,
                attn_proj: ranges(&proj)?,
                fc: ranges(&fc)?,
                mlp_proj: ranges(&down)?,
            });
        }
        // The file's head where it has one (llama.cpp multiplies by it, in its own type, even
        // where its values are the embedding's); the embedding's rows otherwise.
        let untied = gguf.tensor("output.weight").is_some();
        let head = match untied {
            true => "output.weight",
            false => "token_embd.weight",
        };
        let head = ranges(&[head.to_string()])?;
        // An untied embedding in blocks: looked up in them, never made in f32 to decode.
        let embedding = gguf.tensor("token_embd.weight");
        let embedding = match embedding.and_then(|t| block_type(t.kind)) {
            Some(_) if untied => ranges(&["token_embd.weight".to_string()])?,
            _ => vec![],
        };
        Ok(Self {
            file: file
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            blocks,
            head,
            embedding,
        })
    }

    /// Written into the run directory `dir`: the kept blocks, a tensor at a time from `gguf`
    /// (the file these types were read from), then the types that name them.
    pub fn write(&self, dir: &Path, gguf: &Gguf) -> Result<()> {
        let path = dir.join(BLOCKS);
        let cannot = || format!("cannot write {}", path.display());
        let mut kept = self.ranges().filter_map(|r| r.kept.as_ref()).peekable();
        if kept.peek().is_some() {
            let mut file =
                std::io::BufWriter::new(std::fs::File::create(&path).with_context(cannot)?);
            for kept in kept {
                std::io::Write::write_all(&mut file, &kept.bytes_in(gguf)?).with_context(cannot)?;
            }
            let file = file
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(cannot)?;
            file.sync_all().with_context(cannot)?;
        }
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(dir.join(FILE), text)
            .with_context(|| format!("cannot write {}", dir.join(FILE).display()))
    }

    /// The run directory `dir`'s, if it was imported from a GGUF file.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let types: Self = serde_json::from_str(&text)
            .with_context(|| format!("{} is not the run's file types", path.display()))?;
        for range in types.ranges() {
            TensorType::named(&range.kind).ok_or_else(|| {
                anyhow!(
                    "{}: {} is not a ggml type tinygpt reads",
                    path.display(),
                    range.kind
                )
            })?;
        }
        Ok(Some(types))
    }

    fn ranges(&self) -> impl Iterator<Item = &Range> {
        let blocks = self.blocks.iter().flat_map(|b| {
            [&b.qkv, &b.attn_proj, &b.fc, &b.mlp_proj]
                .into_iter()
                .flatten()
        });
        // The order the blocks are kept in (`of`).
        blocks.chain(&self.head).chain(&self.embedding)
    }

    /// How many matrices (ranges) of each type, as "Q5_0 ×166, Q8_0 ×31".
    pub fn summary(&self) -> String {
        counted(self.ranges().map(|r| r.kind.as_str()))
    }

    /// How many matrices are kept in their own blocks, and their bytes.
    pub fn kept(&self) -> (usize, u64) {
        let kept = self.ranges().filter_map(|r| r.kept.as_ref());
        kept.fold((0, 0), |(n, bytes), k| (n + 1, bytes + k.bytes))
    }

    /// A line for the user where the run keeps no blocks of a type that only they give
    /// exactly (a run imported before the blocks were kept): [`FileTypes::plan`] decodes those
    /// in Q8_0.
    pub fn note(&self) -> Option<String> {
        let mut unkept: Vec<&str> = Vec::new();
        for range in self.ranges().filter(|r| r.kept.is_none()) {
            let kind = TensorType::named(&range.kind);
            if kind.is_some_and(|k| requantised(k).is_none()) && !unkept.contains(&&*range.kind) {
                unkept.push(&range.kind);
            }
        }
        (!unkept.is_empty()).then(|| {
            format!(
                "{}: {} matrices decode as q8_0 (the run keeps no blocks of them: import the \
                 file again to decode them as it stores them)",
                self.file,
                unkept.join(", ")
            )
        })
    }

    /// The decoder's plan for the run in `dir`: each range in its file's type (F32, F16 and
    /// BF16 as f32; the quantised types the file's own blocks, checked against their SHA-256;
    /// for a run imported before they were kept, Q8_0, Q5_0 and Q4_0 quantised again and the
    /// others Q8_0 of their values, as [`FileTypes::note`] says).
    pub fn plan(&self, dir: &Path) -> Result<Arc<WeightPlan>> {
        let (mut blocks_file, mut read) = (None, Vec::new());
        let plan = self.plan_from(|kept| {
            let bytes = read_kept(&mut blocks_file, dir, kept)?;
            read.push((bytes.clone(), kept.clone()));
            Ok(bytes)
        })?;
        check_kept(&read, dir)?;
        Ok(plan)
    }

    /// The decoder's plan for `gguf`, the file these types were just read from
    /// ([`FileTypes::of`]), its blocks those it holds: the model as the file stores it.
    pub(super) fn plan_held(&self, gguf: &Gguf) -> Result<Arc<WeightPlan>> {
        self.plan_from(|kept| Ok(Arc::from(kept.bytes_in(gguf)?.as_ref())))
    }

    /// The plan, each kept range's bytes from `read`.
    fn plan_from(
        &self,
        mut read: impl FnMut(&Kept) -> Result<Arc<[u8]>>,
    ) -> Result<Arc<WeightPlan>> {
        let mut segments = |ranges: &[Range]| -> Result<Vec<Segment>> {
            ranges
                .iter()
                .map(|r| {
                    let kind = TensorType::named(&r.kind)
                        .ok_or_else(|| anyhow!("{} is not a ggml type tinygpt reads", r.kind))?;
                    if let (Some(kept), Some(kind)) = (&r.kept, block_type(kind)) {
                        let storage = Storage::Blocks(FileBlocks {
                            kind,
                            bytes: read(kept)?,
                        });
                        return Ok(Segment {
                            rows: r.rows,
                            storage,
                        });
                    }
                    // A run imported before the blocks were kept: the values quantised again
                    // (exact for files of ggml's reference quantisers), or Q8_0 of them.
                    let format = requantised(kind).unwrap_or(WeightFormat::Q8_0);
                    Ok(Segment::quantised(r.rows, format))
                })
                .collect()
        };
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            blocks.push(BlockPlan {
                qkv: segments(&b.qkv)?,
                attn_proj: segments(&b.attn_proj)?,
                fc: segments(&b.fc)?,
                mlp_proj: segments(&b.mlp_proj)?,
            });
        }
        let head = segments(&self.head)?;
        if self.blocks.is_empty() && head.is_empty() {
            bail!("the run's file types name no matrix");
        }
        let embedding = segments(&self.embedding)?;
        Ok(Arc::new(WeightPlan {
            blocks,
            head,
            embedding,
        }))
    }
}

/// The format a type's values give exactly when quantised again by ggml's reference quantiser
/// (f32 for the float types); `None` for the types only their kept blocks give.
fn requantised(kind: TensorType) -> Option<WeightFormat> {
    match kind {
        TensorType::F32 | TensorType::F16 | TensorType::BF16 => Some(WeightFormat::F32),
        TensorType::Q8_0 => Some(WeightFormat::Q8_0),
        TensorType::Q5_0 => Some(WeightFormat::Q5_0),
        TensorType::Q4_0 => Some(WeightFormat::Q4_0),
        TensorType::Q4_1
        | TensorType::Q5_1
        | TensorType::Q4_K
        | TensorType::Q5_K
        | TensorType::Q6_K => None,
    }
}

/// The error for `kept`'s blocks in the run `dir`, missing or unlike their SHA-256.
fn damaged(dir: &Path, kept: &Kept) -> anyhow::Error {
    anyhow!(
        "{}: the blocks of {} are damaged (their SHA-256 differs); import the GGUF file again, \
         or decode with --weights f32",
        dir.join(BLOCKS).display(),
        kept.tensor
    )
}

/// Each of `read`'s bytes against its SHA-256, on every core (a gigabyte at SmolLM2-1.7B's
/// shape: half a second on one); the first damaged in `read`'s order refused in one line.
fn check_kept(read: &[(Arc<[u8]>, Kept)], dir: &Path) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let holds: Vec<bool> = std::thread::scope(|scope| {
        let parts: Vec<_> = (0..threads)
            .map(|t| {
                // Thread `t` takes every `threads`-th tensor: alike in bytes over 100s of them.
                let mine = read.iter().skip(t).step_by(threads);
                scope.spawn(move || mine.map(|(b, k)| sha256_hex(b) == k.sha256).collect())
            })
            .collect();
        let checked: Vec<Vec<bool>> = parts.into_iter().map(|p| p.join().unwrap()).collect();
        (0..read.len())
            .map(|i| checked[i % threads][i / threads])
            .collect()
    });
    match holds.iter().position(|holds| !holds) {
        Some(i) => Err(damaged(dir, &read[i].1)),
        None => Ok(()),
    }
}

/// `kept`'s bytes from the run's [`BLOCKS`] (`file`: it opened once), refused in one line where
/// they are missing; their SHA-256 checked by [`check_kept`].
fn read_kept(file: &mut Option<std::fs::File>, dir: &Path, kept: &Kept) -> Result<Arc<[u8]>> {
    let path = dir.join(BLOCKS);
    let damaged = || damaged(dir, kept);
    if file.is_none() {
        let opened = std::fs::File::open(&path)
            .with_context(|| format!("cannot read {} (the run's kept blocks)", path.display()))?;
        *file = Some(opened);
    }
    let f = file.as_mut().expect("opened");
    // Read in place: a `Vec` made into an `Arc` is copied, two copies of the largest tensor.
    let zeroed = Arc::<[u8]>::new_zeroed_slice(usize::try_from(kept.bytes)?);
    // SAFETY: zeroed bytes are valid `u8`s.
    let mut bytes = unsafe { zeroed.assume_init() };
    let into = Arc::get_mut(&mut bytes).expect("not shared yet");
    f.seek(SeekFrom::Start(kept.offset))
        .and_then(|_| f.read_exact(into))
        .map_err(|_| damaged())?;
    Ok(bytes)
}

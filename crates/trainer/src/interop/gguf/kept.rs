//! The storage types of an imported GGUF file's matrices, kept with the run
//! (`file-types.json`), so that `--weights file` decodes each range of a matrix's rows in the
//! type the file stores it in: a "Q4_K_M" file's `Q5_0` and `Q8_0` matrices as such, a file's
//! `attn_q`, `attn_k` and `attn_v` (one matrix in tinygpt) each its own way. The decoder
//! quantises the imported values again by ggml's reference quantisers, which give a file made
//! by them (llama.cpp without an importance matrix) its own blocks back.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use tinygpt_model::parts::Mlp;
use tinygpt_model::{BlockPlan, GptConfig, Segment, WeightFormat, WeightPlan};

use super::file::{Gguf, TensorType};

/// The run file that holds them.
pub const FILE: &str = "file-types.json";

/// `rows` consecutive output rows stored as ggml's `type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub rows: usize,
    #[serde(rename = "type")]
    pub kind: String,
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
    /// from `file`.
    pub(super) fn of(gguf: &Gguf, gpt: &GptConfig, fused_qkv: bool, file: &Path) -> Result<Self> {
        let ranges = |names: &[String]| -> Result<Vec<Range>> {
            names
                .iter()
                .map(|name| {
                    let t = gguf
                        .tensor(name)
                        .ok_or_else(|| anyhow!("tensor {name} is missing"))?;
                    let rows = t.ne.get(1).copied().unwrap_or(1);
                    Ok(Range {
                        rows: usize::try_from(rows)?,
                        kind: t.kind.name().to_string(),
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
        let head = match gguf.tensor("output.weight") {
            Some(_) if !gpt.tie_embeddings => "output.weight",
            _ => "token_embd.weight",
        };
        Ok(Self {
            file: file
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            blocks,
            head: ranges(&[head.to_string()])?,
        })
    }

    /// Written into the run directory `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
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
        blocks.chain(&self.head)
    }

    /// How many matrices (ranges) of each type, as "Q5_0 ×166, Q8_0 ×31".
    pub fn summary(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for range in self.ranges() {
            *counts.entry(&range.kind).or_default() += 1;
        }
        let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        counts.join(", ")
    }

    /// The decoder's plan: each range in its file's type where the decoder has that type's
    /// kernels (F32, F16 and BF16 as f32); the others in `Q8_0`, their values requantised, and
    /// named in the second part.
    pub fn plan(&self) -> Result<(Arc<WeightPlan>, Vec<&'static str>)> {
        let mut substituted = Vec::new();
        let mut segments = |ranges: &[Range]| -> Result<Vec<Segment>> {
            ranges
                .iter()
                .map(|r| {
                    let kind = TensorType::named(&r.kind)
                        .ok_or_else(|| anyhow!("{} is not a ggml type tinygpt reads", r.kind))?;
                    let format = match kind {
                        TensorType::F32 | TensorType::F16 | TensorType::BF16 => WeightFormat::F32,
                        TensorType::Q8_0 => WeightFormat::Q8_0,
                        TensorType::Q5_0 => WeightFormat::Q5_0,
                        TensorType::Q4_0 => WeightFormat::Q4_0,
                        TensorType::Q4_1
                        | TensorType::Q5_1
                        | TensorType::Q4_K
                        | TensorType::Q5_K
                        | TensorType::Q6_K => {
                            if !substituted.contains(&kind.name()) {
                                substituted.push(kind.name());
                            }
                            WeightFormat::Q8_0
                        }
                    };
                    Ok(Segment {
                        rows: r.rows,
                        format,
                    })
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
        Ok((Arc::new(WeightPlan { blocks, head }), substituted))
    }
}

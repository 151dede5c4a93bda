//! `tinygpt attention`: a trained model's attention weights, printed row by row and drawn as
//! heatmaps. The weights come from [`Gpt::forward_with_attention`], the same attention
//! code that trains.

use std::path::Path;

use anyhow::{Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use plotters::prelude::*;
use tinygpt_model::{Decoder, FusedDecoder, Gpt};

use crate::data::tokenizer::Tokenizer;
use crate::fs::write_atomic;

/// Attention weights of one prompt: `maps[layer][head]` is a `[seq, seq]` row-major matrix
/// (rows = queries, columns = keys).
pub struct AttentionMaps {
    pub labels: Vec<String>,
    pub maps: Vec<Vec<Vec<f32>>>,
}

impl AttentionMaps {
    /// The attention weights of `prompt`, which must fit in the model's block.
    pub fn compute(
        model: &Gpt,
        tokenizer: &Tokenizer,
        prompt: &str,
        device: &Device,
    ) -> Result<Self> {
        Self::of_tokens(
            model,
            tokenizer,
            &tokenizer.encode_with_specials(prompt)?,
            device,
        )
    }

    /// [`compute`](Self::compute) for token ids.
    pub(crate) fn of_tokens(
        model: &Gpt,
        tokenizer: &Tokenizer,
        ids: &[u32],
        device: &Device,
    ) -> Result<Self> {
        let labels = labels(tokenizer, ids, model.block_size())?;
        let seq = ids.len();
        let tokens = Tensor::<2, Int>::from_data(
            TensorData::new(ids.iter().map(|&i| i as i64).collect(), [1, seq]),
            device,
        );
        let (_, weights) = model.forward_with_attention(tokens)?;
        let maps = weights
            .into_iter()
            .map(|w| {
                let [_, heads, _, _] = w.dims();
                let values = w.into_data().try_to_vec_as::<f32>().expect("f32 weights");
                values
                    .chunks(seq * seq)
                    .take(heads)
                    .map(<[f32]>::to_vec)
                    .collect()
            })
            .collect();
        Ok(Self { labels, maps })
    }

    /// The maps of `ids` computed elsewhere (`maps[layer][head]`, each `[seq, seq]`), labelled
    /// for a model of context `block_size`.
    pub(crate) fn of_weights(
        tokenizer: &Tokenizer,
        ids: &[u32],
        block_size: usize,
        maps: Vec<Vec<Vec<f32>>>,
    ) -> Result<Self> {
        let labels = labels(tokenizer, ids, block_size)?;
        Ok(Self { labels, maps })
    }

    /// [`of_tokens`](Self::of_tokens) from the fused CPU decoder's weights (f32 or int8: the
    /// weights that decoder attends with), with no Burn model; only `layer`'s maps when one is
    /// named (the others empty).
    pub(crate) fn of_decoder(
        decoder: &mut FusedDecoder,
        tokenizer: &Tokenizer,
        ids: &[u32],
        layer: Option<usize>,
    ) -> Result<Self> {
        let labels = labels(tokenizer, ids, decoder.block_size())?;
        let maps = decoder.attention_maps(ids, |l| layer.is_none_or(|x| x == l))?;
        Ok(Self { labels, maps })
    }

    fn seq(&self) -> usize {
        self.labels.len()
    }

    /// The matrix as text: token labels on rows and columns, `decimals` places.
    pub fn format(&self, layer: usize, head: usize, decimals: usize) -> String {
        let seq = self.seq();
        let map = &self.maps[layer][head];
        let width = self
            .labels
            .iter()
            .map(|l| l.chars().count())
            .max()
            .unwrap_or(1)
            .max(decimals + 2);
        let row_label = width;
        let mut out = format!("layer {layer}, head {head} (rows: queries, columns: keys)\n");
        out.push_str(&" ".repeat(row_label));
        for l in &self.labels {
            out.push_str(&format!(" {l:>width$}"));
        }
        out.push('\n');
        for (i, l) in self.labels.iter().enumerate() {
            out.push_str(&format!("{l:>row_label$}"));
            for j in 0..seq {
                out.push_str(&format!(" {:>width$.decimals$}", map[i * seq + j]));
            }
            out.push('\n');
        }
        out
    }

    /// One heatmap (`layer`, `head`) as SVG.
    pub fn heatmap(&self, layer: usize, head: usize) -> Result<String> {
        let cell = 28;
        let margin = 60;
        let size = margin + cell * self.seq() as u32 + 10;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (size, size + 30)).into_drawing_area();
            root.fill(&WHITE).map_err(draw_error)?;
            root.draw(&Text::new(
                format!("layer {layer}, head {head}"),
                (10, 8),
                ("sans-serif", 16),
            ))
            .map_err(draw_error)?;
            self.draw_cells(
                &root,
                layer,
                head,
                (margin as i32, margin as i32 + 30),
                cell as i32,
                true,
            )?;
            root.present().map_err(draw_error)?;
        }
        Ok(svg)
    }

    /// Every layer × head in one SVG grid.
    pub fn overview(&self) -> Result<String> {
        let cell = 12;
        let panel = cell * self.seq() as i32 + 30;
        let (layers, heads) = (self.maps.len() as i32, self.maps[0].len() as i32);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(
                &mut svg,
                ((heads * panel + 20) as u32, (layers * panel + 20) as u32),
            )
            .into_drawing_area();
            root.fill(&WHITE).map_err(draw_error)?;
            for layer in 0..layers {
                for head in 0..heads {
                    let (x, y) = (10 + head * panel, 10 + layer * panel);
                    root.draw(&Text::new(
                        format!("L{layer} H{head}"),
                        (x, y),
                        ("sans-serif", 11),
                    ))
                    .map_err(draw_error)?;
                    self.draw_cells(
                        &root,
                        layer as usize,
                        head as usize,
                        (x, y + 16),
                        cell,
                        false,
                    )?;
                }
            }
            root.present().map_err(draw_error)?;
        }
        Ok(svg)
    }

    fn draw_cells(
        &self,
        root: &DrawingArea<SVGBackend, plotters::coord::Shift>,
        layer: usize,
        head: usize,
        (x0, y0): (i32, i32),
        cell: i32,
        labelled: bool,
    ) -> Result<()> {
        let seq = self.seq();
        let map = &self.maps[layer][head];
        for i in 0..seq {
            for j in 0..seq {
                let w = map[i * seq + j].clamp(0.0, 1.0) as f64;
                // White (0) to dark blue (1).
                let shade = |c: f64| (255.0 - (255.0 - c) * w) as u8;
                let color = RGBColor(shade(8.0), shade(48.0), shade(107.0));
                let (x, y) = (x0 + j as i32 * cell, y0 + i as i32 * cell);
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell, y + cell)],
                    color.filled(),
                ))
                .map_err(draw_error)?;
            }
            if labelled {
                let font = ("monospace", 12);
                let l = &self.labels[i];
                root.draw(&Text::new(
                    l.clone(),
                    (
                        x0 - 8 - 7 * l.chars().count() as i32,
                        y0 + i as i32 * cell + cell / 3,
                    ),
                    font,
                ))
                .map_err(draw_error)?;
                root.draw(&Text::new(
                    l.clone(),
                    (x0 + i as i32 * cell + cell / 3, y0 - 18),
                    font,
                ))
                .map_err(draw_error)?;
            }
        }
        Ok(())
    }

    /// Writes `attention-L{l}-H{h}.svg` for the selected heads and `attention.svg` (all) in `dir`.
    pub fn write(
        &self,
        dir: &Path,
        selected: &[(usize, usize)],
    ) -> Result<Vec<std::path::PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let mut written = Vec::new();
        for &(layer, head) in selected {
            let path = dir.join(format!("attention-L{layer}-H{head}.svg"));
            write_atomic(&path, self.heatmap(layer, head)?.as_bytes())?;
            written.push(path);
        }
        let path = dir.join("attention.svg");
        write_atomic(&path, self.overview()?.as_bytes())?;
        written.push(path);
        Ok(written)
    }
}

/// Each token's label, once the prompt is checked to be non-empty and within `block_size`.
fn labels(tokenizer: &Tokenizer, ids: &[u32], block_size: usize) -> Result<Vec<String>> {
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    if ids.len() > block_size {
        bail!(
            "the prompt is {} tokens but the model's block_size is {block_size}",
            ids.len()
        );
    }
    ids.iter()
        .map(|&id| tokenizer.decode(&[id]).map(|t| label(&t)))
        .collect()
}

/// A token as a short visible label: spaces and newlines shown, not blank.
fn label(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            ' ' => '␣',
            '\n' => '⏎',
            '\t' => '⇥',
            c if c.is_control() => '·',
            c => c,
        })
        .collect()
}

fn draw_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("cannot draw the attention map: {e}")
}

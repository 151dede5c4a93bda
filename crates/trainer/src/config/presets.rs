//! What ships inside the binary, so that it works from any directory: the configs of
//! `configs/` (by name, for `--config NAME`) and the default corpus of `data/`.

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::{BUILTIN_CORPUS, RunConfig};

/// The presets, by name: the files of `configs/`, built in.
pub const PRESETS: [(&str, &str); 7] = [
    ("default", include_str!("../../../../configs/default.toml")),
    ("baby", include_str!("../../../../configs/baby.toml")),
    (
        "shakespeare-char",
        include_str!("../../../../configs/shakespeare-char.toml"),
    ),
    ("modern", include_str!("../../../../configs/modern.toml")),
    (
        "speedrun",
        include_str!("../../../../configs/speedrun.toml"),
    ),
    (
        "ten-minutes",
        include_str!("../../../../configs/ten-minutes.toml"),
    ),
    (
        "finetune",
        include_str!("../../../../configs/finetune.toml"),
    ),
];

/// Milton's *Paradise Lost*, `data/paradise-lost.txt` (see data/README.md for its source).
const PARADISE_LOST: &str = include_str!("../../../../data/paradise-lost.txt");

/// The built-in corpus when `path` names it.
pub(crate) fn builtin_corpus(path: &Path) -> Option<&'static str> {
    (path == Path::new(BUILTIN_CORPUS)).then_some(PARADISE_LOST)
}

/// Where a run's configuration comes from: `--config NAME|PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// A preset by name.
    Preset(&'static str),
    /// A TOML file.
    File(std::path::PathBuf),
}

impl ConfigSource {
    /// A preset's name means the preset; anything else is a path.
    pub fn parse(arg: &str) -> Self {
        match PRESETS.iter().find(|(name, _)| *name == arg) {
            Some((name, _)) => Self::Preset(name),
            None => Self::File(arg.into()),
        }
    }

    /// The name a run directory takes by default: the preset's, or the file's stem.
    pub fn name(&self) -> String {
        match self {
            Self::Preset(name) => name.to_string(),
            Self::File(path) => path
                .file_stem()
                .map_or("default".into(), |s| s.to_string_lossy().into_owned()),
        }
    }

    /// The config with `overrides` applied, validated.
    pub fn load(&self, overrides: &[String]) -> Result<RunConfig> {
        match self {
            Self::Preset(name) => RunConfig::load_str(preset(name)?, overrides)
                .with_context(|| format!("config {name}")),
            Self::File(path) => RunConfig::load(Some(path), overrides),
        }
    }
}

/// The TOML text of the preset `name`.
pub fn preset(name: &str) -> Result<&'static str> {
    match PRESETS.iter().find(|(n, _)| *n == name) {
        Some((_, toml)) => Ok(toml),
        None => bail!(
            "unknown config `{name}` (built in: {})",
            PRESETS.map(|(n, _)| n).join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tinygpt_model::GptConfig;

    /// Every file of configs/ is a preset, and the presets are the architectures they claim.
    #[test]
    fn the_config_files_are_the_presets() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut names: Vec<String> = PRESETS.iter().map(|(n, _)| n.to_string()).collect();
        names.sort();
        assert_eq!(files, names);
        let load = |name| ConfigSource::Preset(name).load(&[]).unwrap();
        assert_eq!(load("baby").gpt(65), GptConfig::baby(65));
        assert_eq!(load("default").gpt(65), GptConfig::baby(65));
        assert_eq!(
            load("shakespeare-char").gpt(65),
            GptConfig::shakespeare_char(65)
        );
        assert_eq!(load("modern").gpt(65), GptConfig::modern(65));
        let speedrun = load("speedrun");
        let one_block = GptConfig::modern(65).with_n_layer(1).with_n_head(2);
        assert_eq!(speedrun.gpt(65), one_block.with_bigram(true));
        assert_eq!(
            speedrun.train.lr_decay_iters, speedrun.train.max_iters,
            "the decay ends the run"
        );
        let ten = load("ten-minutes");
        let wider = GptConfig::modern(65)
            .with_n_layer(6)
            .with_n_head(4)
            .with_n_embd(256)
            .with_block_size(128);
        assert_eq!(ten.gpt(65), wider);
        assert_eq!(
            ten.train.lr_decay_iters, ten.train.max_iters,
            "the decay ends the run"
        );
        assert_eq!(
            load("default").data.path,
            std::path::PathBuf::from(BUILTIN_CORPUS)
        );
    }

    #[test]
    fn the_builtin_corpus_is_the_shipped_file() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/paradise-lost.txt");
        assert_eq!(
            builtin_corpus(Path::new(BUILTIN_CORPUS)),
            Some(std::fs::read_to_string(file).unwrap().as_str())
        );
        assert_eq!(builtin_corpus(Path::new("data/paradise-lost.txt")), None);
    }
}

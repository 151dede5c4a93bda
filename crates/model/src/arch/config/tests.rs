//! GptConfig: counted parameters, presets, validation, the bigram table's rows.

use burn::tensor::Device;

use super::*;

#[test]
fn counted_parameters_equal_the_built_model_s() {
    let configs = [
        GptConfig::baby(65),
        GptConfig::baby(50)
            .with_bias(false)
            .with_tie_embeddings(false),
        GptConfig::new(11)
            .with_n_layer(3)
            .with_n_embd(24)
            .with_n_head(3),
        GptConfig::minimal(65),
        GptConfig::modern(65),
        GptConfig::modern(65)
            .with_mlp(Mlp::SwiGlu)
            .with_n_kv_head(Some(2)),
        GptConfig::modern(65).with_bigram(true),
    ];
    for config in configs {
        let model = config.init(&Device::flex()).unwrap();
        assert_eq!(config.num_params(), model.num_params() as u64, "{config:?}");
    }
}

#[test]
fn counting_an_absurd_config_does_not_overflow() {
    let config = GptConfig::new(usize::MAX).with_n_embd(usize::MAX);
    assert_eq!(config.num_params(), u64::MAX);
}

#[test]
fn the_vocabulary_is_the_tokenizer_s_unless_padded() {
    let config = GptConfig::default();
    assert_eq!(config.for_vocabulary(65).vocab_size, 65);
    assert_eq!(config.check_vocabulary(65), Ok(()));
    let padded = config.with_vocab_size(128);
    assert_eq!(padded.for_vocabulary(65).vocab_size, 128);
    assert_eq!(
        padded.check_vocabulary(200).unwrap_err(),
        GptConfigError::VocabularyTooSmall {
            rows: 128,
            tokens: 200
        }
    );
    let err = GptConfig::default().init(&Device::flex()).unwrap_err();
    assert_eq!(err, GptConfigError::Zero { name: "vocab_size" });
}

#[test]
fn toml_writes_the_parts_and_reads_the_older_spellings() {
    let text = toml::to_string(&GptConfig::default()).unwrap();
    let keys: Vec<&str> = text.lines().filter_map(|l| l.split(" = ").next()).collect();
    assert!(!keys.contains(&"vocab_size"), "{text}");
    for part in [
        "position = \"learned\"",
        "norm = \"layer\"",
        "mlp = \"gelu\"",
    ] {
        assert!(text.contains(part), "{text}");
    }
    let read = |text: &str| toml::from_str::<GptConfig>(text);
    assert_eq!(read(&text).unwrap(), GptConfig::default());
    assert_eq!(
        read("activation = \"gelu_tanh\"").unwrap().mlp,
        Mlp::GeluTanh
    );
    // How attention is computed is not the architecture: the run's config holds it.
    assert!(read("kernel = \"flash\"").is_err());
    // What run directories from before the parts hold.
    let minimal = read("activation = \"gelu\"\nmlp = false\nlayer_norm = false").unwrap();
    assert_eq!((minimal.mlp, minimal.norm), (Mlp::None, Norm::None));
    assert_eq!(
        read("mlp = true\nlayer_norm = true").unwrap(),
        GptConfig::default()
    );
    let new = read("mlp = \"none\"\nnorm = \"none\"").unwrap();
    assert_eq!((new.mlp, new.norm), (Mlp::None, Norm::None));
    for (contradiction, named) in [
        ("norm = \"layer\"\nlayer_norm = false", "layer_norm"),
        ("mlp = \"gelu\"\nactivation = \"gelu_tanh\"", "activation"),
    ] {
        let err = read(contradiction).unwrap_err().to_string();
        assert!(err.contains(named), "{err}");
    }
    assert_eq!(read("logit_softcap = 15.0").unwrap().logit_softcap, 15.0);
    let negative = GptConfig::new(3).with_logit_softcap(-1.0).validate();
    assert_eq!(negative, Err(GptConfigError::LogitSoftcap(-1.0)));
    let modern = "position = \"rope\"\nrope_theta = 100000.0\nn_kv_head = 2\n\
                  qk_norm = true\nmlp = \"swiglu\"\nmlp_hidden = 96\nproj_init = \"zero\"";
    let modern = read(modern).unwrap();
    let want = GptConfig::default()
        .with_position(Position::Rope)
        .with_rope_theta(1e5)
        .with_n_kv_head(Some(2))
        .with_qk_norm(true)
        .with_mlp(Mlp::SwiGlu)
        .with_mlp_hidden(Some(96))
        .with_proj_init(ProjInit::Zero);
    assert_eq!(modern, want);
    assert_eq!(read(&toml::to_string(&modern).unwrap()).unwrap(), modern);
    assert_eq!(
        (modern.mlp_width(), modern.qkv_width()),
        (96, 128 + 2 * 2 * 32)
    );
    // SwiGLU's default width: 8/3 of n_embd rounded up to a multiple of 64.
    assert_eq!(GptConfig::new(3).with_mlp(Mlp::SwiGlu).mlp_width(), 384);
    for (bad, named) in [
        (GptConfig::new(3).with_n_kv_head(Some(3)), "n_kv_head"),
        (GptConfig::new(3).with_n_kv_head(Some(0)), "n_kv_head"),
        (GptConfig::new(3).with_mlp_hidden(Some(0)), "mlp_hidden"),
        (
            GptConfig::new(3)
                .with_position(Position::Rope)
                .with_rope_theta(-1.0),
            "rope_theta",
        ),
        (
            GptConfig::new(3)
                .with_position(Position::Rope)
                .with_n_head(128),
            "d_head",
        ),
    ] {
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains(named), "{err}");
    }
    for unknown in ["n_layers = 3", "mlp = \"swish\"", "norm = \"batch\""] {
        assert!(read(unknown).is_err(), "{unknown}");
    }
    let err = read("n_layers = 3").unwrap_err().to_string();
    assert!(err.contains("n_layers"), "{err}");
}

/// A bigram table has a row per pair, the first token of a context pairing with none: made
/// for small vocabularies, and a large one is refused by name before anything is built.
#[test]
fn the_bigram_table_pairs_each_token_with_the_one_before() {
    let config: GptConfig = toml::from_str("bigram = true").unwrap();
    assert!(config.bigram);
    let config = config.with_vocab_size(5);
    assert_eq!(config.bigram_rows(), 30);
    assert_eq!(config.bigram_pair(Some(2), 3), 13);
    assert_eq!(config.bigram_pair(None, 4), 29);
    assert_eq!(config.clone().with_bigram(false).bigram_rows(), 0);
    assert!(config.parts().contains("bigram"), "{}", config.parts());
    let large = GptConfig::new(BIGRAM_VOCAB + 1).with_bigram(true);
    let err = large.validate().unwrap_err();
    assert_eq!(
        err,
        GptConfigError::BigramVocabulary {
            vocab: BIGRAM_VOCAB + 1
        }
    );
    assert!(err.to_string().contains("`bigram`"), "{err}");
    let unset = GptConfig::default().with_bigram(true);
    assert!(unset.check_vocabulary(BIGRAM_VOCAB).is_ok());
    assert!(unset.check_vocabulary(50_257).is_err());
    assert!(GptConfig::default().check_vocabulary(50_257).is_ok());
}

//! A run imported from a quantised GGUF file, loaded as `generate` and `serve` load it for
//! `--weights file`: the matrices its kept blocks give (and the embedding, looked up in its own
//! blocks or a tied head's) are never read from the checkpoint nor made.

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use tinygpt::backend::{Backend, EngineKind};
use tinygpt::decoder::{DecodeWeights, Weights};
use tinygpt::run::checkpoint::{Run, Which};
use tinygpt_model::{FusedDecoder, Gpt, Matrices, WeightPlan};

/// Each parameter's Burn path and whether its values were made.
fn made(gpt: &Gpt) -> Vec<(String, bool)> {
    struct Made(Vec<(String, bool)>, Vec<String>);
    impl ModuleVisitor for Made {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.1.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.1.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push((self.1.join("."), param.is_initialized()));
        }
    }
    let mut made = Made(Vec::new(), Vec::new());
    gpt.visit(&mut made);
    made.0
}

/// The run in `dir` loaded for `--weights file` leaves unmade exactly the parameters the
/// decoder's plan does not read, and decodes `tokens` to the logits the whole model gives, bit
/// for bit. Returns the parameters it left unread.
pub fn loaded_without_kept_blocks_decodes_the_same(dir: &Path, tokens: &[u32]) -> Vec<String> {
    let run = Run::open(dir).unwrap();
    let (weights, _) = DecodeWeights::for_run(Weights::File, dir).unwrap();
    let matrices = weights.matrices(EngineKind::Fused).unwrap();
    let config = run.config.gpt(run.tokenizer.vocab_size());
    let unread = matrices.unread_parameters(&config);
    let device = Backend::Fused.placement().unwrap().device;
    let (whole, _) = run.load_model(Which::Best, &device).unwrap();
    let (lean, _) = run
        .load_model_without(Which::Best, &device, &unread)
        .unwrap();
    for (path, made) in made(&lean) {
        assert_eq!(made, !unread.contains(&path), "{path}");
    }
    let logits = |gpt: &Gpt, matrices: &Matrices| {
        let mut decoder = FusedDecoder::with_weights(gpt, matrices.clone()).unwrap();
        let mut bits: Vec<u32> = Vec::new();
        let each = |_, row: &[f32]| bits.extend(row.iter().map(|v| v.to_bits()));
        decoder.window_logits(tokens, each).unwrap();
        bits
    };
    let (from_whole, from_lean) = (logits(&whole, &matrices), logits(&lean, &matrices));
    assert!(!from_whole.is_empty());
    assert!(from_whole == from_lean, "the logits differ");
    // An embedding looked up in its own blocks gives the f32 values the import made of them.
    let Matrices::Planned(plan) = &matrices else {
        panic!("a file's matrices are planned");
    };
    if !plan.embedding.is_empty() {
        let mut in_f32 = WeightPlan::clone(plan);
        in_f32.embedding.clear();
        let in_f32 = Matrices::Planned(std::sync::Arc::new(in_f32));
        assert!(
            logits(&whole, &in_f32) == from_whole,
            "the embeddings differ"
        );
    }
    unread
}

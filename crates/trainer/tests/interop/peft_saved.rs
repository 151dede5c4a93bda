//! PEFT's `modules_to_save` (tinygpt's `[lora] also_train`): adapters saved by peft with the
//! embedding and an untied head trained whole (`llama-lora-save`), or with the embedding of a
//! tied model kept tied by `ensure_weight_tying` (`llama-mqa-lora-save`), give PEFT's logits
//! imported, and export back the same; a LoRA run trained here with `--also-train` exports and
//! reads back the same; a tied head PEFT would have trained apart is refused in one line.

use super::peft::{export_peft, import_adapter, peft_logits, peft_python, train_lora_with};
use super::*;
use tinygpt_model::names::TrainedPart;

/// The fixtures: adapter directory, its base's directory.
const SAVED: [(&str, &str); 2] = [
    ("llama-lora-save", "llama"),
    ("llama-mqa-lora-save", "llama-mqa"),
];

fn adapter_config(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("adapter_config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn peft_modules_to_save_give_peft_logits_and_export_back_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (adapter, base) in SAVED {
        import_gpt2(dir, &fixture(base), base);
        let report = ok(import_adapter(dir, &fixture(adapter), base, adapter));
        assert!(report.contains("modules_to_save"), "{report}");
        let run = Run::open(&dir.join(adapter)).unwrap();
        let lora = run.config.lora.clone().expect("a LoRA run");
        let both = [TrainedPart::Embedding, TrainedPart::Head];
        assert_eq!(lora.also_train, both, "{adapter}");
        let want = expected(adapter);
        for backend in ["flex", "fused"] {
            let err = max_relative(&logits(dir, adapter, &want.tokens, backend), &want.logits);
            eprintln!("{adapter}, {backend}: max relative error {err:.2e}");
            assert!(err <= 1e-4, "{adapter} on {backend}: {err}");
        }
        // Out as PEFT (the saved modules named as PEFT names them) and in again: the same.
        let exported = format!("{adapter}-peft");
        ok(export_peft(dir, adapter, &exported));
        let config = adapter_config(&dir.join(&exported));
        let tied = base == "llama-mqa";
        let modules = match tied {
            true => serde_json::json!(["embed_tokens"]),
            false => serde_json::json!(["embed_tokens", "lm_head"]),
        };
        assert_eq!(config["modules_to_save"], modules, "{adapter}");
        assert_eq!(config["ensure_weight_tying"], tied, "{adapter}");
        let again = format!("{adapter}-again");
        ok(import_adapter(dir, &dir.join(&exported), base, &again));
        let err = max_relative(
            &logits(dir, &again, &want.tokens, "flex"),
            &logits(dir, adapter, &want.tokens, "flex"),
        );
        assert!(err <= 1e-6, "{adapter} exported and imported: {err}");
    }
}

/// The fixture `base` imported into `dir`, a LoRA run of it trained with `--also-train
/// embedding,head`, and that run exported as PEFT: the run's and the export's names.
fn tuned_and_exported(dir: &Path, base: &str) -> (String, String) {
    import_gpt2(dir, &fixture(base), base);
    let tuned = format!("{base}-tuned");
    let parts = ["--also-train", "embedding,head"];
    ok(train_lora_with(dir, base, &tuned, &parts));
    let peft = format!("{tuned}-peft");
    ok(export_peft(dir, &tuned, &peft));
    (tuned, peft)
}

/// LoRA runs trained here with `--also-train embedding,head`, on an untied and a tied base:
/// exported as PEFT and imported back, the same logits and the same parts.
#[test]
fn a_lora_run_with_trained_parts_exports_to_peft_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tokens = [47, 70, 221, 45, 65, 78, 7, 83];
    for base in ["llama", "llama-mqa"] {
        let (tuned, peft) = tuned_and_exported(dir, base);
        let again = format!("{tuned}-again");
        ok(import_adapter(dir, &dir.join(&peft), base, &again));
        let err = max_relative(
            &logits(dir, &again, &tokens, "flex"),
            &logits(dir, &tuned, &tokens, "flex"),
        );
        assert!(err <= 1e-6, "{base}: {err}");
        let again = Run::open(&dir.join(&again)).unwrap();
        let lora = again.config.lora.unwrap();
        let both = [TrainedPart::Embedding, TrainedPart::Head];
        assert_eq!(lora.also_train, both, "{base}");
        // The base's own logits differ: the parts (and adapters) trained.
        let err = max_relative(
            &logits(dir, base, &tokens, "flex"),
            &logits(dir, &tuned, &tokens, "flex"),
        );
        assert!(err > 1e-4, "{base}: {err}");
    }
}

/// Rewrites the safetensors file `path`: each tensor's values through `edit` (`None` drops it).
fn rewrite(path: &Path, edit: impl Fn(&str, Vec<f32>) -> Option<Vec<f32>>) {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept = Vec::new();
    for (name, view) in file.tensors() {
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(values) = edit(&name, values) {
            let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            kept.push((name, view.shape().to_vec(), data));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = kept
        .iter()
        .map(|(name, shape, data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// A copy of the tied fixture adapter in `dir`, `edit`ed.
fn tied_copy(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> std::path::PathBuf {
    let copy = dir.join(name);
    std::fs::create_dir(&copy).unwrap();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(fixture("llama-mqa-lora-save").join(file), copy.join(file)).unwrap();
    }
    edit(&copy);
    copy
}

/// A tied model's embedding and head that PEFT would train apart: refused in one line,
/// nothing written.
#[test]
fn a_tied_head_trained_apart_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    import_gpt2(dir, &fixture("llama-mqa"), "llama-mqa");
    let weights = |copy: &Path| copy.join("adapter_model.safetensors");
    // The head saved other than the embedding.
    let apart = tied_copy(dir, "apart", |copy| {
        rewrite(&weights(copy), |name, mut values| {
            if name.ends_with("lm_head.weight") {
                values[0] += 1.0;
            }
            Some(values)
        })
    });
    // The embedding alone, without ensure_weight_tying: PEFT's head stays the base's.
    let untied = tied_copy(dir, "untied", |copy| {
        rewrite(&weights(copy), |name, values| {
            (!name.ends_with("lm_head.weight")).then_some(values)
        });
        let path = copy.join("adapter_config.json");
        let mut config = adapter_config(copy);
        config["ensure_weight_tying"] = false.into();
        std::fs::write(path, config.to_string()).unwrap();
    });
    for (copy, why) in [(apart, "differ"), (untied, "ensure_weight_tying")] {
        let out = format!("{}-run", copy.file_name().unwrap().to_str().unwrap());
        fails(import_adapter(dir, &copy, "llama-mqa", &out), why);
        assert!(!dir.join(&out).exists(), "{out} was written");
    }
}

/// PEFT itself loads what `export --format peft` wrote for LoRA runs trained here with
/// `--also-train embedding,head` (an untied and a tied base), onto the fixtures' directories,
/// and computes tinygpt's logits. Needs a Python with torch, transformers and peft, so it is
/// reported as ignored unless asked for (`cargo test --release -- --ignored`).
#[test]
#[ignore = "needs Python with torch + transformers + peft (TINYGPT_PYTHON): cargo test --release -- --ignored"]
fn peft_loads_exported_trained_parts_needs_python() {
    let python = peft_python();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tokens = [47u32, 70, 221, 45, 65, 78, 7, 83];
    for base in ["llama", "llama-mqa"] {
        let (tuned, peft) = tuned_and_exported(dir, base);
        let theirs = peft_logits(&python, dir, base, &peft, &tokens);
        let err = max_relative(&logits(dir, &tuned, &tokens, "flex"), &theirs);
        eprintln!(
            "PEFT on tinygpt's {base} adapter with trained parts: max relative error {err:.2e}"
        );
        assert!(err <= 1e-4, "{base}: {err}");
    }
}

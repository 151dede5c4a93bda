//! Generation: the cache, seeds, streaming and stop sequences, the context shift, cancellation,
//! scoring, and bad requests.

use super::*;

// ---------------------------------------------------------------- generation

/// Greedy decoding with the KV cache gives exactly the tokens of recomputing the context every
/// step, over 3 × block_size tokens (so the window slides).
#[test]
fn cached_greedy_equals_uncached_greedy() {
    let _seeded = seeded();
    for device in [Device::flex(), ndarray()] {
        let model = patterned_model(&device);
        let greedy = GenerateOptions {
            temperature: 0.0,
            max_new_tokens: 3 * 16,
            ..Default::default()
        };
        let cached = model.generate(&[1, 5], &greedy, |_| {}).unwrap();
        let plain = model
            .generate(
                &[1, 5],
                &GenerateOptions {
                    use_cache: false,
                    ..greedy.clone()
                },
                |_| {},
            )
            .unwrap();
        assert_eq!(cached.len(), 48);
        assert_eq!(cached, plain);
        // It learned the cycle 1 5 2 7 3 5 9.
        assert_eq!(&cached[..7], &[2, 7, 3, 5, 9, 1, 5]);
    }
}

/// Models of each newer part (RMSNorm with a learned gain and without, ReLU² and SwiGLU, soft-capped
/// logits, rotary positions, grouped and multi-query heads, QK-norm, zero-initialised
/// projections, and nanochat's combination of them) learn the pattern too, and decode through the
/// cache exactly as through the window (the rotary positions of cached keys included).
#[test]
fn newer_parts_learn_and_decode_as_they_forward() {
    let _seeded = seeded();
    let device = Device::flex();
    type Part = fn(GptConfig) -> GptConfig;
    let parts: [(&str, Part); 11] = [
        ("rms", |c| c.with_norm(Norm::Rms)),
        ("rms_unit", |c| c.with_norm(Norm::RmsUnit)),
        ("relu2", |c| c.with_mlp(Mlp::Relu2)),
        ("swiglu", |c| c.with_mlp(Mlp::SwiGlu)),
        ("softcap", |c| c.with_logit_softcap(15.0)),
        ("rope", |c| c.with_position(Position::Rope)),
        ("gqa", |c| c.with_n_head(4).with_n_kv_head(Some(2))),
        ("mqa + rope", |c| {
            c.with_n_kv_head(Some(1)).with_position(Position::Rope)
        }),
        ("qk_norm", |c| c.with_qk_norm(true)),
        ("zero proj", |c| c.with_proj_init(ProjInit::Zero)),
        ("modern", |c| {
            let m = GptConfig::modern(12);
            c.with_position(m.position)
                .with_norm(m.norm)
                .with_mlp(m.mlp)
                .with_qk_norm(m.qk_norm)
                .with_bias(m.bias)
                .with_tie_embeddings(m.tie_embeddings)
                .with_logit_softcap(m.logit_softcap)
                .with_proj_init(m.proj_init)
        }),
    ];
    for (name, part) in parts {
        let model = patterned_model_with(&device, part);
        let greedy = GenerateOptions {
            temperature: 0.0,
            max_new_tokens: 2 * 16,
            ..Default::default()
        };
        let cached = model.generate(&[1, 5], &greedy, |_| {}).unwrap();
        let plain = GenerateOptions {
            use_cache: false,
            ..greedy.clone()
        };
        assert_eq!(
            cached,
            model.generate(&[1, 5], &plain, |_| {}).unwrap(),
            "{name}"
        );
        assert_eq!(&cached[..7], &[2, 7, 3, 5, 9, 1, 5], "{name}");
    }
}

/// With a soft-cap of 2, no logit passes ±2 however large the weights grow (in f32, tanh of a
/// large score rounds to exactly 1), and the logits are `2·tanh(raw / 2)` of the uncapped
/// model's.
#[test]
fn soft_capped_logits_stay_inside_the_cap() {
    let _seeded = seeded();
    let device = Device::flex();
    let config = GptConfig::new(12).with_n_layer(1).with_block_size(8);
    let mut raw = config.clone().init(&device).unwrap();
    raw.wte.weight = raw.wte.weight.map(|w| w.mul_scalar(300.0));
    let mut capped = config.with_logit_softcap(2.0).init(&device).unwrap();
    capped = capped.load_record(raw.clone().into_record());
    let tokens = ints(&[1, 5, 2, 7, 3, 5, 9, 1], [1, 8], &device);
    let (raw, capped) = (
        values(raw.forward(tokens.clone(), Pass::Infer).unwrap()),
        values(capped.forward(tokens, Pass::Infer).unwrap()),
    );
    assert!(
        raw.iter().any(|l| l.abs() > 10.0),
        "the raw logits are not large"
    );
    for (r, c) in raw.iter().zip(&capped) {
        assert!(c.abs() <= 2.0, "{c}");
        assert!((c - 2.0 * (r / 2.0).tanh()).abs() < 1e-5, "{c} vs {r}");
    }
}

#[test]
fn same_seed_same_samples() {
    let _seeded = seeded();
    let device = Device::flex();
    let model = GptConfig::new(30).with_n_layer(1).init(&device).unwrap();
    let options = GenerateOptions {
        temperature: 1.0,
        top_k: None,
        max_new_tokens: 40,
        ..Default::default()
    };
    let a = model.generate(&[3], &options, |_| {}).unwrap();
    let b = model.generate(&[3], &options, |_| {}).unwrap();
    let c = model
        .generate(
            &[3],
            &GenerateOptions {
                seed: 7,
                ..options.clone()
            },
            |_| {},
        )
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c, "a different seed gave the same 40 samples");
}

/// Tokens stream through the callback; a stop sequence ends generation and is neither returned
/// nor streamed.
#[test]
fn streams_and_stops() {
    let _seeded = seeded();
    let device = Device::flex();
    let model = patterned_model(&device);
    let mut streamed = Vec::new();
    let options = GenerateOptions {
        temperature: 0.0,
        max_new_tokens: 30,
        stop: vec![vec![3, 5]],
        ..Default::default()
    };
    let out = model
        .generate(&[1, 5], &options, |t| streamed.push(t))
        .unwrap();
    assert_eq!(out, [2, 7]);
    assert_eq!(streamed, out);
}

/// With `context_shift`, each token is the greedy choice of a plain forward pass over the
/// window the rule names (the last half block once the block overflows), and the cache is
/// rebuilt once per half block instead of at every step past the block.
#[test]
fn context_shift_rebuilds_once_per_half_block() {
    let _seeded = seeded();
    let device = Device::flex();
    let model = GptConfig::new(20)
        .with_block_size(16)
        .with_n_layer(2)
        .with_n_embd(32)
        .init(&device)
        .unwrap();
    let greedy = GenerateOptions {
        temperature: 0.0,
        max_new_tokens: 62,
        ..Default::default()
    };
    let shift = GenerateOptions {
        context_shift: true,
        ..greedy.clone()
    };
    let mut counting = common::Counted::new(model.decoder());
    let got = generate(&mut counting, &[1, 2], &shift, |_| {}).unwrap();

    // The reference: the whole window through `forward`, no cache.
    let mut tokens = vec![1u32, 2];
    let mut start = 0;
    for _ in 0..62 {
        if tokens.len() - start > 16 {
            start = tokens.len() - 8;
        }
        let window: Vec<i64> = tokens[start..].iter().map(|&t| t.into()).collect();
        let logits = model
            .forward(ints(&window, [1, window.len()], &device), Pass::Infer)
            .unwrap();
        let last = values(logits.slice([0..1, window.len() - 1..window.len(), 0..20]));
        let best = (0..20)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap();
        tokens.push(best as u32);
    }
    assert_eq!(got, tokens[2..]);
    // 64 tokens: 16 in the first window, then a rebuild of 8 every 8 tokens (6 of them).
    assert_eq!(counting.clears, 1 + 6);
    assert_eq!(counting.fed, 63 + 6 * 7);

    // The exact rule rebuilds the whole window at every step past the block.
    let mut exact = common::Counted::new(model.decoder());
    generate(&mut exact, &[1, 2], &greedy, |_| {}).unwrap();
    assert_eq!(exact.clears, 1 + (63 - 16));
    assert!(
        exact.fed > 5 * counting.fed,
        "{} vs {}",
        exact.fed,
        counting.fed
    );
}

/// `on_token` returning `Break` ends generation there: the tokens so far are returned and the
/// model runs no further.
#[test]
fn generation_can_be_cancelled() {
    let _seeded = seeded();
    let device = Device::flex();
    let model = patterned_model(&device);
    let options = GenerateOptions {
        temperature: 0.0,
        max_new_tokens: 40,
        ..Default::default()
    };
    let mut counting = common::Counted::new(model.decoder());
    let mut seen = 0;
    let out = generate_cancellable(&mut counting, &[1, 5], &options, |_| {
        seen += 1;
        match seen {
            5 => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    })
    .unwrap();
    assert_eq!(out, [2, 7, 3, 5, 9]);
    assert_eq!(counting.fed, 2 + 4, "the model ran past the cancellation");
}

/// `score` gives each token's log-probability given the tokens before it: the log-softmax of a
/// plain forward over the window that ends before it, also once the window slides past
/// block_size; inside one window the sum is minus the total cross-entropy.
#[test]
fn scoring_equals_the_forward_pass_window_by_window() {
    let _seeded = seeded();
    let device = Device::flex();
    let model = patterned_model(&device);
    let tokens: Vec<u32> = (0..19).map(|i| (i * 7 % 10) as u32).collect();
    let scored = score(&mut model.decoder(), &tokens, 3).unwrap();
    assert_eq!(scored.len(), tokens.len() - 1);
    for next in 1..tokens.len() {
        let start = next.saturating_sub(16);
        let window: Vec<i64> = tokens[start..next].iter().map(|&t| t.into()).collect();
        let logits = model
            .forward(ints(&window, [1, window.len()], &device), Pass::Infer)
            .unwrap();
        let row = values(log_softmax(logits, 2).slice([0..1, next - start - 1..next - start]));
        let got = &scored[next - 1];
        assert_eq!(got.id, tokens[next]);
        assert!(
            (got.logprob - row[tokens[next] as usize]).abs() < 1e-4,
            "token {next}: {} vs {}",
            got.logprob,
            row[tokens[next] as usize]
        );
        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert!((got.top[0].1 - best).abs() < 1e-4 && got.top.len() == 3);
    }
    let first: Vec<i64> = tokens[..16].iter().map(|&t| t.into()).collect();
    let logits = model
        .forward(ints(&first[..15], [1, 15], &device), Pass::Infer)
        .unwrap();
    let targets = Tensor::<1, Int>::from_data(TensorData::new(first[1..].to_vec(), [15]), &device);
    let loss = cross_entropy(logits.reshape([15, 12]), targets)
        .unwrap()
        .into_scalar::<f32>();
    let total: f32 = scored[..15].iter().map(|s| s.logprob).sum();
    assert!(
        (total + 15.0 * loss).abs() < 1e-3,
        "{total} vs {}",
        -15.0 * loss
    );
}

#[test]
fn bad_generation_requests_are_errors() {
    let _seeded = seeded();
    let device = Device::flex();
    let model = GptConfig::new(10).with_n_layer(1).init(&device).unwrap();
    let ok = GenerateOptions::default();
    assert_eq!(
        model.generate(&[], &ok, |_| {}).unwrap_err(),
        GenerateError::EmptyPrompt
    );
    let err = model.generate(&[12], &ok, |_| {}).unwrap_err();
    assert_eq!(
        err.to_string(),
        "token id 12 is outside the vocabulary of 10 tokens"
    );
    let err = model
        .generate(&[1], &GenerateOptions { top_p: 0.0, ..ok }, |_| {})
        .unwrap_err();
    assert_eq!(err, GenerateError::TopP(0.0));
}

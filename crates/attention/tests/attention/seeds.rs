//! Checks without a backend: typed config errors, the mask builders against PyTorch's, and the
//! seeds' printed matrices and traps reproduced.

use super::*;

// ---------------------------------------------------------------- backend-free checks

#[test]
fn config_errors_are_typed() {
    let device = Device::flex();
    let init = |c: CausalSelfAttentionConfig| c.init(&device).map(|_| ()).unwrap_err();
    assert_eq!(
        init(CausalSelfAttentionConfig::new(10, 3, 8)),
        AttentionConfigError::HeadsDoNotDivide {
            d_model: 10,
            n_heads: 3
        }
    );
    assert_eq!(
        init(CausalSelfAttentionConfig::new(8, 0, 8)),
        AttentionConfigError::Zero { name: "n_heads" }
    );
    assert_eq!(
        init(CausalSelfAttentionConfig::new(8, 2, 0)),
        AttentionConfigError::Zero {
            name: "max_seq_len"
        }
    );
    for p in [1.0, -0.1, f64::NAN] {
        let err = init(CausalSelfAttentionConfig::new(8, 2, 8).with_dropout(p));
        assert!(
            matches!(err, AttentionConfigError::Dropout(_)),
            "dropout {p}: {err:?}"
        );
    }
    let err = init(CausalSelfAttentionConfig::new(8, 2, 8).with_init_std(-1.0));
    assert_eq!(
        err.to_string(),
        "attention `init_std` must be a finite number >= 0, got -1"
    );
}

#[test]
fn mask_builders_match_pytorch() {
    let device = Device::flex();
    // torch.triu(torch.ones(3, 3), diagonal=1).bool()
    let hidden: Vec<bool> = causal_mask(3, &device).into_data().try_to_vec().unwrap();
    assert_eq!(
        hidden,
        [false, true, true, false, false, true, false, false, false]
    );
    // torch.tril(torch.ones(3, 3)) is the complement of the causal mask
    assert_eq!(
        values(tril(3, &device)),
        [1., 0., 0., 1., 1., 0., 1., 1., 1.]
    );
    assert_eq!(
        values(triu(3, 1, &device)),
        [0., 1., 1., 0., 0., 1., 0., 0., 0.]
    );
}

/// Seed 000's 6×6 softmax weights, masked with tril and renormalised, give the seed's printed
/// result (4 printed decimals).
#[test]
fn renormalising_reproduces_seed_000() {
    let device = Device::flex();
    let weights: [f32; 36] = [
        0.2843, 0.1406, 0.0708, 0.1859, 0.2022, 0.1162, 0.4084, 0.0497, 0.0132, 0.2621, 0.1949,
        0.0716, 0.2651, 0.1697, 0.0899, 0.1612, 0.1978, 0.1162, 0.0861, 0.1763, 0.3177, 0.1171,
        0.1168, 0.1859, 0.2457, 0.1271, 0.0828, 0.2106, 0.1939, 0.1400, 0.1144, 0.1889, 0.2594,
        0.1273, 0.1365, 0.1735,
    ];
    let printed: [f32; 36] = [
        1.0000, 0.0, 0.0, 0.0, 0.0, 0.0, 0.8914, 0.1086, 0.0, 0.0, 0.0, 0.0, 0.5052, 0.3234,
        0.1713, 0.0, 0.0, 0.0, 0.1235, 0.2529, 0.4556, 0.1680, 0.0, 0.0, 0.2857, 0.1478, 0.0963,
        0.2448, 0.2255, 0.0, 0.1144, 0.1889, 0.2594, 0.1273, 0.1365, 0.1735,
    ];
    // softmax(log w) = w: feed the printed weights back as scores.
    let scores = Tensor::<2>::from_data(TensorData::new(weights.to_vec(), [6, 6]), &device).log();
    let got = values(softmax_then_renormalise(scores.clone(), tril(6, &device)));
    let err = got
        .iter()
        .zip(printed)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err < 2e-4, "max abs error {err} against seed 000");
    let filled = values(mask_then_softmax(scores, causal_mask(6, &device)));
    assert_close(&filled, &got, 1e-6, "seed 000 both methods");
}

/// Seed 002's raw 5×5 scores, masked with -inf-like fill and softmaxed, give its printed weights.
#[test]
#[allow(clippy::approx_constant)] // 0.3926 is a printed score, not π/8
fn filling_reproduces_seed_002() {
    let device = ndarray();
    let raw: [f32; 25] = [
        0.7918, -0.5124, 0.7467, -0.1884, -0.7821, -0.0497, -0.0079, -0.2227, 0.0234, 0.1894,
        -0.9871, 0.3926, 0.0859, 0.3219, 0.9626, -0.3943, 0.1961, -0.0807, 0.1332, 0.4240, -0.9710,
        0.5766, -0.3295, 0.3093, 0.9815,
    ];
    let printed: [f32; 25] = [
        1.0, 0.0, 0.0, 0.0, 0.0, 0.4896, 0.5104, 0.0, 0.0, 0.0, 0.1266, 0.5032, 0.3702, 0.0, 0.0,
        0.1704, 0.3076, 0.2332, 0.2888, 0.0, 0.0548, 0.2576, 0.1041, 0.1972, 0.3862,
    ];
    let scores = Tensor::<2>::from_data(TensorData::new(raw.to_vec(), [5, 5]), &device);
    let got = values(mask_then_softmax(scores, causal_mask(5, &device)));
    let err = got
        .iter()
        .zip(printed)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err < 1e-4, "max abs error {err} against seed 002");
}

/// Seed 001's shortcut, `tril(scores)` then "fill every 0 with -inf", hides a visible score that
/// is exactly 0. Masks must come from positions, as `causal_mask` builds them.
#[test]
fn masking_by_value_is_a_trap() {
    let device = Device::flex();
    let raw = [0.5f32, 9.0, 0.0, 0.0, 0.7, 9.0, 0.2, 0.1, 0.4]; // score (1, 0) is a genuine 0
    let scores = Tensor::<2>::from_data(TensorData::new(raw.to_vec(), [3, 3]), &device);
    let right = values(mask_then_softmax(scores.clone(), causal_mask(3, &device)));
    let lowered = scores.tril(0);
    let by_value = lowered.clone().equal_elem(0.0);
    let wrong = values(mask_then_softmax(lowered, by_value));
    let expect = 1.0 / (1.0 + 0.7f32.exp()); // softmax([0, 0.7])[0]
    assert!(
        (right[3] - expect).abs() < 1e-6,
        "position mask: {} vs {expect}",
        right[3]
    );
    assert_eq!(wrong[3], 0.0, "value mask hid a visible key");
}

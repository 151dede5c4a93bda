//! The ideas newer GPTs add, proved: rotary positions keep lengths and make scores depend on the
//! distance only, and are Burn's interleaved rotation of permuted channels; grouped-query
//! attention equals multi-head attention over repeated key/value heads; QK-norm bounds the
//! scores.

use burn::nn::RotaryEncodingConfig;
use tinygpt_attention::grouped::{grouped_attention, repeat_kv};
use tinygpt_attention::qk_norm::rms_norm_heads;
use tinygpt_attention::rope::{RopeTables, rotate_half, signed_sines, swap_halves};

use super::*;

/// The Euclidean length of each `[d]` row of `x`.
fn lengths(x: &[f32], d: usize) -> Vec<f32> {
    x.chunks(d)
        .map(|row| row.iter().map(|v| v * v).sum::<f32>().sqrt())
        .collect()
}

fn dot(a: Tensor<4>, b: Tensor<4>) -> f32 {
    values((a * b).sum())[0]
}

#[test]
fn rope_rotates_pairs_by_the_position_angles() {
    let device = Device::flex();
    fresh_draws();
    let (seq, d, base) = (6, 8, 10000.0);
    let x = random([1, 2, seq, d], &device);
    let tables = RopeTables::new(seq + 3, d, base, &device).unwrap();
    let got = values(tables.apply(x.clone(), 3));
    // By hand in f64: pair (i, i + d/2) at position m turned by m · base^(-2i/d).
    let x = values(x);
    let mut want = vec![0f32; x.len()];
    for (r, row) in x.chunks(d).enumerate() {
        let m = (r % seq + 3) as f64;
        for i in 0..d / 2 {
            let angle = m * f64::powf(base, -2.0 * i as f64 / d as f64);
            let (a, b) = (f64::from(row[i]), f64::from(row[i + d / 2]));
            want[r * d + i] = (a * angle.cos() - b * angle.sin()) as f32;
            want[r * d + i + d / 2] = (b * angle.cos() + a * angle.sin()) as f32;
        }
    }
    assert_close(&got, &want, 1e-5, "rope vs the f64 rotation");
    // Position 0 is no rotation at all.
    let x0 = random([1, 1, 1, d], &device);
    assert_close(
        &values(tables.apply(x0.clone(), 0)),
        &values(x0),
        0.0,
        "position 0",
    );
    assert_eq!(
        RopeTables::new(4, 7, base, &device).unwrap_err(),
        AttentionConfigError::RopeOddHead { d_head: 7 }
    );
    assert!(RopeTables::new(4, 8, 0.0, &device).is_err());
}

/// The layer's form of the rotation, `swap_halves(x)·sin±`, is `rotate_half(x)·sin`: the halves
/// swapped by one flip, the sign moved into the sines. Exactly, not to rounding.
#[test]
fn swapped_halves_times_signed_sines_is_rotate_half_times_sines() {
    let device = Device::flex();
    fresh_draws();
    let (seq, d) = (5, 12);
    let x = random([2, 3, seq, d], &device);
    let sin: Vec<f32> = (0..seq * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let table =
        |values: Vec<f32>| Tensor::<4>::from_data(TensorData::new(values, [1, 1, seq, d]), &device);
    let want = values(rotate_half(x.clone()) * table(sin.clone()));
    let got = values(swap_halves(x.clone()) * table(signed_sines(&sin, d)));
    assert_eq!(got, want);
    // The swap alone: [a, b] → [b, a] in every row.
    let (x, swapped) = (values(x.clone()), values(swap_halves(x)));
    for (row, out) in x.chunks(d).zip(swapped.chunks(d)) {
        assert_eq!(out, [&row[d / 2..], &row[..d / 2]].concat());
    }
}

#[test]
fn rope_keeps_every_vectors_length() {
    let device = Device::flex();
    fresh_draws();
    let x = random([2, 3, 40, 16], &device).mul_scalar(3.0);
    let tables = RopeTables::new(64, 16, 10000.0, &device).unwrap();
    let rotated = values(tables.apply(x.clone(), 7));
    assert_close(
        &lengths(&rotated, 16),
        &lengths(&values(x), 16),
        1e-5,
        "lengths",
    );
}

/// A query at position `m` and a key at `n`, both rotated: the score is the same wherever the
/// pair sits (`m + t`, `n + t`), and changes with the distance `n − m`.
#[test]
fn rope_scores_depend_on_the_distance_only() {
    let device = Device::flex();
    fresh_draws();
    let (q, k) = (
        random([1, 1, 1, 16], &device),
        random([1, 1, 1, 16], &device),
    );
    let tables = RopeTables::new(200, 16, 10000.0, &device).unwrap();
    let score = |m: usize, n: usize| dot(tables.apply(q.clone(), m), tables.apply(k.clone(), n));
    let at_3_7 = score(3, 7);
    for t in [1, 10, 50, 150] {
        let shifted = score(3 + t, 7 + t);
        assert!(
            (shifted - at_3_7).abs() < 1e-4 * at_3_7.abs().max(1.0),
            "shifted by {t}: {shifted} vs {at_3_7}"
        );
    }
    let other_distance = score(3, 9);
    assert!(
        (other_distance - at_3_7).abs() > 1e-3,
        "{other_distance} vs {at_3_7}"
    );
    // Without rotation the score is q·k whatever the positions; with it, only at distance 0.
    assert!((score(5, 5) - dot(q, k)).abs() < 1e-4);
}

/// Burn's `RotaryEncoding` pairs neighbouring channels `(2i, 2i + 1)`; the `rotate_half` layout
/// pairs the halves `(i, i + d/2)`. Interleave the channels, rotate with Burn, put them back:
/// the same numbers.
#[test]
fn rope_is_burns_interleaved_rotation_of_permuted_channels() {
    let device = Device::flex();
    fresh_draws();
    let (seq, d) = (12, 8);
    let x = random([1, 2, seq, d], &device);
    let ours = values(
        RopeTables::new(seq, d, 10000.0, &device)
            .unwrap()
            .apply(x.clone(), 0),
    );
    // Channel i goes to 2i and channel i + d/2 to 2i + 1.
    let to_pairs: Vec<usize> = (0..d / 2).flat_map(|i| [i, i + d / 2]).collect();
    let permute = |v: &[f32], order: &[usize]| -> Vec<f32> {
        v.chunks(d)
            .flat_map(|row| order.iter().map(|&c| row[c]).collect::<Vec<_>>())
            .collect()
    };
    let interleaved = Tensor::<4>::from_data(
        TensorData::new(permute(&values(x), &to_pairs), [1, 2, seq, d]),
        &device,
    );
    let burn = RotaryEncodingConfig::new(seq, d).init(&device);
    let rotated = values(burn.forward(interleaved));
    let mut back = vec![0usize; d];
    for (slot, &c) in to_pairs.iter().enumerate() {
        back[c] = slot;
    }
    assert_close(
        &permute(&rotated, &back),
        &ours,
        1e-5,
        "burn vs rotate_half",
    );
    // rotate_half twice is a half turn: x -> -x.
    let y = random([1, 1, 2, d], &device);
    let twice = values(rotate_half(rotate_half(y.clone())));
    assert_close(&twice, &values(y.neg()), 0.0, "rotate_half twice");
}

/// 6 query heads over 2 key/value heads (groups of 3), and over 1 (multi-query): the grouped
/// computation, which copies nothing, equals multi-head attention over repeated heads, head by
/// head; with as many key/value heads as query heads it is multi-head attention.
#[test]
fn grouped_query_attention_equals_attention_over_repeated_heads() {
    let device = Device::flex();
    fresh_draws();
    let (b, heads, seq, d) = (2, 6, 9, 4);
    let q = random([b, heads, seq, d], &device);
    let hidden = causal_mask(seq, &device);
    for kv_heads in [6, 2, 1] {
        let (k, v) = (
            random([b, kv_heads, seq, d], &device),
            random([b, kv_heads, seq, d], &device),
        );
        let grouped = grouped_attention(q.clone(), k.clone(), v.clone(), hidden.clone());
        let group = heads / kv_heads;
        let (k_all, v_all) = (repeat_kv(k.clone(), group), repeat_kv(v, group));
        assert_eq!(k_all.dims(), [b, heads, seq, d]);
        // Head h of the repeated keys is head h / group of the originals.
        for h in 0..heads {
            let head = |t: Tensor<4>, i: usize| values(t.slice([0..b, i..i + 1, 0..seq, 0..d]));
            assert_eq!(head(k_all.clone(), h), head(k.clone(), h / group));
        }
        let scores = q.clone().matmul(k_all.swap_dims(2, 3)) / (d as f64).sqrt();
        let weights = mask_then_softmax(scores, hidden.clone().reshape([1, 1, seq, seq]));
        let multi_head = weights.matmul(v_all);
        assert_close(
            &values(grouped),
            &values(multi_head),
            1e-5,
            &format!("{kv_heads} key/value heads"),
        );
    }
}

/// After QK-norm every query and key vector has unit RMS (length √d_head), so every scaled
/// score lies within ±√d_head however large the projections grew.
#[test]
fn qk_norm_bounds_every_score() {
    let device = Device::flex();
    fresh_draws();
    let d = 16;
    let q = rms_norm_heads(random([2, 3, 10, d], &device).mul_scalar(50.0), 1e-6);
    let k = rms_norm_heads(random([2, 3, 10, d], &device).mul_scalar(50.0), 1e-6);
    let unit = (d as f32).sqrt();
    for length in lengths(&values(q.clone()), d) {
        assert!((length - unit).abs() < 1e-4, "{length} vs {unit}");
    }
    let scores = values(q.matmul(k.swap_dims(2, 3)) / (d as f64).sqrt());
    let bound = (d as f32).sqrt() + 1e-4;
    assert!(
        scores.iter().all(|s| s.abs() <= bound),
        "a score beyond ±{bound}"
    );
    assert!(
        scores.iter().any(|s| s.abs() > 1.0),
        "the bound is not trivially met"
    );
}

/// The layer with grouped heads is multi-head attention whose key/value projections are the
/// grouped ones repeated: build both from the same weights (the repeated layer's `c_attn` has
/// each key and value head's columns once per query head of its group) and compare outputs, with
/// and without rotary positions and QK-norm, on every kernel the device offers.
#[test]
fn grouped_layer_equals_multi_head_layer_over_repeated_projections() {
    let device = Device::flex();
    fresh_draws();
    let (d, heads, kv, seq) = (24, 6, 2, 9);
    let d_head = d / heads;
    for (rope, qk_norm) in [(None, None), (Some(10000.0), Some(1e-6))] {
        let grouped = drawn(
            &config(d, heads, seq)
                .with_n_kv_heads(Some(kv))
                .with_rope_base(rope)
                .with_qk_norm_eps(qk_norm),
            &device,
        );
        assert_eq!(grouped.c_attn.weight.dims(), [d, (heads + 2 * kv) * d_head]);
        let mut full = drawn(
            &config(d, heads, seq)
                .with_rope_base(rope)
                .with_qk_norm_eps(qk_norm),
            &device,
        );
        // Column blocks of the grouped layer: q heads, then k heads, then v heads.
        let w = grouped.c_attn.weight.val();
        let b = grouped.c_attn.bias.as_ref().unwrap().val();
        let head_cols = |t: &Tensor<2>, h: usize| t.clone().narrow(1, h * d_head, d_head);
        let head_bias = |t: &Tensor<1>, h: usize| t.clone().narrow(0, h * d_head, d_head);
        let group = heads / kv;
        let order: Vec<usize> = (0..heads)
            .chain((0..heads).map(|h| heads + h / group))
            .chain((0..heads).map(|h| heads + kv + h / group))
            .collect();
        let weight = Tensor::cat(order.iter().map(|&h| head_cols(&w, h)).collect(), 1);
        let bias = Tensor::cat(order.iter().map(|&h| head_bias(&b, h)).collect(), 0);
        full.c_attn.weight = full.c_attn.weight.map(|_| weight);
        full.c_attn.bias = full.c_attn.bias.map(|p| p.map(|_| bias));
        full.c_proj = grouped.c_proj.clone();
        let x = random([2, seq, d], &device);
        for kernel in [AttentionKernel::Explicit, AttentionKernel::Sdpa] {
            let (g, f) = (with_kernel(&grouped, kernel), with_kernel(&full, kernel));
            assert_close(
                &values(g.forward(x.clone(), None, Pass::Infer).unwrap()),
                &values(f.forward(x.clone(), None, Pass::Infer).unwrap()),
                1e-5,
                &format!("{kernel:?}, rope {rope:?}"),
            );
        }
    }
}

/// With rotary positions, grouped heads and QK-norm, feeding a sequence through the cache in
/// pieces gives the outputs of one pass: the cached keys keep the rotation of their own
/// positions and each new piece is rotated by where it starts.
#[test]
fn rotary_grouped_layer_decodes_as_it_forwards() {
    let device = Device::flex();
    fresh_draws();
    let (d, seq) = (16, 11);
    let layer = drawn(
        &config(d, 4, seq)
            .with_n_kv_heads(Some(1))
            .with_rope_base(Some(500.0))
            .with_qk_norm_eps(Some(1e-6)),
        &device,
    );
    let x = random([2, seq, d], &device);
    let whole = values(layer.forward(x.clone(), None, Pass::Infer).unwrap());
    for mut cache in [KvCache::new(), KvCache::with_capacity(seq)] {
        let mut pieces = Vec::new();
        for range in [0..4, 4..5, 5..11] {
            let piece = x.clone().narrow(1, range.start, range.len());
            pieces.push(layer.forward_cached(piece, &mut cache).unwrap());
        }
        assert_close(
            &values(Tensor::cat(pieces, 1)),
            &whole,
            1e-5,
            "cached pieces",
        );
    }
    // A key/value head count that does not divide the heads is refused by name.
    let err = config(d, 4, seq).with_n_kv_heads(Some(3)).init(&device);
    assert!(matches!(
        err,
        Err(AttentionConfigError::KvHeadsDoNotDivide { .. })
    ));
}

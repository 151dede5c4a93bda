//! Continuous batching: one new token for each of several sequences of different lengths, in
//! one call, each row attending to its own cache only.

use super::*;

/// A plain layer of 4 heads, and one with grouped heads, rotary positions and QK-norm.
fn two_layers(d: usize, max_seq: usize, device: &Device) -> [CausalSelfAttention; 2] {
    [
        drawn(&config(d, 4, max_seq), device),
        drawn(
            &config(d, 4, max_seq)
                .with_n_kv_heads(Some(2))
                .with_rope_base(Some(500.0))
                .with_qk_norm_eps(Some(1e-6)),
            device,
        ),
    ]
}

/// Rows of sequences 0, 1, 6 and 10 tokens long (growing and fixed caches mixed) decoded in
/// one [`CausalSelfAttention::forward_rows`] call, twice, give each sequence's outputs of one
/// whole pass: the shorter rows' missing keys are hidden, the rows' keys never mix.
pub(super) fn rows_decode_as_each_alone(device: &Device) {
    let (d, max_seq) = (16, 12);
    let layers = two_layers(d, max_seq, device);
    let lengths = [6, 0, 10, 1];
    for layer in &layers {
        let xs: Vec<Tensor<3>> = lengths
            .iter()
            .map(|&n| random([1, n + 2, d], device))
            .collect();
        let mut caches: Vec<KvCache> = (0..lengths.len())
            .map(|i| match i % 2 {
                0 => KvCache::new(),
                _ => KvCache::with_capacity(max_seq),
            })
            .collect();
        for ((x, &n), cache) in xs.iter().zip(&lengths).zip(&mut caches) {
            if n > 0 {
                layer
                    .forward_cached(x.clone().narrow(1, 0, n), cache)
                    .unwrap();
            }
        }
        for step in 0..2 {
            let rows: Vec<Tensor<3>> = xs
                .iter()
                .zip(&lengths)
                .map(|(x, &n)| x.clone().narrow(1, n + step, 1))
                .collect();
            let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
            let got = layer.forward_rows(Tensor::cat(rows, 0), &mut refs).unwrap();
            for (r, (x, &n)) in xs.iter().zip(&lengths).enumerate() {
                let whole = layer.forward(x.clone(), None, Pass::Infer).unwrap();
                assert_close(
                    &values(got.clone().narrow(0, r, 1)),
                    &values(whole.narrow(1, n + step, 1)),
                    1e-5,
                    &format!("row {r} (of {} tokens), step {step}", n + step + 1),
                );
                assert_eq!(caches[r].len(), n + step + 1, "row {r}'s cache grew by one");
            }
        }
    }
    let layer = &layers[1];
    let mut one = KvCache::new();
    let two = random([1, 2, d], device);
    assert_eq!(
        layer
            .forward_rows(two.clone(), &mut [&mut one])
            .unwrap_err(),
        AttentionError::RowTokens { got: 2, step: 1 }
    );
    assert_eq!(
        layer
            .forward_rows(random([2, 1, d], device), &mut [&mut one])
            .unwrap_err(),
        AttentionError::RowCaches { rows: 2, caches: 1 }
    );
    assert_eq!(
        layer
            .forward_rows(random([0, 1, d], device), &mut [])
            .unwrap_err(),
        AttentionError::EmptySequence
    );
    let mut full = KvCache::new();
    layer
        .forward_cached(random([1, max_seq, d], device), &mut full)
        .unwrap();
    assert!(matches!(
        layer.forward_rows(random([1, 1, d], device), &mut [&mut full]),
        Err(AttentionError::SequenceTooLong { len: 13, max: 12 })
    ));
}

/// The decode step ([`CausalSelfAttention::forward_step`], positions on the device): rows of
/// sequences 3, 7 and 12 tokens long fed token by token through one fixed cache holding all
/// rows; a row that has ended feeds its last token again at its last position (rewriting its
/// own cache row with the same key), so the rows sit at different positions. Every row's output
/// at every step is what one whole pass gives at that position, with rotary positions, QK-norm
/// and grouped heads too; and a step after a prompt fed the usual way continues it.
pub(super) fn steps_decode_as_each_alone(device: &Device) {
    let (d, max_seq) = (16, 12);
    let layers = two_layers(d, max_seq, device);
    let lengths = [3, 7, 12];
    for layer in &layers {
        let tables = StepTables::new(max_seq, d / 4, layer.rope_base, layer.kernels(), device);
        let xs: Vec<Tensor<3>> = lengths.iter().map(|&n| random([1, n, d], device)).collect();
        let wholes: Vec<Tensor<3>> = xs
            .iter()
            .map(|x| layer.forward(x.clone(), None, Pass::Infer).unwrap())
            .collect();
        let mut cache = KvCache::with_capacity(max_seq);
        for step in 0..max_seq {
            let positions: Vec<usize> = lengths.iter().map(|&n| step.min(n - 1)).collect();
            let rows: Vec<Tensor<3>> = xs
                .iter()
                .zip(&positions)
                .map(|(x, &p)| x.clone().narrow(1, p, 1))
                .collect();
            let at = StepAt::new(&tables, &positions).unwrap();
            let got = layer
                .forward_step(Tensor::cat(rows, 0), &at, &mut cache)
                .unwrap();
            for (r, &p) in positions.iter().enumerate() {
                assert_close(
                    &values(got.clone().narrow(0, r, 1)),
                    &values(wholes[r].clone().narrow(1, p, 1)),
                    1e-5,
                    &format!("row {r} at position {p}"),
                );
            }
        }
        // One sequence: its prompt through forward_cached, the next token through the step.
        let mut one = KvCache::with_capacity(max_seq);
        layer
            .forward_cached(xs[1].clone().narrow(1, 0, 5), &mut one)
            .unwrap();
        let at = StepAt::new(&tables, &[5]).unwrap();
        let got = layer
            .forward_step(xs[1].clone().narrow(1, 5, 1), &at, &mut one)
            .unwrap();
        assert_close(
            &values(got),
            &values(wholes[1].clone().narrow(1, 5, 1)),
            1e-5,
            "a step after a prompt",
        );
        assert_eq!(one.len(), 6);
    }
    let layer = &layers[1];
    let tables = StepTables::new(max_seq, d / 4, layer.rope_base, layer.kernels(), device);
    assert_eq!(
        StepAt::new(&tables, &[max_seq]).unwrap_err(),
        AttentionError::SequenceTooLong { len: 13, max: 12 }
    );
    let at = StepAt::new(&tables, &[0]).unwrap();
    let x = random([1, 1, d], device);
    assert_eq!(
        layer
            .forward_step(x.clone(), &at, &mut KvCache::new())
            .unwrap_err(),
        AttentionError::StepCache {
            capacity: None,
            expected: 12
        }
    );
    let unrotated = StepAt::new(
        &StepTables::new(max_seq, d / 4, None, Kernels::for_device(device), device),
        &[0],
    )
    .unwrap();
    assert_eq!(
        layer
            .forward_step(x, &unrotated, &mut KvCache::with_capacity(max_seq))
            .unwrap_err(),
        AttentionError::StepRope
    );
}

/// Prompts of different lengths fed together through the step, `new` tokens a row at a time:
/// each chunk attends causally within itself and to its row's cache, a short chunk (and a row
/// whose prompt is done, sitting out) repeats its last token at its last position, and every
/// real token's output is the whole sequence's at its position. Then a single token through
/// the one-token step continues each row.
pub(super) fn prompts_go_through_the_step_in_padded_chunks(device: &Device) {
    let (d, max_seq, new) = (16, 12, 4);
    let lengths = [3, 7, 10];
    for layer in &two_layers(d, max_seq, device) {
        let tables = StepTables::new(max_seq, d / 4, layer.rope_base, layer.kernels(), device);
        let xs: Vec<Tensor<3>> = lengths
            .iter()
            .map(|&n| random([1, n + 1, d], device))
            .collect();
        let wholes: Vec<Tensor<3>> = xs
            .iter()
            .map(|x| layer.forward(x.clone(), None, Pass::Infer).unwrap())
            .collect();
        let mut cache = KvCache::with_capacity(max_seq);
        for chunk in 0..lengths.iter().max().unwrap().div_ceil(new) {
            // Row r's positions in this chunk: its next `new`, the last repeated past its end.
            let positions: Vec<usize> = lengths
                .iter()
                .flat_map(|&n| (0..new).map(move |i| (chunk * new + i).min(n - 1)))
                .collect();
            let rows: Vec<Tensor<3>> = positions
                .chunks(new)
                .zip(&xs)
                .map(|(ps, x)| {
                    let picked = ps.iter().map(|&p| x.clone().narrow(1, p, 1)).collect();
                    Tensor::cat(picked, 1)
                })
                .collect();
            let at = StepAt::tokens(&tables, &positions, new).unwrap();
            assert_eq!((at.rows(), at.tokens_per_row()), (3, new));
            let got = layer
                .forward_step(Tensor::cat(rows, 0), &at, &mut cache)
                .unwrap();
            for (r, ps) in positions.chunks(new).enumerate() {
                for (i, &p) in ps.iter().enumerate() {
                    assert_close(
                        &values(got.clone().narrow(0, r, 1).narrow(1, i, 1)),
                        &values(wholes[r].clone().narrow(1, p, 1)),
                        1e-5,
                        &format!("row {r}, chunk {chunk}, token {i} at position {p}"),
                    );
                }
            }
        }
        let at = StepAt::new(&tables, &lengths).unwrap();
        let next: Vec<Tensor<3>> = xs
            .iter()
            .zip(lengths)
            .map(|(x, n)| x.clone().narrow(1, n, 1))
            .collect();
        let got = layer
            .forward_step(Tensor::cat(next, 0), &at, &mut cache)
            .unwrap();
        for (r, &n) in lengths.iter().enumerate() {
            assert_close(
                &values(got.clone().narrow(0, r, 1)),
                &values(wholes[r].clone().narrow(1, n, 1)),
                1e-5,
                &format!("row {r}'s next token after its prompt"),
            );
        }
    }
    let layer = &two_layers(d, max_seq, device)[0];
    let tables = StepTables::new(max_seq, d / 4, layer.rope_base, layer.kernels(), device);
    let at = StepAt::tokens(&tables, &[0, 1, 2, 3], 4).unwrap();
    assert_eq!(
        layer
            .forward_step(
                random([1, 2, d], device),
                &at,
                &mut KvCache::with_capacity(max_seq)
            )
            .unwrap_err(),
        AttentionError::RowTokens { got: 2, step: 4 }
    );
}

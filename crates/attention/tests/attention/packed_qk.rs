//! QK-norm and the rotation in one kernel on the packed heads (`tinygpt_attention::packed_qk`),
//! held to the split heads' explicit path ([`rms_norm_heads`], [`RopeRows::apply`]) on wgpu:
//! output and gradient, under autodiff and called directly, with grouped heads, a `d_head`
//! whose half is not a power of two and an odd one (normalised, never rotated).

use tinygpt_attention::packed_qk::{QkPrep, normalise_and_rotate, normalise_and_rotate_parts};
use tinygpt_attention::qk_norm::rms_norm_heads;
use tinygpt_attention::rope::RopeRows;

use super::*;

/// One case: `heads` query and `kv` key/value heads of `d_head` channels, `seq` positions.
#[derive(Debug, Clone, Copy)]
struct Case {
    batch: usize,
    seq: usize,
    heads: usize,
    kv: usize,
    d_head: usize,
    normalise: bool,
    rotate: bool,
}

impl Case {
    fn groups(&self) -> usize {
        self.heads + 2 * self.kv
    }

    fn shape(&self) -> [usize; 3] {
        [self.batch, self.seq, self.groups() * self.d_head]
    }

    fn rope(&self, device: &Device) -> Option<RopeRows> {
        self.rotate
            .then(|| RopeRows::new(0, self.seq, self.d_head, 10000.0, device))
    }

    fn eps(&self) -> Option<f64> {
        self.normalise.then_some(1e-6)
    }

    /// The explicit path: the queries and keys split off as the layer's other paths take them
    /// (`[batch, n, seq, d_head]`), normalised and rotated, and put back in their columns.
    fn explicit(&self, qkv: Tensor<3>, rope: Option<&RopeRows>) -> Tensor<3> {
        let [batch, seq, width] = qkv.dims();
        let heads = qkv
            .reshape([batch, seq, self.groups(), self.d_head])
            .swap_dims(1, 2);
        let part = |from: usize, n: usize| heads.clone().narrow(1, from, n);
        let prepare = |mut x: Tensor<4>| {
            if let Some(eps) = self.eps() {
                x = rms_norm_heads(x, eps);
            }
            if let Some(rope) = rope {
                x = rope.apply(x);
            }
            x
        };
        let (q, k) = (
            prepare(part(0, self.heads)),
            prepare(part(self.heads, self.kv)),
        );
        let v = part(self.heads + self.kv, self.kv);
        Tensor::cat(vec![q, k, v], 1)
            .swap_dims(1, 2)
            .reshape([batch, seq, width])
    }

    /// Which packed columns of a row are values'.
    fn is_value(&self, index: usize) -> bool {
        (index / self.d_head) % self.groups() >= self.heads + self.kv
    }
}

/// The packed heads with some value channels so large that their squares overflow: the kernel
/// must pass them (and their gradients) through bit for bit.
fn packed_input(case: &Case, device: &Device) -> Tensor<3> {
    let mut data = values(random(case.shape(), device));
    for (i, x) in data.iter_mut().enumerate() {
        if case.is_value(i % (case.groups() * case.d_head)) && i % 5 == 0 {
            *x = 3e20;
        }
    }
    Tensor::from_data(TensorData::new(data, case.shape()), device)
}

/// The kernel's output and `qkv`'s gradient for the upstream gradient `g`, against the
/// explicit path's under autodiff; and the kernels called directly give the same numbers.
fn check(case: Case, device: &Device) {
    let what = format!("{case:?}");
    let ad = device.clone().autodiff();
    let (qkv, g) = (packed_input(&case, &ad), random(case.shape(), &ad));
    let rope = case.rope(&ad);
    let prep = QkPrep {
        qk_norm_eps: case.eps(),
        rope: rope.as_ref(),
    };
    let run = |kernel: bool| {
        let x = qkv.clone().require_grad();
        let y = match kernel {
            true => normalise_and_rotate(x.clone(), case.heads, case.kv, prep),
            false => case.explicit(x.clone(), rope.as_ref()),
        };
        let grads = (y.clone() * g.clone()).sum().backward();
        (values(y), values(x.grad(&grads).unwrap()))
    };
    let (kernel, explicit) = (run(true), run(false));
    let queries_and_keys = |v: &[f32]| -> Vec<f32> {
        let values_dropped = v
            .iter()
            .enumerate()
            .filter(|(i, _)| !case.is_value(i % (case.groups() * case.d_head)));
        values_dropped.map(|(_, x)| *x).collect()
    };
    let only_values = |v: &[f32]| -> Vec<u32> {
        let kept = v
            .iter()
            .enumerate()
            .filter(|(i, _)| case.is_value(i % (case.groups() * case.d_head)));
        kept.map(|(_, x)| x.to_bits()).collect()
    };
    for (name, got, want) in [
        ("output", &kernel.0, &explicit.0),
        ("gradient", &kernel.1, &explicit.1),
    ] {
        let (got_qk, want_qk) = (queries_and_keys(got), queries_and_keys(want));
        assert_close(&got_qk, &want_qk, 2e-6, &format!("{what} {name}"));
        assert_eq!(only_values(got), only_values(want), "{what} {name}: values");
    }
    assert!(values(qkv.clone()).contains(&3e20), "no overflowing value");

    // Called directly, outside autodiff: the same forward and backward.
    let plain = |t: &Tensor<3>| Tensor::<3>::from_data(t.to_data(), device);
    let rope = case.rope(device);
    let prep = QkPrep {
        qk_norm_eps: case.eps(),
        rope: rope.as_ref(),
    };
    let (y, d_qkv) = normalise_and_rotate_parts(plain(&qkv), case.heads, case.kv, prep, plain(&g));
    assert_eq!(values(y), kernel.0, "{what}: direct output");
    assert_eq!(values(d_qkv), kernel.1, "{what}: direct gradient");
}

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_packed_kernels_match_the_split_heads_explicit_path() {
    fresh_draws();
    let device = wgpu_device_of_two();
    let base = Case {
        batch: 2,
        seq: 7,
        heads: 4,
        kv: 2,
        d_head: 8,
        normalise: true,
        rotate: true,
    };
    for (normalise, rotate) in [(true, true), (true, false), (false, true)] {
        check(
            Case {
                normalise,
                rotate,
                ..base
            },
            &device,
        );
    }
    // Multi-head, a half of 6 (8 lanes, two of them idle) and several vectors a cube.
    check(
        Case {
            batch: 1,
            seq: 5,
            heads: 3,
            kv: 3,
            d_head: 12,
            ..base
        },
        &device,
    );
    // An odd head, normalised only (rotary positions need an even one): its last unit has one
    // channel.
    check(
        Case {
            d_head: 5,
            rotate: false,
            ..base
        },
        &device,
    );
    // A wide head: one vector a cube (64 lanes) and more positions than one cube's rows.
    check(
        Case {
            batch: 1,
            seq: 33,
            heads: 2,
            kv: 1,
            d_head: 128,
            ..base
        },
        &device,
    );
}

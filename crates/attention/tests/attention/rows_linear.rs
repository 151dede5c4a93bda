//! Decoding's products by the rows kernel ([`tinygpt_attention::rows_linear`]) equal Burn's
//! matmul, on wgpu (lavapipe in CI): one row and the most it takes, with and without a bias, a weight read
//! through a transposed view (the tied LM head), widths that are no multiple of the cube's 32
//! columns or of its 8 slices.

use burn::tensor::Tensor;
use tinygpt_attention::rows_linear::{self, MAX_ROWS};

use super::draws::{fresh_draws, random};
use super::support_wgpu::wgpu_device_of_two;
use super::{rel_err, values};

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_rows_kernel_gives_burns_products() {
    let device = wgpu_device_of_two();
    fresh_draws();
    for (k, n) in [(37, 70), (384, 65)] {
        for rows in [1, MAX_ROWS] {
            let x = random([1, rows, k], &device);
            assert!(rows_linear::applies(&x), "{rows} rows on wgpu");
            let weight = random([k, n], &device);
            let bias = random([n], &device);
            let want = x.clone().matmul(weight.clone().unsqueeze()) + bias.clone().unsqueeze();
            let got = rows_linear::product(x.clone(), weight.clone(), Some(bias));
            assert_eq!(got.dims(), [1, rows, n]);
            let err = rel_err(&values(got), &values(want));
            assert!(err < 1e-5, "K {k}, N {n}, {rows} rows, bias: {err}");

            // The weight as the transpose of an `[N, K]` matrix, without a bias.
            let stored = random([n, k], &device);
            let want = x.clone().matmul(stored.clone().transpose().unsqueeze());
            let got = rows_linear::product(x, stored.transpose(), None);
            let err = rel_err(&values(got), &values(want));
            assert!(err < 1e-5, "K {k}, N {n}, {rows} rows, transposed: {err}");
        }
    }
    let many = Tensor::<2>::zeros([MAX_ROWS + 1, 8], &device);
    assert!(
        !rows_linear::applies(&many),
        "more rows than the kernel keeps"
    );
}

//! Decoding's products by the rows kernel ([`tinygpt_attention::rows_linear`]) equal Burn's
//! matmul, on wgpu (lavapipe in CI): one row and the most it takes, with and without a bias, a weight read
//! through a transposed view (the tied LM head), widths that are no multiple of the cube's 32
//! columns or of its 8 slices.

use burn::tensor::{Distribution, Tensor};
use tinygpt_attention::rows_linear::{self, MAX_ROWS};

use super::{rel_err, seeded, values, wgpu_device};

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_rows_kernel_gives_burns_products() {
    let device = wgpu_device();
    let _seeded = seeded(&device);
    let normal = Distribution::Normal(0.0, 1.0);
    for (k, n) in [(37, 70), (384, 65)] {
        for rows in [1, MAX_ROWS] {
            let x = Tensor::<3>::random([1, rows, k], normal, &device);
            assert!(rows_linear::applies(&x), "{rows} rows on wgpu");
            let weight = Tensor::<2>::random([k, n], normal, &device);
            let bias = Tensor::<1>::random([n], normal, &device);
            let want = x.clone().matmul(weight.clone().unsqueeze()) + bias.clone().unsqueeze();
            let got = rows_linear::product(x.clone(), weight.clone(), Some(bias));
            assert_eq!(got.dims(), [1, rows, n]);
            let err = rel_err(&values(got), &values(want));
            assert!(err < 1e-5, "K {k}, N {n}, {rows} rows, bias: {err}");

            // The weight as the transpose of an `[N, K]` matrix, without a bias.
            let stored = Tensor::<2>::random([n, k], normal, &device);
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

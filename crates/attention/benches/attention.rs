//! `cargo bench -p tinygpt-attention`: forward + backward of the explicit and SDPA attention
//! paths, and inference forward, at nanoGPT's baby (12×64, d 128, 4 heads) and
//! shakespeare-char (64×256, d 384, 6 heads) shapes, on the flex and ndarray CPU backends.

use std::time::Duration;

use burn::tensor::{Device, Distribution, Tensor};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tinygpt_attention::{AttentionKernel, CausalSelfAttentionConfig, Pass};

struct Shape {
    name: &'static str,
    batch: usize,
    seq: usize,
    d_model: usize,
    heads: usize,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "b12_t64_d128_h4",
        batch: 12,
        seq: 64,
        d_model: 128,
        heads: 4,
    },
    Shape {
        name: "b64_t256_d384_h6",
        batch: 64,
        seq: 256,
        d_model: 384,
        heads: 6,
    },
];

#[allow(deprecated)] // burn-ndarray is deprecated upstream; still one of tinygpt's backends.
fn backends() -> [(&'static str, Device); 2] {
    [("flex", Device::flex()), ("ndarray", Device::ndarray())]
}

fn bench(c: &mut Criterion) {
    for shape in &SHAPES {
        let mut group = c.benchmark_group(format!("attention/{}", shape.name));
        if shape.batch * shape.seq > 4096 {
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(20));
        }
        for (backend, device) in backends() {
            for kernel in [AttentionKernel::Explicit, AttentionKernel::Sdpa] {
                let config = CausalSelfAttentionConfig::new(shape.d_model, shape.heads, shape.seq)
                    .with_kernel(kernel);
                let id = format!("{backend}/{kernel:?}");

                let ad = device.clone().autodiff();
                let layer = config.init(&ad).unwrap();
                let x = Tensor::<3>::random(
                    [shape.batch, shape.seq, shape.d_model],
                    Distribution::Default,
                    &ad,
                );
                group.bench_function(BenchmarkId::new("forward+backward", &id), |b| {
                    b.iter(|| {
                        let y = layer
                            .forward(x.clone().require_grad(), None, Pass::Train)
                            .unwrap();
                        let grads = y.sum().backward();
                        // Read one gradient back so the backend finishes the work.
                        layer.c_attn.weight.grad(&grads).unwrap().into_data()
                    })
                });

                let layer = config.init(&device).unwrap();
                let x = x.clone().to_device(&device);
                group.bench_function(BenchmarkId::new("inference", &id), |b| {
                    b.iter(|| {
                        layer
                            .forward(x.clone(), None, Pass::Infer)
                            .unwrap()
                            .into_data()
                    })
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! `cargo bench -p tinygpt-model`: one training step's forward + backward of nanoGPT's baby
//! model (batch 12, block 64), and KV-cached sampling, on the flex and ndarray CPU backends;
//! and batched decoding (a server's streams), 1 to 32 at once, on the fused decoder and on
//! Burn's (flex); and the fused decoder's
//! reading of a whole-block prompt at shakespeare-char's size (one forward pass) and at GPT-2's
//! (1,024 tokens, in chunks of `PREFILL_CHUNK`).

use burn::tensor::{Device, Distribution, Int, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tinygpt_model::{
    BatchDecoder, Decoder, FusedBatch, FusedDecoder, GenerateOptions, GptBatch, GptConfig, Pass,
    cross_entropy,
};

#[allow(deprecated)] // burn-ndarray is deprecated upstream; still one of tinygpt's backends.
fn backends() -> [(&'static str, Device); 2] {
    [("flex", Device::flex()), ("ndarray", Device::ndarray())]
}

fn bench(c: &mut Criterion) {
    let (batch, vocab) = (12, 65);
    let config = GptConfig::baby(vocab);
    let block = config.block_size;
    let mut group = c.benchmark_group("gpt/baby");
    for (backend, device) in backends() {
        let ad = device.clone().autodiff();
        let model = config.init(&ad).unwrap();
        let tokens: Tensor<2, Int> = Tensor::<2>::random(
            [batch, block + 1],
            Distribution::Uniform(0.0, vocab as f64),
            &ad,
        )
        .int()
        .clamp(0, vocab as i64 - 1);
        let inputs = tokens.clone().slice([0..batch, 0..block]);
        let targets = tokens
            .slice([0..batch, 1..block + 1])
            .reshape([batch * block]);
        group.throughput(Throughput::Elements((batch * block) as u64));
        group.bench_function(BenchmarkId::new("forward+backward", backend), |b| {
            b.iter(|| {
                let logits = model.forward(inputs.clone(), Pass::Train).unwrap();
                let loss = cross_entropy(logits.reshape([batch * block, vocab]), targets.clone());
                let grads = loss.unwrap().backward();
                model.wte.weight.grad(&grads).unwrap().into_data()
            })
        });

        let model = config.init(&device).unwrap();
        let options = GenerateOptions {
            max_new_tokens: block - 1,
            ..Default::default()
        };
        group.throughput(Throughput::Elements(options.max_new_tokens as u64));
        group.bench_function(BenchmarkId::new("sample-kv-cache", backend), |b| {
            b.iter(|| model.generate(&[0], &options, |_| {}).unwrap())
        });
    }
    group.finish();
}

/// Tokens per second of `streams` streams decoded together, one token each a step, over the
/// first half of the block (each step attends to the stream's cache so far), on the fused
/// decoder and on Burn's tensor ops (flex).
fn batched_decoding(c: &mut Criterion) {
    let config = GptConfig::baby(65);
    let model = config.init(&Device::flex()).unwrap();
    for engine in ["fused", "flex"] {
        let mut group = c.benchmark_group(format!("gpt/baby/{engine}-batch-decode"));
        for streams in [1, 8, 32] {
            let mut batch: Box<dyn BatchDecoder> = match engine {
                "fused" => Box::new(FusedBatch::new(&model, streams).unwrap()),
                _ => Box::new(GptBatch::new(&model, streams)),
            };
            group.throughput(Throughput::Elements(
                (streams * config.block_size / 2) as u64,
            ));
            group.bench_function(BenchmarkId::from_parameter(streams), |b| {
                b.iter(|| decode_half_a_block(&mut *batch))
            });
        }
        group.finish();
    }
}

/// Every stream of `batch` from empty to half its block, a token a step.
fn decode_half_a_block(batch: &mut dyn BatchDecoder) {
    let streams = batch.streams();
    let tokens: Vec<[u32; 1]> = (0..streams).map(|s| [(s % 65) as u32]).collect();
    (0..streams).for_each(|s| batch.clear(s));
    for _ in 0..batch.block_size() / 2 {
        let feeds: Vec<(usize, &[u32])> = tokens
            .iter()
            .enumerate()
            .map(|(s, t)| (s, &t[..]))
            .collect();
        batch.step(&feeds).unwrap();
    }
}

/// Tokens per second of a prompt of a whole block read by the fused decoder: 256 tokens at
/// shakespeare-char's size (10.7M parameters, one forward pass), and 1,024 at GPT-2's shape
/// (12 layers, 768 wide; a 65-token vocabulary), in chunks of `PREFILL_CHUNK`.
fn prefill(c: &mut Criterion) {
    let gpt2 = GptConfig::new(65)
        .with_n_layer(12)
        .with_n_head(12)
        .with_n_embd(768)
        .with_block_size(1024);
    let sizes = [
        ("shakespeare-char", GptConfig::shakespeare_char(65), 20),
        ("gpt2-size", gpt2, 10),
    ];
    for (name, config, samples) in sizes {
        let model = config.init(&Device::flex()).unwrap();
        let mut decoder = FusedDecoder::new(&model).unwrap();
        let prompt: Vec<u32> = (0..config.block_size as u32).map(|i| i * 7 % 65).collect();
        let mut group = c.benchmark_group(format!("gpt/{name}/fused-prefill"));
        group.sample_size(samples);
        group.throughput(Throughput::Elements(prompt.len() as u64));
        group.bench_function(BenchmarkId::from_parameter(prompt.len()), |b| {
            b.iter(|| {
                decoder.clear();
                decoder.feed(&prompt).unwrap()
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench, batched_decoding, prefill);
criterion_main!(benches);

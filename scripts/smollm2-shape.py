"""A SmolLM2-135M-shaped LlamaForCausalLM with random weights (30 layers, width 576, 9 query and 3
key/value heads, SwiGLU 1536, θ 100000, tied, bf16), for measuring import, sampling and
fine-tuning at that size without downloading the real checkpoint; its tokenizer is a BPE of 8,192
tokens trained on CORPUS (the real model's 49,152 rows are kept as padding).

    python scripts/smollm2-shape.py OUT_DIR CORPUS [360M|1.7B]   # needs torch, transformers, tokenizers

With `360M`, SmolLM2-360M's shape instead: 32 layers, width 960, 15 query and 5 key/value heads,
SwiGLU 2560, θ 100000, tied (361.8M parameters). With `1.7B`, SmolLM2-1.7B's: 24 layers, width
2048, 32 query and 32 key/value heads, SwiGLU 8192, θ 130000, tied (1.71B parameters).
"""
import json, os, sys, time, torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
out = sys.argv[1]
corpus = open(sys.argv[2], encoding="utf-8").read()
os.makedirs(out, exist_ok=True)
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
bpe.train_from_iterator([corpus], trainers.BpeTrainer(vocab_size=8192, special_tokens=special,
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>").save_pretrained(out)
torch.manual_seed(0)
sizes = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, initializer_range=0.041666666666666664)
if len(sys.argv) > 3 and sys.argv[3] == "360M":
    sizes = dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                 num_key_value_heads=5, initializer_range=0.02)
theta = 100000.0
if len(sys.argv) > 3 and sys.argv[3] == "1.7B":
    sizes = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, initializer_range=0.02)
    theta = 130000.0
config = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                     rope_theta=theta, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                     **sizes)
model = LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
print(sum(p.numel() for p in model.parameters()))

"""PyTorch's side of the fine-tuning memory table (docs/interop.md): peak RSS and seconds per step
of a Llama-family model fine-tuned in f32 on the CPU, in full (AdamW), with activation
checkpointing, or with a LoRA on every matrix (peft), at batch B x T. One mode a process, so
that each peak is its own.

    python scripts/finetune-memory.py MODEL_DIR MODE [BATCH] [SEQ] [THREADS] [STEPS]
    #  MODEL_DIR: a Hugging Face Llama-family directory (scripts/smollm2-shape.py makes one)
    #  MODE: full | checkpointed | lora | lora-checkpointed
    #        (needs torch, transformers; lora needs peft)

Prints one line: mode, batch, peak RSS in GiB (ru_maxrss), median seconds per step.
"""
import resource, sys, time, statistics
import torch
from transformers import LlamaForCausalLM

model_dir, mode = sys.argv[1], sys.argv[2]
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 1
seq = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 3
torch.set_num_threads(threads)
torch.manual_seed(0)

model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
model.train()
if mode in ("checkpointed", "lora-checkpointed"):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
if mode in ("lora", "lora-checkpointed"):
    from peft import LoraConfig, get_peft_model
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                             target_modules=targets))
    if mode == "lora-checkpointed":
        # The inputs of a frozen embedding need gradients for checkpointed blocks to get theirs.
        model.enable_input_require_grads()
elif mode not in ("full", "checkpointed"):
    sys.exit(f"unknown mode {mode}: full, checkpointed, lora or lora-checkpointed")
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
ids = torch.randint(0, 8192, (batch, seq))
times = []
for step in range(steps):
    t0 = time.perf_counter()
    # transformers shifts the labels itself: the inputs as labels are the next-token loss.
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"{mode} {batch}x{seq}: peak RSS {peak:.2f} GiB, {statistics.median(times):.2f} s/step "
      f"(torch {torch.__version__}, {threads} threads, {steps} steps)")

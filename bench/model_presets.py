"""kiln's model presets as the training benchmark's two sides build and count them.

bench/bench_train.py (kiln against PyTorch) and bench/torch_gpt.py (the PyTorch peer) take
the same --model names and must agree on each one's shape and FLOPs: both read them here.
The shapes are those of src/model/config.c, every preset with GPT-2's vocabulary of 50257,
since `kiln train --model PRESET` takes the data's vocabulary and the benchmark's data are
GPT-2 tokens (the Brown corpus through `kiln prepare`). FLOPs per token are counted as
kiln_gpt_flops_per_token counts them, by tests/ref/gpt_model.py's flops_per_token for a
GPT-2 and tests/ref/llama_model.py's for a Llama, so that MFU figures agree with kiln's own.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import gpt_model  # noqa: E402
import llama_model  # noqa: E402

VOCAB = 50257

# GPT-2: name: (n_layer, n_head, n_embd, positions)
GPT2 = {
    "gpt2-124m": (12, 12, 768, 1024),
    "gpt2-350m": (24, 16, 1024, 1024),
    "d12": (12, 12, 384, 512),
    "d6": (6, 6, 192, 256),
    "d4": (4, 4, 128, 256),
}

# Llama: name: (n_layer, n_head, n_embd, context, n_kv_head, mlp_hidden, rope_theta, tied
# head); norm eps 1e-5 (kiln's default) for all. llama-dN is dN's shape with half as many
# key/value heads and a SwiGLU MLP of GPT-2's 4C MLP's parameters; smollm2-135m is
# SmolLM2-135M's shape (its own vocabulary of 49152 gives way to the data's here).
LLAMA = {
    "llama-d4": (4, 4, 128, 256, 2, 352, 10000.0, True),
    "llama-d6": (6, 6, 192, 256, 3, 512, 10000.0, True),
    "llama-d12": (12, 12, 384, 512, 6, 1024, 10000.0, True),
    "smollm2-135m": (30, 9, 576, 8192, 3, 1536, 100000.0, True),
}

NAMES = sorted(list(GPT2) + list(LLAMA))


def family(name):
    """"gpt2" or "llama"."""
    return "llama" if name in LLAMA else "gpt2"


def context(name):
    """The longest sequence the preset takes (kiln refuses a longer --seq)."""
    return LLAMA[name][3] if name in LLAMA else GPT2[name][3]


def flops_per_token(name, T):
    """Model FLOPs of one training step per token at sequence length T, as kiln counts them."""
    if name in LLAMA:
        L, NH, C, _, NKV, H, _, _ = LLAMA[name]
        return llama_model.flops_per_token(L, C, NH, VOCAB, T, n_kv_head=NKV, mlp_hidden=H)
    L, _, C, _ = GPT2[name]
    return gpt_model.flops_per_token(L, C, VOCAB, T)


def describe(name):
    """The family and shape in words, e.g. "L=6 NH=6 C=192 V=50257" for a GPT-2 and "Llama:
    L=6 NH=6 NKV=3 C=192 H=512 theta 10000, tied head, V=50257" for a Llama."""
    if name in LLAMA:
        L, NH, C, _, NKV, H, theta, tied = LLAMA[name]
        return "Llama: L=%d NH=%d NKV=%d C=%d H=%d theta %g, %s head, V=%d" % (
            L, NH, NKV, C, H, theta, "tied" if tied else "untied", VOCAB)
    L, NH, C, _ = GPT2[name]
    return "L=%d NH=%d C=%d V=%d" % (L, NH, C, VOCAB)

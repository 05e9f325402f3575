#!/usr/bin/python3
"""Reference values for kiln's bf16 training: PyTorch's CPU bf16 autocast, and float64.

    /usr/bin/python3 tests/ref/gpt_ref_bf16.py --out DIR

One small GPT-2 (tests/ref/gpt_model.py) with fixed initial float32 weights is trained for
STEPS AdamW steps on the same batches three ways:

    fp64      the float64 model from the same float32 weights: the exact answer
    fp32      float32 PyTorch, recorded (scalars torch32_*) as the noise floor of float32
    autocast  float32 master weights and optimizer, the forward under
              torch.autocast("cpu", dtype=torch.bfloat16), backward outside it: PyTorch's
              usual bf16 mixed precision

For fp64 and autocast it writes, for tests/ref/test_ref_bf16.c to compare kiln with:
the loss of each step ("<run>.losses", loss k measured before update k), every
parameter's gradient at step 0 ("<run>.grad.<HF name>", the initial weights and batch 0)
and every parameter after the last step ("<run>.param.<HF name>"). The files are those of
tests/ref/gpt_ref.py: config.json, model.safetensors (the initial float32 weights),
inputs.i32 and targets.i32 ((steps, B, T) int32), expected.f64 and manifest.txt.

The model is GPT-2's initialisation with the matrices 5 times larger (std 0.1, so that the
logits are O(1) rather than near zero) and every bias and LayerNorm parameter perturbed by
N(0, 0.1) (so that a forward pass that ignored one would be caught). The batches follow a
fixed random permutation of the vocabulary (each next token is the permutation's image of
the current one with probability 0.8), so that the gradients carry a signal, not only noise.

Under CPU autocast in PyTorch 1.13 the products (addmm, matmul) take bf16 inputs and give
bf16 outputs; softmax, GELU and the attention's scaling then run on bf16 tensors and give
bf16; LayerNorm of the float32 residual stream, the residual adds, the embeddings and the
cross-entropy stay float32. kiln's bf16 model instead rounds every activation, and its
working weights, to bf16. The script checks that autocast did produce bf16 logits.
"""

import argparse
import json
import os
import sys

try:
    import torch
except ImportError:
    sys.stderr.write(
        "gpt_ref_bf16.py: PyTorch is not importable by %s; the reference tests need it "
        "(Debian: apt-get install python3-torch); skipped\n" % sys.executable)
    # An earlier run's expected values must not stand in for this one's: the C driver
    # skips when there is no manifest.
    if "--out" in sys.argv[:-1]:
        stale = os.path.join(sys.argv[sys.argv.index("--out") + 1], "manifest.txt")
        if os.path.exists(stale):
            os.remove(stale)
    sys.exit(77)  # CTest's SKIP_RETURN_CODE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import GPT  # noqa: E402
from gpt_ref import config_json, rel, write_safetensors  # noqa: E402
from llama_model import Llama  # noqa: E402

# The GPT-2 case, and Llamas (tests/ref/llama_model.py): multi-query (one key/value head) with
# a tied head, and a key/value head a query head of 10 channels with an untied head.
CASES = {
    "gpt2": dict(n_layer=2, n_head=4, n_embd=64, vocab_size=300, max_seq_len=32, B=4, T=32),
    "llama_mqa": dict(family="llama", n_layer=2, n_head=4, n_kv_head=1, n_embd=64,
                      mlp_hidden=160, vocab_size=300, max_seq_len=32, B=4, T=32, norm_eps=1e-5,
                      rope_theta=10000.0, untied_head=False),
    "llama_mha": dict(family="llama", n_layer=2, n_head=6, n_kv_head=6, n_embd=60,
                      mlp_hidden=150, vocab_size=300, max_seq_len=32, B=4, T=32, norm_eps=1e-6,
                      rope_theta=500000.0, untied_head=True),
}
CFG = CASES["gpt2"]  # the case being generated (main sets it)
OPTIM = dict(steps=5, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
MATRIX_SCALE = 5.0
PERTURB = 0.1
SEED = 2024


def new_model():
    if CFG.get("family") == "llama":
        return Llama(CFG["n_layer"], CFG["n_head"], CFG["n_embd"], CFG["vocab_size"],
                     CFG["n_kv_head"], None, CFG["mlp_hidden"], CFG["norm_eps"],
                     CFG["rope_theta"], CFG["untied_head"])
    return GPT(CFG["n_layer"], CFG["n_head"], CFG["n_embd"], CFG["vocab_size"],
               CFG["max_seq_len"])


def make_model(gen):
    model = new_model()
    if CFG.get("family") == "llama":
        model.init_llama(gen)
    else:
        model.init_gpt2(gen)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(MATRIX_SCALE)
            else:
                p.add_(torch.randn(p.shape, generator=gen) * PERTURB)
    return model


def make_batches(steps, gen):
    """Token streams of T+1 ids (inputs: the first T, targets: the last T) along a fixed
    permutation of the vocabulary, with a random id instead at 20% of the positions."""
    B, T, V = CFG["B"], CFG["T"], CFG["vocab_size"]
    perm = torch.randperm(V, generator=gen)
    seq = torch.empty(steps, B, T + 1, dtype=torch.long)
    seq[:, :, 0] = torch.randint(0, V, (steps, B), generator=gen)
    for t in range(T):
        keep = torch.rand((steps, B), generator=gen) < 0.8
        seq[:, :, t + 1] = torch.where(keep, perm[seq[:, :, t]],
                                       torch.randint(0, V, (steps, B), generator=gen))
    return seq[:, :, :T].contiguous(), seq[:, :, 1:].contiguous()


def train(model, inputs, targets, autocast):
    """OPTIM["steps"] AdamW steps (decay on 2-D tensors only). Returns the losses, the
    gradients of step 0 and the parameters after the last step, in float64."""
    o = OPTIM
    opt = torch.optim.AdamW(model.decay_groups(o["weight_decay"]), lr=o["lr"],
                            betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    losses, grads0 = [], None
    for k in range(o["steps"]):
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, loss = model(inputs[k], targets[k])
        if autocast and logits.dtype != torch.bfloat16:
            sys.exit("gpt_ref_bf16.py: autocast gave %s logits, not bfloat16" % logits.dtype)
        loss.backward()
        losses.append(loss.item())
        if k == 0:
            grads0 = {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}
        opt.step()
    params = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    return losses, grads0, params


def copy_of(model, dtype):
    m = new_model()
    m.load_state_dict(model.state_dict())
    return m.to(dtype)


def bf16_product_units():
    """How far PyTorch's bf16 product of bf16 operands, (64,1024) x (1024,64), lies from the
    exact product of the same operands, in units of u = 2^-8 (relative, by norm). Summed in
    fp32 and rounded once it is about 0.4 u; a product that rounds its partial sums to bf16
    as it goes (PyTorch 1.13's own kernel, where oneDNN has no bf16 matmul for the CPU: one
    without AVX-512) is about 9 u, and grows as sqrt(K)."""
    gen = torch.Generator().manual_seed(SEED + 1)
    a = torch.randn(64, 1024, generator=gen).bfloat16()
    b = torch.randn(1024, 64, generator=gen).bfloat16()
    exact = a.double() @ b.double()
    return float(rel((a @ b).double(), exact)) / 2.0 ** -8


def generate(out):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model32 = make_model(gen)
    inputs, targets = make_batches(OPTIM["steps"], gen)
    os.makedirs(out, exist_ok=True)

    write_safetensors(os.path.join(out, "model.safetensors"), model32.state_dict().items())
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_json(CFG), f, indent=1)
    inputs.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(out, "inputs.i32"))
    targets.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(out, "targets.i32"))

    runs = {"fp64": train(copy_of(model32, torch.float64), inputs, targets, False),
            "fp32": train(copy_of(model32, torch.float32), inputs, targets, False),
            "autocast": train(copy_of(model32, torch.float32), inputs, targets, True)}
    l64, g64, p64 = runs["fp64"]

    def worst(run):
        losses, grads, params = runs[run]
        return (max(abs(a - b) / abs(b) for a, b in zip(losses, l64)),
                max(rel(grads[n], g64[n]) for n in g64),
                max(rel(params[n], p64[n]) for n in p64))

    lines = ["scalar case bf16", "scalar family %s" % CFG.get("family", "gpt2")]
    lines += ["scalar %s %d" % (k, CFG[k]) for k in ("B", "T")]
    lines += ["scalar %s %r" % (k, v) for k, v in OPTIM.items()]
    product_u = bf16_product_units()
    lines += ["scalar torch_bf16_product_u %.3f" % product_u]
    for run in ("fp32", "autocast"):
        w = worst(run)
        lines += ["scalar torch_%s_loss_worst_rel %.3e" % (run, w[0]),
                  "scalar torch_%s_grad_worst_rel %.3e" % (run, w[1]),
                  "scalar torch_%s_param_worst_rel %.3e" % (run, w[2])]
    tensors = []
    for run in ("fp64", "autocast"):
        losses, grads, params = runs[run]
        tensors.append((run + ".losses", torch.tensor(losses, dtype=torch.float64)))
        tensors += [("%s.grad.%s" % (run, n), g) for n, g in grads.items()]
        tensors += [("%s.param.%s" % (run, n), p) for n, p in params.items()]
    offset = 0
    with open(os.path.join(out, "expected.f64"), "wb") as f:
        for name, t in tensors:
            arr = t.contiguous().numpy().astype("<f8")
            f.write(arr.tobytes())
            lines.append("tensor %s %d %d" % (name, offset, arr.size))
            offset += arr.size
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("bf16 case: L=%d NH=%d C=%d V=%d maxT=%d B=%d T=%d, %d AdamW steps -> %s" % (
        CFG["n_layer"], CFG["n_head"], CFG["n_embd"], CFG["vocab_size"], CFG["max_seq_len"],
        CFG["B"], CFG["T"], OPTIM["steps"], out))
    print("  float64 losses %s" % " ".join("%.4f" % v for v in l64))
    print("  PyTorch's bf16 product (K=1024) vs exact: %.2f u" % product_u)
    for run in ("fp32", "autocast"):
        print("  %-8s vs float64, worst relative: losses %.2e, step-0 gradients %.2e, "
              "parameters after %.2e" % ((run,) + worst(run)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--out", required=True, help="folder to write the case's files into")
    ap.add_argument("--case", choices=sorted(CASES), default="gpt2")
    args = ap.parse_args()
    global CFG
    CFG = CASES[args.case]
    torch.set_num_threads(2)
    generate(args.out)


if __name__ == "__main__":
    main()

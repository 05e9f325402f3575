#!/usr/bin/python3
"""Reference values for kiln's GPT-2, computed with PyTorch.

    /usr/bin/python3 tests/ref/gpt_ref.py --case a --out DIR

From a fixed seed this builds a configuration's model, initialises it as GPT-2 does and
then perturbs every bias and LayerNorm parameter (so that a forward pass that ignored one
would be caught), and writes into DIR:

    config.json        n_layer, n_head, n_embd, vocab_size, max_seq_len (head_size,
                       mlp_hidden where the case sets them)
    model.safetensors  the float32 weights, Hugging Face GPT-2 names (written by hand)
    inputs.i32         int32 little-endian, (steps, B, T): batch k feeds optimizer step k;
    targets.i32        batch 0 is also the batch of the forward/backward check
    expected.f64       float64 little-endian values, located by manifest.txt
    manifest.txt       "scalar KEY VALUE" and "tensor NAME OFFSET NUMEL" lines (offsets and
                       sizes in float64 elements of expected.f64)

The expected values are computed in float64 from the float32 weights, so they are the
exact answer up to float64 rounding: logits (B,T,V), the mean loss, the gradient of every
parameter (named "grad.<HF name>"), the losses of `steps` AdamW steps (torch.optim.AdamW,
decay on 2-D tensors only; loss k is measured before update k) and the parameters after
them ("adamw_param.<HF name>"). The same computation in float32 PyTorch is recorded next
to it (scalars torch32_*) as the noise floor that a float32 implementation can reach.
"""

import argparse
import json
import os
import struct
import sys

try:
    import torch
except ImportError:
    sys.stderr.write(
        "gpt_ref.py: PyTorch is not importable by %s; the reference tests need it "
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
from llama_model import Llama  # noqa: E402

# (L, NH, C, V, maxT, B, T). "b" is awkward on purpose: head size 12, a vocabulary that
# is no multiple of 128, and T odd and shorter than maxT.
CASES = {
    "a": dict(n_layer=2, n_head=4, n_embd=64, vocab_size=300, max_seq_len=32, B=4, T=32),
    "b": dict(n_layer=2, n_head=6, n_embd=72, vocab_size=1001, max_seq_len=40, B=3, T=23),
    "c": dict(n_layer=3, n_head=2, n_embd=32, vocab_size=50, max_seq_len=16, B=2, T=1),
    # a structurally pruned shape: 3 heads of 10 (attention 30 wide for C = 48), MLP 88
    "d": dict(n_layer=2, n_head=3, n_embd=48, vocab_size=200, max_seq_len=24, B=2, T=17,
              head_size=10, mlp_hidden=88),
    # Llamas: multi-query (one key/value head) with a tied head; two key/value heads for six
    # query heads of 10 channels, an untied head, V = 1001 and a rotary base of 5e5; as many
    # key/value heads as query heads, heads of 10, T = 9 < maxT
    "la": dict(family="llama", n_layer=2, n_head=4, n_kv_head=1, n_embd=64, mlp_hidden=96,
               vocab_size=300, max_seq_len=32, B=4, T=32, norm_eps=1e-5, rope_theta=10000.0,
               untied_head=False),
    "lb": dict(family="llama", n_layer=2, n_head=6, n_kv_head=2, n_embd=60, mlp_hidden=100,
               vocab_size=1001, max_seq_len=40, B=3, T=23, norm_eps=1e-6, rope_theta=500000.0,
               untied_head=True),
    "lc": dict(family="llama", n_layer=3, n_head=4, n_kv_head=4, n_embd=40, mlp_hidden=72,
               vocab_size=77, max_seq_len=16, B=2, T=9, norm_eps=1e-5, rope_theta=10000.0,
               untied_head=True),
}
OPTIM = dict(steps=10, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def write_safetensors(path, named):
    """Write float32 tensors as safetensors: u64 LE header size, JSON header, raw data."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in named:
        data = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the format allows trailing spaces; keeps data aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def make_model(cfg, gen):
    if cfg.get("family") == "llama":
        model = Llama(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"],
                      cfg["n_kv_head"], cfg.get("head_size"), cfg["mlp_hidden"], cfg["norm_eps"],
                      cfg["rope_theta"], cfg["untied_head"])
        model.init_llama(gen)
    else:
        model = GPT(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"],
                    cfg["max_seq_len"], cfg.get("head_size"), cfg.get("mlp_hidden"))
        model.init_gpt2(gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def config_json(cfg):
    """kiln's config.json for a GPT-2 case; Hugging Face's (model_type "llama") for a Llama,
    so that the reference also checks kiln's reading of it."""
    if cfg.get("family") != "llama":
        return {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len",
                                    "head_size", "mlp_hidden") if k in cfg}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": cfg["n_embd"], "intermediate_size": cfg["mlp_hidden"],
            "num_hidden_layers": cfg["n_layer"], "num_attention_heads": cfg["n_head"],
            "num_key_value_heads": cfg["n_kv_head"], "rms_norm_eps": cfg["norm_eps"],
            "rope_theta": cfg["rope_theta"], "rope_scaling": None,
            "tie_word_embeddings": not cfg["untied_head"], "vocab_size": cfg["vocab_size"],
            "max_position_embeddings": cfg["max_seq_len"], "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32"}


def make_batches(cfg, steps, gen):
    """Token streams of T+1 ids; inputs are the first T, targets the last T. The largest
    id V-1 appears in every batch's inputs and targets."""
    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    seq = torch.randint(0, V, (steps, B, T + 1), generator=gen)
    seq[:, 0, 0] = V - 1
    seq[:, B - 1, T] = V - 1
    return seq[:, :, :T].contiguous(), seq[:, :, 1:].contiguous()


def forward_backward(model, x, y):
    model.zero_grad(set_to_none=False)
    logits, loss = model(x, y)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logits.detach(), loss.item(), grads


def adamw_losses(model, inputs, targets, o):
    opt = torch.optim.AdamW(model.decay_groups(o["weight_decay"]), lr=o["lr"],
                            betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    losses = []
    for k in range(o["steps"]):
        opt.zero_grad(set_to_none=False)
        _, loss = model(inputs[k], targets[k])
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def generate(case, out):
    cfg = CASES[case]
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(1000 + sum(ord(ch) for ch in case))
    model32 = make_model(cfg, gen)
    inputs, targets = make_batches(cfg, OPTIM["steps"], gen)
    os.makedirs(out, exist_ok=True)

    write_safetensors(os.path.join(out, "model.safetensors"), model32.state_dict().items())
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_json(cfg), f, indent=1)
    inputs.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(out, "inputs.i32"))
    targets.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(out, "targets.i32"))

    model64 = make_model(cfg, torch.Generator())  # same structure, weights copied below
    model64.load_state_dict(model32.state_dict())
    model64.double()
    logits64, loss64, grads64 = forward_backward(model64, inputs[0], targets[0])
    logits32, loss32, grads32 = forward_backward(model32, inputs[0], targets[0])

    fresh32 = make_model(cfg, torch.Generator())
    fresh32.load_state_dict(model32.state_dict())
    traj64 = adamw_losses(model64, inputs, targets, OPTIM)  # model64 is consumed here
    traj32 = adamw_losses(fresh32, inputs, targets, OPTIM)
    params32 = dict(fresh32.named_parameters())
    worst_param = max(rel(params32[n], p) for n, p in model64.named_parameters())

    tensors = [("logits", logits64), ("loss", torch.tensor([loss64], dtype=torch.float64)),
               ("adamw_losses", torch.tensor(traj64, dtype=torch.float64))]
    tensors += [("grad." + n, g) for n, g in grads64.items()]
    tensors += [("adamw_param." + n, p) for n, p in model64.named_parameters()]
    worst_grad = max(rel(grads32[n], grads64[n]) for n in grads64)
    worst_traj = max(abs(a - b) / abs(b) for a, b in zip(traj32, traj64))

    lines = ["scalar case %s" % case]
    lines += ["scalar %s %d" % (k, cfg[k]) for k in ("B", "T")]
    lines += ["scalar %s %r" % (k, v) for k, v in OPTIM.items()]
    lines += ["scalar torch32_logits_rel %.3e" % rel(logits32, logits64),
              "scalar torch32_loss_rel %.3e" % (abs(loss32 - loss64) / abs(loss64)),
              "scalar torch32_grad_worst_rel %.3e" % worst_grad,
              "scalar torch32_adamw_worst_rel %.3e" % worst_traj,
              "scalar torch32_adamw_param_worst_rel %.3e" % worst_param]
    offset = 0
    with open(os.path.join(out, "expected.f64"), "wb") as f:
        for name, t in tensors:
            arr = t.detach().double().contiguous().numpy().astype("<f8")
            f.write(arr.tobytes())
            lines.append("tensor %s %d %d" % (name, offset, arr.size))
            offset += arr.size
    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("case %s: L=%d NH=%d C=%d V=%d maxT=%d B=%d T=%d -> %s" % (
        case, cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"],
        cfg["max_seq_len"], cfg["B"], cfg["T"], out))
    print("  float64 loss %.6f; float32 torch vs float64: logits %.2e, grads worst %.2e, "
          "AdamW losses worst %.2e, parameters after AdamW worst %.2e"
          % (loss64, rel(logits32, logits64), worst_grad, worst_traj, worst_param))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--out", required=True, help="folder to write the case's files into")
    args = ap.parse_args()
    torch.set_num_threads(2)
    generate(args.case, args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Expected results for kiln's optimizers, computed with torch.optim.

Usage: optim_ref.py OUT.bin

A few parameter tensors (weight decay on the matrices only, as kiln's ranges mark them)
and random gradients for STEPS steps, with a fixed seed. Each case runs one torch
optimizer over them, with two parameter groups (decay / no decay), and records the
parameters after every step and the optimizer state after the last.

File layout: a text header of lines ending with "end\n", then little-endian float32:
  initial parameters (n), gradients (steps x n), then per case in header order:
  parameters after each step (steps x n), then its state slabs (states x n).
Every tensor is laid out in the order of the "tensor" lines, as one slab.
Hyperparameters and learning rates are float32 values, so that kiln (which holds them
in float) and torch (which holds them in double) compute with the same numbers.
"""
import struct
import sys

import torch

STEPS = 5
SEED = 1234

# name, shape, decay, parameter scale, gradient scale
TENSORS = [
    ("wte", (40, 16), 1, 0.5, 0.05),
    ("ln.weight", (16,), 0, 0.1, 0.5),
    ("fc.weight", (16, 48), 1, 0.2, 1.0),
    ("fc.bias", (48,), 0, 0.1, 0.02),
    ("proj.weight", (48, 16), 1, 0.2, 0.3),
    ("proj.bias", (16,), 0, 0.1, 2.0),
]
LR_FACTORS = [1.0, 0.9, 0.75, 0.5, 0.3]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# name, kind, kiln config fields; values not used by a kind keep kiln's defaults
CASES = [
    ("adamw", "adamw", dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)),
    ("adam_l2", "adam", dict(lr=1e-2, beta1=0.8, beta2=0.999, eps=1e-6, weight_decay=0.05)),
    ("sgd_momentum", "sgd", dict(lr=5e-2, momentum=0.9, dampening=0.0, weight_decay=0.01)),
    ("sgd_nesterov", "sgd", dict(lr=5e-2, momentum=0.9, dampening=0.0, nesterov=1,
                                 weight_decay=0.01)),
    ("sgd_dampening", "sgd", dict(lr=5e-2, momentum=0.8, dampening=0.3, weight_decay=0.0)),
    ("sgd_plain", "sgd", dict(lr=5e-2, momentum=0.0, weight_decay=0.02)),
    ("rmsprop", "rmsprop", dict(lr=1e-3, alpha=0.99, eps=1e-8, weight_decay=0.01,
                                momentum=0.0)),
    ("rmsprop_momentum", "rmsprop", dict(lr=1e-3, alpha=0.9, eps=1e-6, weight_decay=0.0,
                                         momentum=0.5)),
]
DEFAULTS = dict(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, momentum=0.9,
                dampening=0.0, nesterov=0, alpha=0.99)


def make_optimizer(kind, cfg, decay_params, other_params):
    wd = cfg["weight_decay"]
    groups = [dict(params=decay_params, weight_decay=wd),
              dict(params=other_params, weight_decay=0.0)]
    lr = cfg["lr"]
    if kind in ("adamw", "adam"):
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
        return cls(groups, lr=lr, betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg["momentum"],
                               dampening=cfg["dampening"], nesterov=bool(cfg["nesterov"]))
    return torch.optim.RMSprop(groups, lr=lr, alpha=cfg["alpha"], eps=cfg["eps"],
                               momentum=cfg["momentum"])


def state_keys(kind, cfg):
    if kind in ("adamw", "adam"):
        return ["exp_avg", "exp_avg_sq"]
    if kind == "sgd":
        return ["momentum_buffer"] if cfg["momentum"] > 0 else []
    return ["square_avg"] + (["momentum_buffer"] if cfg["momentum"] > 0 else [])


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).to(torch.float32)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: optim_ref.py OUT.bin")
    torch.manual_seed(SEED)
    init = []
    for name, shape, _, pscale, _ in TENSORS:
        t = torch.randn(shape) * pscale
        if name.startswith("ln."):
            t += 1.0
        init.append(t)
    grads = []  # grads[step][tensor]
    for _ in range(STEPS):
        step = [torch.randn(shape) * gscale for _, shape, _, _, gscale in TENSORS]
        step[0][3:7] = 0.0  # embedding rows no token used: zero gradient
        grads.append(step)

    header = ["kiln-optim-ref 1", "torch %s" % torch.__version__,
              "n %d" % sum(t.numel() for t in init), "steps %d" % STEPS]
    for (name, _, decay, _, _), t in zip(TENSORS, init):
        header.append("tensor %s %d %d" % (name, t.numel(), decay))
    body = [flat(init)] + [flat(g) for g in grads]

    for case_name, kind, fields in CASES:
        cfg = dict(DEFAULTS)
        cfg.update(fields)
        cfg = {k: (f32(v) if isinstance(v, float) else v) for k, v in cfg.items()}
        lrs = [f32(cfg["lr"] * f) for f in LR_FACTORS]
        params = [torch.nn.Parameter(t.clone()) for t in init]
        decay = [p for p, spec in zip(params, TENSORS) if spec[2]]
        other = [p for p, spec in zip(params, TENSORS) if not spec[2]]
        opt = make_optimizer(kind, cfg, decay, other)
        for step in range(STEPS):
            for g in opt.param_groups:
                g["lr"] = lrs[step]
            for p, g in zip(params, grads[step]):
                p.grad = g.clone()
            opt.step()
            body.append(flat(params))
        keys = state_keys(kind, cfg)
        for key in keys:
            body.append(flat([opt.state[p][key] for p in params]))
        fields_txt = " ".join("%s=%r" % (k, cfg[k]) for k in
                              ("beta1", "beta2", "eps", "weight_decay", "momentum",
                               "dampening", "nesterov", "alpha"))
        header.append("case name=%s kind=%s %s states=%d lrs=%s" % (
            case_name, kind, fields_txt, len(keys), ",".join(repr(x) for x in lrs)))
    header.append("end")

    data = torch.cat(body).numpy().astype("<f4").tobytes()
    with open(sys.argv[1], "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        f.write(data)
    print("optim_ref.py: wrote %d cases, %d floats to %s" % (len(CASES), len(data) // 4,
                                                            sys.argv[1]))


if __name__ == "__main__":
    main()

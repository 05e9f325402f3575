"""kiln's safetensors against an independent reader and writer in Python (json + torch).

Files kiln writes are parsed here by hand and must hold the names, shapes, dtypes and
values kiln meant; files written here (in the layout Hugging Face uses for GPT-2) must
read and load into kiln with the values torch gives, bit for bit. In mixed precision: kiln's
converting writer stores tensors held in fp32, bf16 or fp16 as F32, BF16 or F16 with torch's
rounding, declaring the dtype in its metadata; kiln reads torch's F32, BF16 and F16 tensors
as each of the three with torch's rounding, refuses a value past fp16's range and a file whose
tensors disagree with its declared dtype, naming the tensor.

usage: check_safetensors.py ST_TOOL WORK_DIR

Exit status 0 when all checks pass; 1 when one fails or none was made; 77 (CTest's skip)
when torch cannot be imported.
"""
import json
import os
import struct
import subprocess
import sys

try:
    import torch
except ImportError:
    sys.stderr.write("SKIP: %s cannot import torch, which this test needs "
                     "(Debian: apt-get install python3-torch)\n" % sys.executable)
    sys.exit(77)

TORCH_DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
}
NAMES = {v: k for k, v in TORCH_DTYPES.items()}

failures = 0
checks = 0


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL:", what)


def read_st(path):
    """(header length, metadata, {name: (dtype, shape, (begin, end), tensor)})."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dt = TORCH_DTYPES[e["dtype"]]
        if end > begin:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dt).reshape(e["shape"])
        else:
            t = torch.zeros(e["shape"], dtype=dt)
        out[name] = (e["dtype"], list(e["shape"]), (begin, end), t)
    return n, meta, out


def write_st(path, tensors, metadata=None, reverse_header=False):
    """tensors: list of (name, tensor); data in list order, header keys optionally reversed."""
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    items = list(header.items())
    if reverse_header:
        items.reverse()
    if metadata is not None:
        items.insert(0, ("__metadata__", metadata))
    h = json.dumps(dict(items)).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def run_tool(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{tool} {' '.join(args)} failed: {r.stderr}")
    return r.stdout


def run_tool_failing(tool, *args):
    """The tool's stderr; it must fail."""
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    check(r.returncode != 0, f"{' '.join(args)} should fail")
    return r.stderr


def parse_dump(text):
    """{name: (dtype, shape, offset, float32 tensor or None)} and {meta key: value}."""
    tensors, meta, config = {}, {}, None
    for line in text.splitlines():
        if line.startswith("@meta "):
            k, v = line[6:].split("=", 1)
            meta[k] = v
            continue
        if line.startswith("@config "):
            config = [int(x) for x in line.split()[1:]]
            continue
        name, dtype, shape, offset, hexv = line.split(" ")
        shape = [] if shape == "-" else [int(x) for x in shape.split(",")]
        vals = None
        if hexv != "-":
            words = [int(hexv[i:i + 8], 16) for i in range(0, len(hexv), 8)]
            vals = torch.tensor(words, dtype=torch.int64).to(torch.int32).view(torch.float32)
        tensors[name] = (dtype, shape, int(offset), vals)
    return tensors, meta, config


def same_bits(a, b):
    """float32 tensors equal bit for bit, any NaN matching any NaN."""
    a, b = a.reshape(-1), b.reshape(-1)
    if a.shape != b.shape:
        return False
    nan = torch.isnan(a) & torch.isnan(b)
    return bool(torch.all(nan | (a.view(torch.int32) == b.view(torch.int32))))


def kiln_to_python(tool, work):
    path = os.path.join(work, "example.safetensors")
    run_tool(tool, "example", path)
    n, meta, t = read_st(path)
    check(n % 8 == 0, "header padded to 8 bytes")
    check(meta == {"format": "pt", "note": "caf\u00e9 \"quoted\""}, f"metadata {meta}")
    check(list(t) == ["f32", "f16", "bf16", "i64", "scalar", "empty", "f64"], f"order {list(t)}")
    want_f32 = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5 - 1.0
    check(t["f32"][1] == [3, 4] and torch.equal(t["f32"][3], want_f32), "f32 values")
    check(t["f16"][3].tolist()[:4] == [1.0, -2.0, 65504.0, 2.0 ** -24], "f16 values")
    check(t["f16"][3][4].item() == float("-inf"), "f16 -inf")
    check(t["bf16"][1] == [2, 3] and t["bf16"][3].float().reshape(-1)[:3].tolist() ==
          [1.0, 3.140625, -1.0], "bf16 values")
    check(t["i64"][3].tolist() == [1, -2, 1 << 40, -(1 << 62)], "i64 values")
    check(t["scalar"][1] == [] and t["scalar"][3].item() == 2.5, "scalar")
    check(t["empty"][1] == [0, 3] and t["empty"][2][0] == t["empty"][2][1], "empty tensor")
    check(t["f64"][3].tolist() == [0.1, -3.5], "f64 values")
    ends = sorted(v[2] for v in t.values())
    check(all(ends[i][1] == ends[i + 1][0] for i in range(len(ends) - 1)), "contiguous data")


def python_to_kiln(tool, work):
    """Every F16 and BF16 bit pattern, random F32 and F64, data order unlike header order."""
    path = os.path.join(work, "conv.safetensors")
    g = torch.Generator().manual_seed(0)
    all16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    tensors = [
        ("f16.all", all16.view(torch.float16).reshape(256, 256)),
        ("bf16.all", all16.view(torch.bfloat16).reshape(256, 256)),
        ("f32.rand", torch.randn(7, 3, 5, generator=g)),
        ("f64.rand", torch.randn(33, generator=g, dtype=torch.float64) * 1e3),
        ("i32.ids", torch.arange(10, dtype=torch.int32)),
    ]
    write_st(path, tensors, metadata={"source": "python"}, reverse_header=True)
    got, meta, _ = parse_dump(run_tool(tool, "dump", path))
    check(meta == {"source": "python"}, f"metadata {meta}")
    check(list(got) == [n for n, _ in tensors], f"kiln's data order {list(got)}")
    for name, t in tensors:
        dtype, shape, offset, vals = got[name]
        check(dtype == NAMES[t.dtype] and shape == list(t.shape), f"{name}: {dtype} {shape}")
        if t.dtype == torch.int32:
            check(vals is None, f"{name}: integers are not read as floats")
            continue
        check(vals is not None and same_bits(vals, t.float()), f"{name}: values differ from torch")


KILN_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def same_bits_as(a, b):
    """Tensors of one dtype equal bit for bit, any NaN matching any NaN."""
    a, b = a.reshape(-1), b.reshape(-1)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan = torch.isnan(a.float()) & torch.isnan(b.float())
    return bool(torch.all(nan | (a.view(INT_VIEW[a.dtype]) == b.view(INT_VIEW[b.dtype]))))


def parse_dump_as(text, dtype):
    """{name: (file dtype, shape, tensor of dtype)} and the declared dtype ("-": none)."""
    out, declared = {}, None
    width = 8 if dtype == torch.float32 else 4
    for line in text.splitlines():
        if line.startswith("@declared "):
            declared = line.split()[1]
            continue
        name, fdtype, shape, _, hexv = line.split(" ")
        shape = [] if shape == "-" else [int(x) for x in shape.split(",")]
        words = [] if hexv == "-" else [int(hexv[i:i + width], 16)
                                        for i in range(0, len(hexv), width)]
        w = torch.tensor(words, dtype=torch.int64)
        if width == 8:
            t = w.to(torch.int32).view(torch.float32)
        else:
            t = torch.where(w >= 32768, w - 65536, w).to(torch.int16).view(dtype)
        out[name] = (fdtype, shape, t.reshape(shape))
    return out, declared


def mixed_values():
    """Random values at many scales, and the cases rounding must get right: ties of BF16 and
    F16 (to even, both ways), F16 subnormals and underflow, F32 subnormals, signed zeros,
    infinities and NaN. All within F16's range after rounding to BF16 (below 65280)."""
    g = torch.Generator().manual_seed(5)
    edge = torch.tensor([1.0, -2.0, 0.0, -0.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11,
                         1 + 3 * 2 ** -11, 2 ** -24, 2 ** -25, 1.5 * 2 ** -25, 2 ** -130,
                         65280.0, -60000.0, float("inf"), float("-inf"), float("nan")],
                        dtype=torch.float32)
    scale = torch.pow(2.0, torch.randint(-30, 15, (983,), generator=g).float())
    rand = (torch.rand(983, generator=g) + 1) * scale * torch.sign(torch.randn(983, generator=g))
    return torch.cat([edge, rand]).reshape(25, 40)


def kiln_writes_mixed(tool, work):
    """kiln's converting writer: each held dtype to each stored dtype, against torch."""
    src = os.path.join(work, "mixed_src.safetensors")
    v = mixed_values()
    write_st(src, [("h.0.mlp.c_fc.weight", v), ("ln_f.bias", v[0, :7].clone())])
    for held, ht in KILN_DTYPES.items():
        for stored, st in KILN_DTYPES.items():
            out = os.path.join(work, f"mixed_{held}_{stored}.safetensors")
            run_tool(tool, "write-as", src, out, held, stored)
            _, meta, t = read_st(out)
            check(meta.get("kiln.dtype") == stored, f"{held}->{stored}: metadata {meta}")
            for name, want in (("h.0.mlp.c_fc.weight", v), ("ln_f.bias", v[0, :7])):
                dtype, shape, _, got = t[name]
                check(dtype == NAMES[st] and shape == list(want.shape),
                      f"{held}->{stored} {name}: {dtype} {shape}")
                check(same_bits_as(got, want.to(ht).to(st)),
                      f"{held}->{stored} {name}: values differ from torch's rounding")
    # a value past fp16's range: the save fails naming the tensor and the value, no file
    big = v.clone()
    big[3, 4] = 70000.0
    src_big = os.path.join(work, "mixed_big.safetensors")
    write_st(src_big, [("h.1.attn.c_proj.weight", big)])
    out = os.path.join(work, "mixed_big_fp16.safetensors")
    err = run_tool_failing(tool, "write-as", src_big, out, "fp32", "fp16")
    check("h.1.attn.c_proj.weight" in err and "70000" in err and "element 124" in err,
          f"overflow message: {err}")
    check(not os.path.exists(out), "no file left by a failed save")


def kiln_reads_mixed(tool, work):
    """Files torch's tensors were written to, in F32, BF16 and F16 (with no kiln.dtype, as
    Hugging Face writes them), read by kiln as fp32, bf16 and fp16, against torch."""
    v = mixed_values()
    all16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    f16_all, bf16_all = all16.view(torch.float16), all16.view(torch.bfloat16)
    bf16_fits = bf16_all[~(bf16_all.float().abs() >= 65520) | ~torch.isfinite(bf16_all.float())]
    files = {
        "F32": [("w", v)],
        "BF16": [("w", v.bfloat16()), ("all", bf16_fits)],
        "F16": [("w", v.half()), ("all", f16_all)],
    }
    for fdtype, tensors in files.items():
        path = os.path.join(work, f"torch_{fdtype}.safetensors")
        write_st(path, tensors, metadata={"format": "pt"})
        for kd, kt in KILN_DTYPES.items():
            got, declared = parse_dump_as(run_tool(tool, "dump-as", path, kd), kt)
            check(declared == "-", f"{fdtype}: declared {declared}")
            for name, t in tensors:
                check(name in got and got[name][0] == fdtype, f"{fdtype} {name}: {got.get(name)}")
                check(name in got and same_bits_as(got[name][2], t.to(kt)),
                      f"{fdtype} {name} read as {kd}: values differ from torch's")
    # BF16 and F32 values past fp16's range: refused as fp16, naming tensor and value
    for fdtype, t in (("F32", v.clone()), ("BF16", bf16_all.clone())):
        if fdtype == "F32":
            t[20, 30] = -1e6
        path = os.path.join(work, f"torch_{fdtype}_big.safetensors")
        write_st(path, [("h.2.mlp.c_proj.weight", t)])
        err = run_tool_failing(tool, "dump-as", path, "fp16")
        want = "-1000000" if fdtype == "F32" else "65536"
        check("h.2.mlp.c_proj.weight" in err and want in err and "65504" in err,
              f"{fdtype} overflow message: {err}")
        run_tool(tool, "dump-as", path, "bf16")


def declared_dtype(tool, work):
    """kiln.dtype in the metadata: a tensor that disagrees is refused, naming it."""
    v = mixed_values()
    path = os.path.join(work, "declared_bad.safetensors")
    write_st(path, [("h.3.ln_1.weight", v[0].bfloat16()), ("h.3.mlp.c_fc.weight", v)],
             metadata={"format": "pt", "kiln.dtype": "bf16"})
    err = run_tool_failing(tool, "dump-as", path, "fp32")
    check("h.3.mlp.c_fc.weight" in err and "F32" in err and "BF16" in err,
          f"mismatch message: {err}")
    path = os.path.join(work, "declared_f32_as_bf16.safetensors")
    write_st(path, [("wte.weight", v)], metadata={"kiln.dtype": "bf16"})
    err = run_tool_failing(tool, "dump-as", path, "bf16")
    check("wte.weight" in err, f"mismatch message: {err}")
    path = os.path.join(work, "declared_good.safetensors")
    write_st(path, [("a", v.half()), ("b", v[1].half())], metadata={"kiln.dtype": "fp16"})
    got, declared = parse_dump_as(run_tool(tool, "dump-as", path, "fp16"), torch.float16)
    check(declared == "fp16" and same_bits_as(got["a"][2], v.half()), "declared fp16 file")


GPT_BLOCK = [("ln_1.weight", "C"), ("ln_1.bias", "C"), ("attn.c_attn.weight", "C,3C"),
             ("attn.c_attn.bias", "3C"), ("attn.c_proj.weight", "C,C"), ("attn.c_proj.bias", "C"),
             ("ln_2.weight", "C"), ("ln_2.bias", "C"), ("mlp.c_fc.weight", "C,4C"),
             ("mlp.c_fc.bias", "4C"), ("mlp.c_proj.weight", "4C,C"), ("mlp.c_proj.bias", "C")]


def gpt2_shapes(L, C, V, T):
    dims = {"C": C, "3C": 3 * C, "4C": 4 * C}
    out = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for i in range(L):
        out += [(f"h.{i}.{n}", [dims[d] for d in s.split(",")]) for n, s in GPT_BLOCK]
    return out + [("ln_f.weight", [C]), ("ln_f.bias", [C])]


def gpt_kiln_to_python(tool, work):
    path = os.path.join(work, "gpt_kiln.safetensors")
    model, _, _ = parse_dump(run_tool(tool, "gpt-save", path))
    _, meta, t = read_st(path)
    check(meta.pop("kiln.dtype", "fp32") == "fp32", "declared fp32 or undeclared")
    check(meta == {"format": "pt", "kiln.n_layer": "2", "kiln.n_head": "2", "kiln.n_embd": "16",
                   "kiln.vocab_size": "100", "kiln.max_seq_len": "8"}, f"metadata {meta}")
    want = gpt2_shapes(2, 16, 100, 8)
    check([(n, v[1]) for n, v in t.items()] == want, "names and shapes are Hugging Face GPT-2's")
    for name, (dtype, shape, _, tensor) in t.items():
        check(dtype == "F32" and same_bits(tensor, model[name][3]), f"{name}: value in the file")
    # GPT-2's initialisation, roughly: LayerNorm weights 1, biases 0, weights ~ N(0, 0.02)
    check(torch.all(t["h.1.ln_2.weight"][3] == 1) and torch.all(t["ln_f.bias"][3] == 0), "init")
    std = t["h.0.attn.c_attn.weight"][3].std().item()
    check(0.015 < std < 0.025, f"c_attn std {std}")


def gpt_python_to_kiln(tool, work):
    """A Hugging Face-style file: "transformer." prefix, mask buffers, tied lm_head, F16."""
    L, C, V, T, H = 2, 32, 77, 16, 4
    g = torch.Generator().manual_seed(1)
    params = [(n, torch.randn(*s, generator=g) * 0.1) for n, s in gpt2_shapes(L, C, V, T)]
    for half in (False, True):
        tensors = []
        for n, p in params:
            tensors.append(("transformer." + n, p.half() if half else p))
            if n.endswith("ln_1.weight"):
                i = n.split(".")[1]
                tensors.append((f"transformer.h.{i}.attn.bias",
                                torch.tril(torch.ones(T, T)).reshape(1, 1, T, T)))
                tensors.append((f"transformer.h.{i}.attn.masked_bias", torch.tensor(-1e4)))
        tensors.append(("lm_head.weight", tensors[0][1]))
        path = os.path.join(work, f"gpt_hf_{int(half)}.safetensors")
        write_st(path, tensors, metadata={"format": "pt"})
        got, _, config = parse_dump(run_tool(tool, "gpt-load", path, str(H)))
        check(config == [L, H, C, V, T], f"config from shapes {config}")
        for n, p in params:
            want = p.half().float() if half else p
            check(n in got and same_bits(got[n][3], want), f"{n} (half={half}) loaded")


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    steps = [kiln_to_python, python_to_kiln, kiln_writes_mixed, kiln_reads_mixed, declared_dtype,
             gpt_kiln_to_python, gpt_python_to_kiln]
    only = sys.argv[3:]  # step names, for running a part by hand
    for step in steps:
        if only and step.__name__ not in only:
            continue
        before = failures
        step(tool, work)
        print(("ok   " if failures == before else "FAIL ") + step.__name__)
    print(f"torch {torch.__version__}: {checks} checks, {failures} failures")
    if checks == 0:
        print("FAIL: no check was made")
    return 1 if failures or checks == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

"""A Llama in plain PyTorch, with Hugging Face Llama's parameter names and layouts.

RMSNorm, rotary position embeddings on q and k (Hugging Face's rotate_half convention: channel
i of a head pairs with channel i + hs/2), grouped-query attention (n_kv_head key/value heads,
each serving n_head / n_kv_head query heads, as Hugging Face's repeat_kv), a SwiGLU MLP
down(silu(gate(x)) * up(x)), no biases, and an output head tied to the embedding or its own.
Linear weights are (out, in), as nn.Linear stores them, so state_dict() names and shapes equal
a Hugging Face Llama checkpoint's:

    model.embed_tokens.weight (V,C)
    model.layers.{i}.input_layernorm.weight (C)
    model.layers.{i}.self_attn.q_proj.weight (NH*hs,C) .k_proj/.v_proj.weight (NKV*hs,C)
    model.layers.{i}.self_attn.o_proj.weight (C,NH*hs)
    model.layers.{i}.post_attention_layernorm.weight (C)
    model.layers.{i}.mlp.gate_proj/.up_proj.weight (H,C) .down_proj.weight (C,H)
    model.norm.weight (C)   lm_head.weight (V,C) when untied

Written here, not imported from transformers, so that the reference is the math itself. Used
by tests/ref/gpt_ref.py and tests/ref/gpt_ref_bf16.py (reference values) and bench/torch_gpt.py
(the PyTorch peer of the training benchmark, which with bench/bench_train.py also counts FLOPs
with flops_per_token here).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        # in float32 whatever x is, then back to x's dtype before the weight, as Hugging
        # Face's LlamaRMSNorm does
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(T, hs, theta, device, dtype):
    """cos and sin (T, hs) of Hugging Face's rotary embedding: inv_freq in float32, the
    angles pos * inv_freq in float32, each frequency twice (both halves of a head)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    pos = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, C, NH, NKV, hs, theta):
        super().__init__()
        self.NH, self.NKV, self.hs, self.theta = NH, NKV, hs, theta
        self.q_proj = nn.Linear(C, NH * hs, bias=False)
        self.k_proj = nn.Linear(C, NKV * hs, bias=False)
        self.v_proj = nn.Linear(C, NKV * hs, bias=False)
        self.o_proj = nn.Linear(NH * hs, C, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        NH, NKV, hs = self.NH, self.NKV, self.hs
        q = self.q_proj(x).view(B, T, NH, hs).transpose(1, 2)   # (B,NH,T,hs)
        k = self.k_proj(x).view(B, T, NKV, hs).transpose(1, 2)  # (B,NKV,T,hs)
        v = self.v_proj(x).view(B, T, NKV, hs).transpose(1, 2)
        cos, sin = rope_tables(T, hs, self.theta, x.device, q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = NH // NKV  # kv head j serves query heads j*g .. j*g+g-1
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, NH * hs)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.gate_proj = nn.Linear(C, H, bias=False)
        self.up_proj = nn.Linear(C, H, bias=False)
        self.down_proj = nn.Linear(H, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, C, NH, NKV, hs, H, eps, theta):
        super().__init__()
        self.input_layernorm = RMSNorm(C, eps)
        self.self_attn = Attention(C, NH, NKV, hs, theta)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.mlp = MLP(C, H)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, n_layer, C, NH, NKV, hs, H, V, eps, theta):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([Layer(C, NH, NKV, hs, H, eps, theta)
                                     for _ in range(n_layer)])
        self.norm = RMSNorm(C, eps)


class Llama(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, n_kv_head=None, head_size=None,
                 mlp_hidden=None, norm_eps=1e-5, rope_theta=10000.0, untied_head=False):
        super().__init__()
        NKV = n_kv_head or n_head
        hs = head_size or n_embd // n_head
        if n_head % NKV or hs % 2:
            raise ValueError("n_kv_head must divide n_head and the head size be even")
        self.vocab_size = vocab_size
        self.model = Body(n_layer, n_embd, n_head, NKV, hs, mlp_hidden or 4 * n_embd,
                          vocab_size, norm_eps, rope_theta)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False) if untied_head else None

    def init_llama(self, generator=None):
        """Hugging Face's initialisation: every matrix N(0, 0.02), norm weights 1."""
        with torch.no_grad():
            for _, p in self.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.02, generator=generator)
                else:
                    p.fill_(1.0)

    def forward(self, idx, targets=None):
        """idx (B,T) int64 -> logits (B,T,V); with targets also the mean loss."""
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x)
        x = self.model.norm(x)
        head = self.lm_head.weight if self.lm_head is not None else self.model.embed_tokens.weight
        logits = x @ head.t()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return logits, loss

    def decay_groups(self, weight_decay):
        """AdamW groups as kiln forms them: decay on the 2-D tensors, none on the norms."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]


def flops_per_token(n_layer, n_embd, n_head, vocab_size, T, n_kv_head=None, head_size=None,
                    mlp_hidden=None):
    """Model FLOPs of one training step per token, as kiln counts them
    (kiln_gpt_flops_per_token in src/model/config.c): 6 x (weights of the matrix products:
    per layer q, k, v (C, A + 2 x NKV x hs), o (A, C), gate and up (C, 2H), down (H, C); the
    head with V columns, tied or not) + 6 x 2 x L x T x A for attention's QK^T and AV, A =
    NH x hs. Norm weights, rotary embeddings and the embedding lookup are not counted."""
    hs = head_size or n_embd // n_head
    A, KV = n_head * hs, (n_kv_head or n_head) * hs
    H = mlp_hidden or 4 * n_embd
    block = n_embd * (A + 2 * KV) + A * n_embd + n_embd * 2 * H + H * n_embd
    matmul_params = n_layer * block + vocab_size * n_embd
    return 6.0 * matmul_params + 12.0 * n_layer * T * A

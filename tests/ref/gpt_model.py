"""GPT-2 in plain PyTorch, with Hugging Face GPT-2's parameter names and layouts.

Learned position embeddings, pre-LN blocks, causal multi-head attention from one fused
qkv projection, GELU (tanh approximation), an MLP of width 4C, a final LayerNorm and an
output head tied to the token embedding. The heads' width (head_size, default C/NH: the
attention is NH x head_size = A wide, c_attn (C,3A), c_proj (A,C)) and the MLP's (mlp_hidden,
default 4C) may be set apart, as in a structurally pruned model. Linear weights are stored (in, out) like
Hugging Face's Conv1D, so state_dict() names and shapes equal a GPT-2 checkpoint's
(without the "transformer." prefix):

    wte.weight (V,C)  wpe.weight (maxT,C)
    h.{i}.ln_1.weight/bias (C)  h.{i}.attn.c_attn.weight (C,3C) .bias (3C)
    h.{i}.attn.c_proj.weight (C,C) .bias (C)  h.{i}.ln_2.weight/bias (C)
    h.{i}.mlp.c_fc.weight (C,4C) .bias (4C)  h.{i}.mlp.c_proj.weight (4C,C) .bias (C)
    ln_f.weight/bias (C)

Used by tests/ref/gpt_ref.py (reference values) and bench/torch_gpt.py (the PyTorch
peer of the training benchmark).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LN_EPS = 1e-5


class Conv1D(nn.Module):
    """y = x @ W + b with W stored (in, out)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        # addmm on the flattened (N, in) view: one GEMM with the bias folded in.
        shape = x.shape[:-1] + (self.weight.shape[1],)
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.view(shape)


class Attention(nn.Module):
    def __init__(self, C, NH, hs=None):
        super().__init__()
        self.n_head = NH
        self.hs = hs or C // NH
        A = NH * self.hs
        self.c_attn = Conv1D(C, 3 * A)
        self.c_proj = Conv1D(A, C)

    def forward(self, x):
        B, T, C = x.shape
        NH, hs = self.n_head, self.hs
        A = NH * hs
        q, k, v = self.c_attn(x).split(A, dim=2)
        # (B,T,C) -> (B,NH,T,hs)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B,NH,T,hs)
        y = y.transpose(1, 2).contiguous().view(B, T, A)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C, H=None):
        super().__init__()
        H = H or 4 * C
        self.c_fc = Conv1D(C, H)
        self.c_proj = Conv1D(H, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH, hs=None, H=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=LN_EPS)
        self.attn = Attention(C, NH, hs)
        self.ln_2 = nn.LayerNorm(C, eps=LN_EPS)
        self.mlp = MLP(C, H)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, max_seq_len, head_size=None,
                 mlp_hidden=None):
        super().__init__()
        if not head_size and n_embd % n_head != 0:
            raise ValueError(f"n_embd {n_embd} is not a multiple of n_head {n_head}")
        self.n_layer = n_layer
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(max_seq_len, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, head_size, mlp_hidden)
                                for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=LN_EPS)

    def init_gpt2(self, generator=None):
        """GPT-2's initialisation: matrices N(0, 0.02), the residual projections
        (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1."""
        proj_std = 0.02 / math.sqrt(2 * self.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = proj_std if name.endswith("c_proj.weight") else 0.02
                    p.normal_(0.0, std, generator=generator)
                elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                        name == "ln_f.weight":
                    p.fill_(1.0)
                else:
                    p.zero_()

    def forward(self, idx, targets=None):
        """idx (B,T) int64 -> logits (B,T,V); with targets also the mean loss."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)[None]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()  # tied head
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def decay_groups(self, weight_decay):
        """AdamW parameter groups as GPT-2 training (and kiln) use them: weight decay on
        the 2-D tensors (wte, wpe, weight matrices), none on biases and LayerNorm."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]


def flops_per_token(n_layer, n_embd, vocab_size, T):
    """Model FLOPs of one training step per token, as kiln counts them
    (kiln_gpt_flops_per_token): 6 x (weights of the matrix products, the head with V
    columns) + 6 x 2 x L x T x C for attention's QK^T and AV."""
    matmul_params = 12 * n_layer * n_embd * n_embd + vocab_size * n_embd
    return 6.0 * matmul_params + 12.0 * n_layer * T * n_embd

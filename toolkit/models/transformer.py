"""The toolkit's transformer with torchtitan's module names, plus `build_model`, `make_batch`, `loss_fn`.

Shape legend: B batch, S sequence, D model dim, H heads, Dh head dim, V vocabulary.

Remat regions as torchtitan main declares them (see `regions.py`): each Linear's `<fqn>.linear`,
`attention.inner_attention` around the attention kernel, the kept trailing add `ffn_residual`, and a `needs(...)`
before each bare op that reads a region's output. RoPE and the loss are main's `@local_compile` functions
"cos_sin_rope" and "loss" (`local_compile.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from .._config import ConfigError, check_instance, check_int
from . import regions
from .config import ModelConfig
from .local_compile import local_compile
from .moe import FeedForward, Linear, MoE, init_feed_forward


def rope_cache(seq_len: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """cos and sin of RoPE angles stacked as [2, S, Dh/2] (real-valued, so every backend handles it)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles_SF = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return torch.stack([angles_SF.cos(), angles_SF.sin()])


def apply_rope(x_BSHD: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    cos, sin = rope[0][None, :, None, :].to(x_BSHD.dtype), rope[1][None, :, None, :].to(x_BSHD.dtype)
    x1, x2 = x_BSHD.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@local_compile("cos_sin_rope")
def rope_qk(q_BSHD: torch.Tensor, k_BSHD: torch.Tensor, rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on queries and keys, one function as main's `CosSinRoPE` is (its `@local_compile("cos_sin_rope")`)."""
    return apply_rope(q_BSHD, rope), apply_rope(k_BSHD, rope)


class QKVLinear(nn.Module):
    """torchtitan main's `attention.qkv_linear`: one `wqkv` projection whose rows are laid out (H, 3, Dh) — each
    head's q, k, v together (R = heads per KV group + 2 = 3 without GQA) — split into contiguous q, k, v."""

    def __init__(self, dim: int, n_heads: int, head_dim: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.wqkv = Linear(dim, 3 * n_heads * head_dim)

    def forward(self, x_BSD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, S, _ = x_BSD.shape
        qkv = self.wqkv(x_BSD)
        regions.needs(self, qkv)  # the split below copies the projection's output with bare ops
        q, k, v = torch.split(qkv.view(B, S, self.n_heads, 3, self.head_dim), [1, 1, 1], dim=-2)
        return (
            q.reshape(B, S, self.n_heads, self.head_dim).contiguous(),
            k.reshape(B, S, self.n_heads, self.head_dim).contiguous(),
            v.reshape(B, S, self.n_heads, self.head_dim).contiguous(),
        )


class Attention(nn.Module):
    """Causal self-attention with RoPE: `wq`, `wk`, `wv`, `wo` as in torchtitan 0.3.0 — multi-head, or grouped-query
    with `n_kv_heads` (Hkv key/value heads), heads of `head_dim`, and optionally Qwen3's `q_norm` / `k_norm` — or
    main's `qkv_linear.wqkv` and `wo`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, H, Hkv, Dh = cfg.dim, cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, Dh
        self.fused = cfg.layout == "torchtitan_main"
        if self.fused:
            self.qkv_linear = QKVLinear(D, H, Dh)
        else:
            self.wq = Linear(D, H * Dh)
            self.wk = Linear(D, Hkv * Dh)
            self.wv = Linear(D, Hkv * Dh)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(Dh, eps=1e-6)
            self.k_norm = nn.RMSNorm(Dh, eps=1e-6)
        self.qk_norm = cfg.qk_norm
        self.wo = Linear(H * Dh, D)
        self.kind = cfg.attention
        self._block_mask = None
        self.dropout = cfg.attention_dropout

    def forward(self, x_BSD: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        B, S, D = x_BSD.shape
        H, Hkv, Dh = self.n_heads, self.n_kv_heads, self.head_dim
        if self.fused:
            q, k, v = self.qkv_linear(x_BSD)
        else:
            q, k, v = (
                self.wq(x_BSD).view(B, S, H, Dh),
                self.wk(x_BSD).view(B, S, Hkv, Dh),
                self.wv(x_BSD).view(B, S, Hkv, Dh),
            )
        regions.needs(self, q, k)  # RoPE (and QK norm) read the projections with bare ops
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope_qk(q, k, rope)
        o_BHSD = regions.region(
            self, "inner_attention", self._attend, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        regions.needs(self, o_BHSD)  # the head merge copies the kernel's output with a bare op
        return self.wo(o_BHSD.transpose(1, 2).reshape(B, S, H * Dh))

    def _attend(self, q, k, v):
        # Each key/value head serves H // Hkv query heads; multi-head attention passes no flag (the same graph).
        gqa = {"enable_gqa": True} if self.n_kv_heads != self.n_heads else {}
        if self.kind == "flex":
            return self._flex(q, k, v, **gqa)
        # Passed only when on: with none, the call (and every graph and count of it) is the one it always was.
        drop = {"dropout_p": self.dropout} if self.dropout and self.training else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa, **drop)

    def remat_regions(self, fqn: str) -> list[str]:
        return [regions.qualified(fqn, "inner_attention")]

    def projections(self) -> list[nn.Linear]:
        """In 0.3.0's draw order: wq, wk, wv, wo (main's wqkv holds the first three)."""
        return [self.qkv_linear.wqkv, self.wo] if self.fused else [self.wq, self.wk, self.wv, self.wo]

    def _flex(self, q, k, v, **gqa):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        S = q.shape[-2]
        if self._block_mask is None or self._block_mask.shape[-2] != S:
            self._block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device=q.device)
        return flex_attention(q, k, v, block_mask=self._block_mask, **gqa)


class TransformerBlock(nn.Module):
    """`x + attention(attention_norm(x))`, then `+ moe(ffn_norm(h))` or `+ feed_forward(ffn_norm(h))`."""

    def __init__(self, layer_id: int, cfg: ModelConfig):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.moe_enabled = cfg.is_moe_layer(layer_id)
        if self.moe_enabled:
            self.moe = MoE(cfg)
        else:
            self.feed_forward = FeedForward(cfg.dim, cfg.ffn_hidden, fused=cfg.layout == "torchtitan_main")
        self.dropout = cfg.residual_dropout

    def forward(self, x_BSD: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        attn_BSD = self.attention(self.attention_norm(x_BSD), rope)
        regions.needs(self, attn_BSD)  # the residual add reads the attention output with a bare op
        h_BSD = x_BSD + self._drop(attn_BSD)
        ffn = self.moe if self.moe_enabled else self.feed_forward
        out_BSD = ffn(self.ffn_norm(h_BSD))
        if self.dropout:
            regions.needs(self, out_BSD)  # the dropout reads the output with a bare op
            out_BSD = self._drop(out_BSD)
        # The trailing add, kept under every policy: it saves nothing for backward, so replay skips it and its
        # inputs need no marker (main's `ffn_residual`).
        return regions.kept(self, "ffn_residual", torch.add, h_BSD, out_BSD)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        # No op at all when off: the block's graphs and counts are the ones it had before dropout existed.
        return F.dropout(x, self.dropout, self.training) if self.dropout else x

    def remat_regions(self, fqn: str) -> list[str]:
        return ["ffn_residual"]


class Transformer(nn.Module):
    """`tok_embeddings` → `layers.{i}` (a ModuleDict keyed "0", "1", …) → `norm` → `lm_head` (`output` in the
    2025 layout)."""

    rope: torch.Tensor  # a buffer (registered in `__init__`)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, cfg) for i in range(cfg.n_layers)})
        self.norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.head_name = "output" if cfg.layout == "torchtitan_2025" else "lm_head"
        self.add_module(self.head_name, nn.Linear(cfg.dim, cfg.vocab_size, bias=False))
        self.register_buffer("rope", rope_cache(cfg.seq_len, cfg.head_dim), persistent=False)

    def forward(self, tokens_BS: torch.Tensor) -> torch.Tensor:
        h_BSD = self.tok_embeddings(tokens_BS)
        rope = self.rope[:, : tokens_BS.shape[1]]
        for layer in self.layers.values():
            h_BSD = layer(h_BSD, rope)
        return self.get_submodule(self.head_name)(self.norm(h_BSD))

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        nn.init.normal_(self.tok_embeddings.weight)
        # Attribute access goes through the AC / compile wrappers (they forward `__getattr__`), so this also
        # works after transforms; the order of the draws is what makes a seed give bit-identical weights.
        for block in cast(Iterable[TransformerBlock], self.layers.values()):
            if block.attention.fused:
                # 0.3.0's wq, wk, wv draws, laid out as main's wqkv rows (H, 3, Dh): same seed, same model.
                D, H, Dh = self.config.dim, self.config.n_heads, self.config.head_dim
                wqkv = block.attention.qkv_linear.wqkv.weight.view(H, 3, Dh, D)
                for j in range(3):
                    w = torch.empty(D, D)
                    nn.init.trunc_normal_(w, std=std)
                    wqkv[:, j].copy_(w.view(H, Dh, D))
                nn.init.trunc_normal_(block.attention.wo.weight, std=std)
            else:
                for lin in block.attention.projections():
                    nn.init.trunc_normal_(lin.weight, std=std)
            norms = [block.attention_norm, block.ffn_norm]
            if block.attention.qk_norm:
                norms += [block.attention.q_norm, block.attention.k_norm]
            for norm in norms:
                nn.init.ones_(norm.weight)
            if block.moe_enabled:
                block.moe.init_weights(std)
            else:
                init_feed_forward(block.feed_forward, std)
        nn.init.ones_(self.norm.weight)
        head = cast(nn.Linear, self.get_submodule(self.head_name))  # the output head `__init__` added
        nn.init.trunc_normal_(head.weight, std=self.config.dim**-0.5)


class Batch(NamedTuple):
    """Token ids and next-token labels, both [B, S] int64."""

    tokens: torch.Tensor
    labels: torch.Tensor


def _memory_of(device: str) -> int | None:
    """Bytes of memory on `device` (the machine's RAM for "cpu"), or None where it is unknown or unbounded."""
    import os

    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    if device == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def check_fits(cfg: ModelConfig) -> None:
    """Refuse, before anything is allocated, a model whose parameters alone exceed the device's memory (an
    allocator error names no field): the ConfigError names the field that makes most of them."""
    have = _memory_of(cfg.device)
    if have is None:
        return
    parts = cfg.param_counts()
    need = sum(parts.values()) * (2 if cfg.dtype == "bfloat16" else 4)
    if need <= have:
        return
    field = _largest_cause(cfg) or max(parts, key=parts.__getitem__)
    raise ConfigError(
        "ModelConfig",
        field,
        f"{field}={getattr(cfg, field)} makes {sum(parts.values()):.3g} parameters ({need / 2**30:.3g} GiB in "
        f"{cfg.dtype}), more than the {have / 2**30:.3g} GiB of {cfg.device_type} memory here.",
        f"lower {field} (the default is {ModelConfig.__dataclass_fields__[field].default}), or estimate full sizes "
        "on fake tensors with tk.estimate(...).",
    )


_SIZE_FIELDS = ("vocab_size", "dim", "n_layers", "ffn_hidden", "moe_hidden", "n_experts", "n_shared_experts")


def _largest_cause(cfg: ModelConfig) -> str | None:
    """The size field above its default whose default alone would remove the most parameters (`n_experts=2**22`
    multiplies the experts' weights, which `param_counts` books under `moe_hidden`), or None."""
    total = sum(cfg.param_counts().values())
    best, best_drop = None, 0
    for name in _SIZE_FIELDS:
        default = ModelConfig.__dataclass_fields__[name].default
        if getattr(cfg, name) <= default:
            continue
        try:
            drop = total - sum(cfg.replace(**{name: default}).param_counts().values())
        except ConfigError:  # the default does not fit the rest (a layer list, top_k): not the one to lower
            continue
        if drop > best_drop:
            best, best_drop = name, drop
    return best


def _check_batch_fits(cfg: ModelConfig) -> None:
    """Refuse a batch whose token ids alone exceed this machine's memory (int64, plus its copies for inputs and
    labels), naming the field, before the allocator fails without one."""
    have = _memory_of("cpu")
    need = 3 * cfg.batch * (cfg.seq_len + 1) * 8
    if have is None or need <= have:
        return
    field = "seq_len" if cfg.seq_len >= cfg.batch else "batch"
    raise ConfigError(
        "ModelConfig",
        field,
        f"{field}={getattr(cfg, field)} makes a batch of {cfg.batch} x {cfg.seq_len} tokens ({need / 2**30:.3g} GiB of "
        f"token ids), more than the {have / 2**30:.3g} GiB of memory here.",
        f"lower {field} (the default is {ModelConfig.__dataclass_fields__[field].default}), or estimate full sizes "
        "on fake tensors with tk.estimate(...).",
    )


def check_tokens(cfg: ModelConfig, tokens: torch.Tensor, owner: str) -> None:
    """Token ids the embedding cannot look up, refused naming `vocab_size` (F.embedding's IndexError says only
    "index out of range in self"); ids on the meta device carry no values and are not checked."""
    if tokens.is_meta or tokens.is_floating_point() or tokens.numel() == 0:
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= cfg.vocab_size:
        bad = high if high >= cfg.vocab_size else low
        raise ConfigError(
            owner,
            "vocab_size",
            f"a token id is {bad}, but the model's vocab_size is {cfg.vocab_size}: ids must be in "
            f"0..{cfg.vocab_size - 1}.",
            f"pass token ids below {cfg.vocab_size} (tk.make_batch(cfg) makes them), or a ModelConfig with "
            f"vocab_size > {high}.",
        )


def _config_of(owner: str, cfg: Any) -> ModelConfig:
    """`cfg`, or the default ModelConfig for None; anything else (a dict, 0, a Scenario) is refused, naming it."""
    if cfg is None:
        return ModelConfig()
    check_instance(owner, "cfg", cfg, ModelConfig, "pass a ModelConfig (tk.ModelConfig(...)) or None.")
    return cfg


def build_model(cfg: ModelConfig | None = None) -> Transformer:
    """A deterministic model for `cfg` (same seed → bit-identical weights); the global RNG is left untouched. A
    model whose parameters cannot fit in the device's memory is refused first, naming the field."""
    cfg = _config_of("build_model", cfg)
    check_fits(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        with torch.device("cpu" if cfg.device_type == "cuda" else cfg.device):
            model = Transformer(cfg)
            if cfg.device_type != "meta":
                model.init_weights()
    model = model.to(device=cfg.device, dtype=cfg.torch_dtype)
    # Buffers that must stay float32 whatever the model dtype: RoPE angles and the balancing statistics.
    model.rope = model.rope.float()
    for block in cast(Iterable[TransformerBlock], model.layers.values()):
        if block.moe_enabled:
            for owner in (block.moe, block.moe.router):
                for name in MoE.buffer_names(cfg.layout):
                    if getattr(owner, name, None) is not None:
                        setattr(owner, name, getattr(owner, name).float())
    model.train()
    return model


def make_batch(cfg: ModelConfig | None = None, *, seed: int | None = None) -> Batch:
    """A deterministic random batch for `cfg` (seeded by `cfg.seed + 1` unless `seed` is given)."""
    cfg = _config_of("make_batch", cfg)
    if seed is not None:
        check_int("make_batch", "seed", seed, 0, (1 << 63) - 1, "a generator seed")
    _check_batch_fits(cfg)
    g = torch.Generator().manual_seed(cfg.seed + 1 if seed is None else seed)
    ids = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len + 1), generator=g)
    ids = ids.to(cfg.device)
    return Batch(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())


@local_compile("loss")
def loss_fn(logits_BSV: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in float32 (its gradient is dense, which `torch._grouped_mm`'s CPU backward needs)."""
    return F.cross_entropy(logits_BSV.flatten(0, 1).float(), labels_BS.flatten())

"""`ModelConfig`: the shape and MoE options of the toolkit's dense / MoE transformer, validated up front."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from .._config import (
    ConfigError,
    PlainData,
    check_bool,
    check_choice,
    check_int,
    check_number,
    literal_choices,
)

if TYPE_CHECKING:
    import torch

ExpertsImpl = Literal["for_loop", "grouped_mm", "masked", "nonzero"]
TokenCount = Literal["scatter", "histc", "bincount"]
Layout = Literal["torchtitan_0_3_0", "torchtitan_main", "torchtitan_2025"]


@dataclass(frozen=True, kw_only=True)
class ModelConfig(PlainData):
    """A small transformer laid out like torchtitan's (llama3 dense blocks, DeepSeek/llama4-style MoE).

    The default is a 2-layer all-MoE model with torchtitan 0.3.0's module, parameter and buffer names and its
    experts (`_grouped_mm` in bfloat16), whose eager training step takes a few milliseconds on a CPU.
    """

    RECORD_EXAMPLE: ClassVar[str] = '{"n_layers": 4, "experts_impl": "for_loop"}'

    layout: Layout = "torchtitan_0_3_0"
    """Names as in a torchtitan release: "torchtitan_0_3_0" (`lm_head`; `attention.wq`/`wk`/`wv`/`wo`;
    `moe.routed_experts.inner_experts` with `w1_EFD`/`w2_EDF`/`w3_EFD` and a `token_dispatcher`; buffers
    `moe.expert_bias_E`, `moe.tokens_per_expert_E`, the counter always kept); "torchtitan_main", torchtitan main
    after 0.3.0 as its files read at the commits in README's recipe line (`attention.qkv_linear.wqkv` and
    `attention.wo`; `moe.routed_experts.w13.weight` [E, 2, F, D] and `w2.weight` [E, D, F], grouped linears run in
    bfloat16, with `activation_fn` and `token_dispatcher` beside them; `moe.router.gate` computed in float32;
    buffers `moe.expert_bias_E` and `moe.router.tokens_per_expert_E`; dense and shared feed-forwards as `w13`
    [2, F, D] + `w2`; only `experts_impl="grouped_mm"` and `token_count="scatter"`, main's only paths); or the
    historical "torchtitan_2025" (`output`; `moe.experts` with `w1`/`w2`/`w3`, `_grouped_mm` in the model's dtype;
    buffers `expert_bias`, `tokens_per_expert` with load balancing only), the layout of PR #2052's era that the
    2025 recipes and some bug notebooks rebuild. Every layout declares main's remat regions (`ACConfig.of(mode=
    "remat")` chooses among them), and one seed gives the same weights in each."""
    n_layers: int = 2
    """Number of transformer blocks, registered as `layers.0` … `layers.{n-1}`."""
    dim: int = 64
    """Model width D."""
    n_heads: int = 4
    """Attention heads H; without `head_dim`, `dim` must be divisible by it and `dim // n_heads` must be even
    (RoPE)."""
    n_kv_heads: int | None = None
    """Key/value heads of grouped-query attention (Qwen3, Llama 4); None = `n_heads` (multi-head attention). Must
    divide `n_heads`; the 0.3.0 and 2025 layouts only (main's fused `wqkv` is laid out per head, without GQA)."""
    attention_head_dim: int | None = None
    """Width Dh of one attention head, even; None = `dim // n_heads` (read it as `head_dim`). Set it where H·Dh is
    not `dim` (Qwen3-30B-A3B: 32 heads of 128 on a 2048-wide model): `wq` is then D → H·Dh and `wo` H·Dh → D."""
    qk_norm: bool = False
    """RMSNorm over each head's queries and keys before RoPE (`attention.q_norm`, `attention.k_norm`; Qwen3)."""
    ffn_hidden: int = 128
    """Hidden width F of the dense SwiGLU `feed_forward` (dense blocks)."""
    vocab_size: int = 128
    """Vocabulary of the token embedding and output projection."""
    seq_len: int = 32
    """Sequence length S of a batch."""
    batch: int = 2
    """Batch size B of a batch (T = B·S tokens go through each MoE)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter and activation dtype. Router scores are always computed in float32."""
    moe_layers: Literal["all", "none"] | int | tuple[int, ...] = "all"
    """Which blocks get an MoE instead of a dense FFN: "all", "none", an int k (every k-th block, i.e. block i
    is MoE when (i + 1) % k == 0, torchtitan's llama4 interleave rule) or a tuple of block indices."""
    n_experts: int = 4
    """Routed experts E."""
    top_k: int = 2
    """Experts K each token is routed to."""
    moe_hidden: int = 64
    """Hidden width of each routed expert (and, times `n_shared_experts`, of the shared expert)."""
    score_func: Literal["softmax", "sigmoid"] = "sigmoid"
    """Router score function (torchtitan's default is sigmoid), computed in float32."""
    route_norm: bool = False
    """Renormalise each token's top-k weights to sum to 1."""
    route_scale: float = 1.0
    """Multiply the routing weights by this constant."""
    n_shared_experts: int = 1
    """Shared experts always applied to every token (0 disables `moe.shared_experts`)."""
    load_balance: bool = True
    """Aux-loss-free balancing as torchtitan keeps it: an expert-bias buffer added to the selection scores, and a
    tokens-per-expert buffer incremented in the forward (the in-place side effect AC recompute repeats, C12)."""
    router_noise: float = 0.0
    """Uniform noise scale added to the selection scores in training (RNG-driven routing, for the
    non-deterministic-routing-under-recompute case C11). 0 disables it."""
    attention_dropout: float = 0.0
    """Dropout probability on the attention weights in training (`scaled_dot_product_attention`'s `dropout_p`), as
    models with attention dropout have it; torchtitan's models have none. 0 (the default) draws nothing."""
    residual_dropout: float = 0.0
    """Dropout probability on each block's attention and feed-forward / MoE output before its residual add (GPT-2's
    `resid_pdrop`); the random numbers a recompute must draw again the same (C60). 0 (the default) draws nothing."""
    experts_impl: ExpertsImpl = "grouped_mm"
    """How routed experts run: "grouped_mm" (`torch._grouped_mm`, torchtitan 0.3.0's only path: in bfloat16 in
    the 0.3.0 layout, in the model's dtype in the 2025 layout, where CPU compile needs bfloat16, C14), "for_loop"
    (torchtitan's 2025 counts `.tolist()` + split: data-dependent, the graph break of C2), "masked" (every expert
    on every row with a mask: static shapes, E× the FLOPs) or "nonzero" (per-expert `nonzero` gather: dynamic
    shapes)."""
    token_count: TokenCount = "scatter"
    """How tokens per expert are counted: "scatter" (routing map + sum, static; torchtitan today), "histc"
    (static) or "bincount" (dynamic output shape: a graph break unless captured)."""
    experts_graph_break: bool = False
    """Give the routed experts' module a `torch.compiler.disable`d forward pre-hook, standing in for the FSDP2
    all-gather hook that made tracing the experts fail in torchtitan PR #2052's era."""
    attention: Literal["sdpa", "flex"] = "sdpa"
    """Attention kernel: causal `scaled_dot_product_attention`, or FlexAttention (no CPU backward in torch
    2.13, so only on CUDA)."""
    device: str = "cpu"
    """Device the model and batches live on: "cpu", "cuda", "cuda:N" or "meta"."""
    seed: int = 0
    """Seed for the weights and for `make_batch`; the same seed gives bit-identical models."""

    def __post_init__(self) -> None:
        own = "ModelConfig"
        # Upper bounds well past any real model's (DeepSeek-V3: 61 layers, 256 experts, top-8), checked before anything
        # walks the layers or experts: sizes beyond them fit no machine, and a layer loop of 10**11 never ends.
        for name, minimum, maximum in [
            ("n_layers", 1, 4096),
            ("dim", 2, 1 << 20),
            ("n_heads", 1, 4096),
            ("ffn_hidden", 1, 1 << 22),
            ("vocab_size", 2, 1 << 24),
            ("seq_len", 1, 1 << 24),
            ("batch", 1, 1 << 20),
            ("n_experts", 1, 8192),
            ("top_k", 1, 8192),
            ("moe_hidden", 1, 1 << 22),
            ("n_shared_experts", 0, 256),
            ("seed", 0, 2**63 - 1),  # torch.manual_seed takes a signed 64-bit seed
        ]:
            check_int(own, name, getattr(self, name), minimum, maximum)
        for name in ["layout", "dtype", "score_func", "experts_impl", "token_count", "attention"]:
            check_choice(own, name, getattr(self, name), literal_choices(ModelConfig, name))
        self._check_heads()
        if self.attention_head_dim is None and self.dim % self.n_heads:
            raise ConfigError(
                own,
                "dim",
                f"dim={self.dim} is not divisible by n_heads={self.n_heads}.",
                f"pick dim as a multiple of n_heads (e.g. dim={self.n_heads * max(1, self.dim // self.n_heads)}) "
                "or change n_heads.",
            )
        if self.attention_head_dim is None and (self.dim // self.n_heads) % 2:
            raise ConfigError(
                own,
                "n_heads",
                f"head dim {self.dim // self.n_heads} is odd; RoPE rotates pairs.",
                "choose dim and n_heads so that dim // n_heads is even.",
            )
        if self.top_k > self.n_experts:
            raise ConfigError(
                own,
                "top_k",
                f"top_k={self.top_k} exceeds n_experts={self.n_experts}.",
                f"use top_k <= {self.n_experts} or raise n_experts.",
            )
        # Truthy stand-ins ("yes", 1) would switch these on without saying so: only real bools pass.
        for name in ("route_norm", "load_balance", "experts_graph_break", "qk_norm"):
            check_bool(own, name, getattr(self, name))
        # inf scales every routing weight to inf (NaN loss); NaN noise compares False with everything, so the
        # `> 0` that enables it skips it and the run looks like no noise at all.
        check_number(own, "route_scale", self.route_scale, minimum=0.0, inclusive=False, example="1.0")
        check_number(own, "router_noise", self.router_noise, minimum=0.0, example="0.0 (off) or 0.5")
        for name in ("attention_dropout", "residual_dropout"):
            check_number(own, name, getattr(self, name), minimum=0.0, maximum=0.99, example="0.0 (off) or 0.1")
        self._check_moe_layers()
        self._check_device()
        if self.experts_impl == "grouped_mm" and self.has_moe:
            # The CPU grouped-mm kernel needs 16-byte aligned strides (C14); multiples of 8 cover fp32 and bf16.
            for name in ("dim", "moe_hidden"):
                if getattr(self, name) % 8:
                    raise ConfigError(
                        own,
                        name,
                        f"{name}={getattr(self, name)} is not a multiple of 8, which "
                        "torch._grouped_mm needs for 16-byte aligned strides.",
                        "use a multiple of 8 or another experts_impl.",
                    )
        if self.layout == "torchtitan_main" and self.has_moe:
            # main's routed experts are grouped linears and its router counts with a routing map: nothing else
            # exists there to be faithful to.
            if self.experts_impl != "grouped_mm":
                raise ConfigError(
                    own,
                    "experts_impl",
                    f"{self.experts_impl!r} does not exist in torchtitan main, "
                    "whose routed experts are two grouped linears (w13, w2) run with "
                    "torch._grouped_mm in bfloat16.",
                    "use experts_impl='grouped_mm' with layout='torchtitan_main', or "
                    "layout='torchtitan_0_3_0' for the other implementations.",
                )
            if self.token_count != "scatter":
                raise ConfigError(
                    own,
                    "token_count",
                    f"{self.token_count!r} does not exist in torchtitan main, whose "
                    "router counts tokens from a routing map (scatter, then sum).",
                    "use token_count='scatter' with layout='torchtitan_main'.",
                )
        if self.attention == "flex" and self.device_type == "cpu":
            raise ConfigError(
                own,
                "attention",
                "FlexAttention has no backward on CPU (torch 2.13.0, 2.14.1 and 2.15.0; NotImplementedError in the "
                "first training step).",
                "use attention='sdpa' on CPU, or device='cuda'.",
            )

    def _check_heads(self) -> None:
        own = "ModelConfig"
        if self.n_kv_heads is not None:
            check_int(own, "n_kv_heads", self.n_kv_heads, 1)
            if self.n_heads % self.n_kv_heads:
                raise ConfigError(
                    own,
                    "n_kv_heads",
                    f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}.",
                    "pick a divisor of n_heads (each key/value head serves n_heads // n_kv_heads query heads).",
                )
        if self.attention_head_dim is not None:
            check_int(own, "attention_head_dim", self.attention_head_dim, 2)
            if self.attention_head_dim % 2:
                raise ConfigError(
                    own,
                    "attention_head_dim",
                    f"attention_head_dim={self.attention_head_dim} is odd; RoPE rotates pairs.",
                    "use an even head width.",
                )
        custom = [n for n in ("n_kv_heads", "attention_head_dim") if getattr(self, n) is not None]
        custom += ["qk_norm"] if self.qk_norm else []
        if custom and self.layout == "torchtitan_main":
            raise ConfigError(
                own,
                custom[0],
                "the torchtitan_main layout's fused wqkv is laid out (H, 3, Dh) per head: multi-head attention of "
                "width dim, no GQA, no head width of its own and no QK norm.",
                "use layout='torchtitan_0_3_0' for grouped-query attention, attention_head_dim or QK norm.",
            )

    def _check_moe_layers(self) -> None:
        v = self.moe_layers
        own = "ModelConfig"
        if isinstance(v, str):
            check_choice(own, "moe_layers", v, ("all", "none"))
        elif isinstance(v, int) and not isinstance(v, bool):
            check_int(own, "moe_layers", v, 1)  # every k-th layer
        elif isinstance(v, tuple):
            bad = [i for i in v if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers]
            if bad:
                raise ConfigError(
                    own,
                    "moe_layers",
                    f"block indices {bad} are not in range(n_layers={self.n_layers}).",
                    "list indices between 0 and n_layers - 1.",
                )
        else:
            raise ConfigError(
                own,
                "moe_layers",
                f"{v!r} has the wrong type.",
                "pass 'all', 'none', an int k or a tuple of block indices.",
            )

    def _check_device(self) -> None:
        import torch

        if not isinstance(self.device, str):  # torch.device(0) is cuda:0; a huge int overflows inside torch
            raise ConfigError(
                "ModelConfig",
                "device",
                f"a {type(self.device).__name__} is not a device name.",
                "pass 'cpu', 'cuda' or 'meta'.",
            )
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(
                "ModelConfig",
                "device",
                f"{self.device!r} is not a device ({e}).",
                "pass 'cpu', 'cuda', 'cuda:0' or 'meta'.",
            ) from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                "ModelConfig",
                "device",
                "CUDA was asked for but torch.cuda.is_available() is False.",
                "use device='cpu' on this machine.",
            )
        if dev.type not in ("cpu", "cuda", "meta"):
            raise ConfigError(
                "ModelConfig", "device", f"device type {dev.type!r} is not supported.", "use 'cpu', 'cuda' or 'meta'."
            )

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def head_dim(self) -> int:
        """Dh: `attention_head_dim`, or `dim // n_heads` when it is None."""
        return self.attention_head_dim if self.attention_head_dim is not None else self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `n_kv_heads`, or `n_heads` when it is None."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    def is_moe_layer(self, i: int) -> bool:
        v = self.moe_layers
        if v == "all":
            return True
        if v == "none":
            return False
        if isinstance(v, int):
            return (i + 1) % v == 0
        return i in v

    @property
    def moe_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.is_moe_layer(i))

    @property
    def has_moe(self) -> bool:
        return bool(self.moe_layer_ids)

    @property
    def experts_untraceable(self) -> bool:
        """C14: the experts run `torch._grouped_mm` in a dtype its meta kernel refuses, so compile cannot trace them
        (the 2025 layout keeps the model's dtype; float32 on torch 2.13 and 2.14). The one home of that condition."""
        from .. import compat

        return (
            self.has_moe
            and self.layout == "torchtitan_2025"
            and self.experts_impl == "grouped_mm"
            and not compat.grouped_mm_traces_in(self.dtype)
        )

    @property
    def draws_random(self) -> bool:
        """A training step draws random numbers (router noise, dropout): what a recompute must draw again the same,
        and what compiled code draws otherwise than eager."""
        return bool(self.attention_dropout or self.residual_dropout or (self.router_noise and self.has_moe))

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.dtype]

    def param_counts(self) -> dict[str, int]:
        """Parameters by the field that sizes them (`vocab_size`: embedding and head; `dim`: attention and norms;
        `ffn_hidden`: dense feed-forwards; `moe_hidden`: routed and shared experts; `n_experts`: the routers):
        what `build_model` checks against the device's memory before allocating."""
        D, n_moe = self.dim, len(self.moe_layer_ids)
        n_dense = self.n_layers - n_moe
        experts = 3 * D * self.moe_hidden * (self.n_experts + self.n_shared_experts)
        return {
            "vocab_size": 2 * self.vocab_size * D,
            "dim": self.n_layers * (4 * D * D + 2 * D) + D,
            "ffn_hidden": n_dense * 3 * D * self.ffn_hidden,
            "moe_hidden": n_moe * experts,
            "n_experts": n_moe * D * self.n_experts,
        }

"""Hugging Face transformers in the loop: its own models at tiny sizes, its loss, its own checkpointing and compile.

The models are transformers' own classes (`AutoModelForCausalLM.from_config`), built from config objects with random
init: nothing is ever downloaded. AC is transformers' own switch, `activation_checkpointing_enable` (the
`gradient_checkpointing_enable` of releases before 5.25, still an alias), with the kwargs it passes through to
`torch.utils.checkpoint.checkpoint`; compile is what users write, `model.compile()` or `layer.compile()` per decoder
layer. Optional: `pip install -e ".[transformers]"` (the checked range below).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, cast

import torch
from torch import nn

from .. import _extras, compat
from .._config import ConfigError, PlainData, check_choice, check_int
from ..transforms.policies import per_op_context
from . import extra_of
from .base import Built, Stack

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CHECKED = ("5.25",)
"""The transformers releases (major.minor) the toolkit was checked against: CI runs the newest patch of each."""
INSTALL = extra_of("transformers").install  # the one install line: its line in the registry (stacks/__init__.py)
Family = Literal["qwen3_moe", "mixtral", "deepseek_v3", "qwen3"]
FAMILIES: tuple[str, ...] = ("qwen3_moe", "mixtral", "deepseek_v3", "qwen3")
EXPERTS: tuple[str, ...] = ("grouped_mm", "batched_mm", "eager")
AC_MODES: tuple[str, ...] = ("none", "full", "reentrant", "selective_op", "selective_layer")
"""transformers' own AC, by the toolkit's mode names: nothing; `use_reentrant=False`; `use_reentrant=True`;
`use_reentrant=False` with torchtitan's per-op SAC policy as `context_fn` (transformers passes it through);
`every_n_layers=layer_every`. Each of them with `offload=True` is its `offload=True` (save_on_cpu around each
checkpoint)."""
SCOPES: tuple[str, ...] = ("model", "blocks")
"""The whole model — `model.compile()` (in place, its names kept; `method="module_compile"`) or `torch.compile(model)`
(the wrapper users call; `method="torch_compile"`) — or `layer.compile()` for each decoder layer."""
_WRAPPER = "_toolkit_torch_compile_wrapper"
"""Where `torch.compile(model)`'s wrapper is kept on the model it wraps (in its `__dict__`, not a submodule), so that
the step calls the wrapper as a user would while names, gradients and `undo` stay the model's own."""


def runner(model: nn.Module) -> nn.Module:
    """What a user calls: `torch.compile(model)`'s wrapper where the stack made one, else the model itself."""
    return model.__dict__.get(_WRAPPER, model)


def available() -> bool:
    return _extras.available("transformers")


def version() -> str | None:
    return _extras.version("transformers")


def checked(v: str | None) -> bool:
    return v is not None and ".".join(v.split(".")[:2]) in CHECKED


def require(owner: str = "Scenario", field: str = "stack") -> None:
    """ConfigError naming the install line when transformers is missing; a release outside the checked range runs
    with one warning that names the range."""
    if not available():
        raise ConfigError(owner, field, "transformers is not installed.", f"install it: {INSTALL}")
    v = version()
    if not checked(v):
        _warn_unchecked(v)


@functools.lru_cache(maxsize=None)
def _warn_unchecked(v: str | None) -> None:
    """Once per process and release (a Scenario is checked at each `replace`, a sweep builds hundreds)."""
    warnings.warn(
        f"transformers {v} is installed; the toolkit was checked against {', '.join(c + '.x' for c in CHECKED)} "
        f"(`{INSTALL}` installs that range). Its figures may differ.",
        stacklevel=4,
    )


@dataclass(frozen=True, kw_only=True)
class TransformersConfig(PlainData):
    """One of transformers' own causal-LM models at a size a CPU trains in milliseconds, from a config object."""

    family: Family = "qwen3_moe"
    """"qwen3_moe" (`Qwen3MoeForCausalLM`, every block MoE), "mixtral" (`MixtralForCausalLM`), "deepseek_v3"
    (`DeepseekV3ForCausalLM`: MLA attention, the first block dense, a shared expert) or "qwen3" (`Qwen3ForCausalLM`,
    dense)."""
    n_layers: int = 2
    dim: int = 64
    n_heads: int = 4
    n_experts: int = 8
    top_k: int = 2
    moe_hidden: int = 32
    """Hidden width of each routed expert (the dense MLP is 2 × dim)."""
    experts: Literal["grouped_mm", "batched_mm", "eager"] = "grouped_mm"
    """transformers' `experts_implementation`: "grouped_mm" (its default), "batched_mm", or "eager" (the loop over
    the experts that received tokens: a data-dependent count)."""
    attention: Literal["sdpa", "eager"] = "sdpa"
    """transformers' `attn_implementation`."""
    attention_dropout: float = 0.0
    """The config's `attention_dropout` (training draws random numbers when > 0)."""
    vocab_size: int = 256
    seq_len: int = 16
    batch: int = 2
    dtype: Literal["float32", "bfloat16"] = "float32"
    seed: int = 0
    """Seeds the init and the batch."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        own = "TransformersConfig"
        check_choice(own, "family", self.family, FAMILIES)
        check_choice(own, "experts", self.experts, EXPERTS)
        check_choice(own, "attention", self.attention, ("sdpa", "eager"))
        check_choice(own, "dtype", self.dtype, ("float32", "bfloat16"))
        check_choice(own, "device", self.device, ("cpu", "cuda"))
        for name, low, high in (
            ("n_layers", 1, 64),
            ("dim", 8, 8192),
            ("n_heads", 1, 256),
            ("n_experts", 1, 512),
            ("top_k", 1, 512),
            ("moe_hidden", 8, 32768),
            ("vocab_size", 2, 1 << 20),
            ("seq_len", 1, 4096),
            ("batch", 1, 1024),
            ("seed", 0, 2**31 - 1),
        ):
            check_int(own, name, getattr(self, name), low, high, "a size a CPU trains a step of")
        if isinstance(self.attention_dropout, bool) or not isinstance(self.attention_dropout, (int, float)):
            raise ConfigError(own, "attention_dropout", f"{self.attention_dropout!r} is not a number.", "pass 0.0-1.0.")
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ConfigError(
                own, "attention_dropout", f"{self.attention_dropout} is outside [0, 1).", "pass e.g. 0.0 or 0.1."
            )
        if self.top_k > self.n_experts:
            raise ConfigError(
                own,
                "top_k",
                f"top_k={self.top_k} exceeds n_experts={self.n_experts}.",
                f"use top_k <= {self.n_experts}.",
            )
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ConfigError(
                own,
                "dim",
                f"dim={self.dim} over n_heads={self.n_heads} is not an even head size (RoPE rotates pairs).",
                "pick dim as n_heads × an even number.",
            )
        if self.family == "deepseek_v3" and self.n_layers < 2:
            raise ConfigError(
                own, "n_layers", "DeepSeek-V3's first block is dense: one block leaves no MoE.", "use n_layers >= 2."
            )
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                own, "device", "CUDA was asked for but torch.cuda.is_available() is False.", "use device='cpu'."
            )

    @property
    def has_moe(self) -> bool:
        return self.family != "qwen3"

    @property
    def label(self) -> str:
        return f"transformers {self.family}" + (f" ({self.experts})" if self.has_moe else "")

    def at_size(self, *, n_layers: int, n_experts: int, top_k: int) -> "TransformersConfig":
        """This model with other sizes, those its family has (a dense one has no experts; DeepSeek-V3's first block
        is dense, so it keeps two)."""
        moe = dict(n_experts=n_experts, top_k=top_k) if self.has_moe else {}
        return self.replace(n_layers=max(n_layers, 2 if self.family == "deepseek_v3" else 1), **moe)

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type


def hf_config(cfg: TransformersConfig):
    """transformers' own config object for `cfg` (its `AutoConfig.for_model`), nothing downloaded."""
    from transformers import AutoConfig

    head = cfg.dim // cfg.n_heads
    common: dict[str, Any] = dict(
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=max(64, cfg.seq_len),
        attention_dropout=cfg.attention_dropout,
        use_cache=False,  # a training step: what Trainer and TRL set when checkpointing is on
    )
    if cfg.family == "qwen3_moe":
        kw = dict(
            intermediate_size=2 * cfg.dim,
            moe_intermediate_size=cfg.moe_hidden,
            num_key_value_heads=max(1, cfg.n_heads // 2),
            head_dim=head,
            num_experts=cfg.n_experts,
            num_experts_per_tok=cfg.top_k,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    elif cfg.family == "mixtral":
        kw = dict(
            intermediate_size=cfg.moe_hidden,
            num_key_value_heads=max(1, cfg.n_heads // 2),
            head_dim=head,
            num_local_experts=cfg.n_experts,
            num_experts_per_tok=cfg.top_k,
        )
    elif cfg.family == "deepseek_v3":
        kw = dict(
            intermediate_size=2 * cfg.dim,
            moe_intermediate_size=cfg.moe_hidden,
            num_key_value_heads=cfg.n_heads,
            n_routed_experts=cfg.n_experts,
            num_experts_per_tok=cfg.top_k,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_nope_head_dim=head,
            qk_rope_head_dim=head // 2,
            v_head_dim=head,
        )
    else:
        kw = dict(intermediate_size=2 * cfg.dim, num_key_value_heads=max(1, cfg.n_heads // 2), head_dim=head)
    return AutoConfig.for_model(cfg.family, **common, **kw)


def build(cfg: TransformersConfig) -> nn.Module:
    """transformers' own model for `cfg`, its own init seeded (same seed → same weights; the global RNG is left as
    it was), in training mode. Needs transformers (`require()`; a Scenario checks it when it is made)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(cfg)
    options: dict[str, Any] = {"attn_implementation": cfg.attention}
    if cfg.has_moe:
        options["experts_implementation"] = cfg.experts
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        with torch.device(cfg.device):
            model = AutoModelForCausalLM.from_config(config, **options)
    model = model.to(dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype])
    model.train()
    return model


def make_batch(cfg: TransformersConfig) -> torch.Tensor:
    """Token ids [B, S], deterministic for the seed; they are also the labels (transformers' loss shifts them)."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=g).to(cfg.device)


def decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`(name, layer)` of the model's `GradientCheckpointingLayer`s: the blocks its AC checkpoints."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]


def checkpoint_kwargs(model: nn.Module, ac: Any) -> dict[str, Any]:
    """The kwargs transformers passes through to `torch.utils.checkpoint.checkpoint` for `ac`."""
    if ac.mode == "reentrant":
        return {"use_reentrant": True, "preserve_rng_state": ac.preserve_rng_state}
    kw: dict[str, Any] = {
        "use_reentrant": False,
        "preserve_rng_state": ac.preserve_rng_state,
        "determinism_check": ac.determinism_check,
        "debug": ac.debug,
    }
    if ac.mode == "selective_op":
        # One policy for every layer (transformers passes one context_fn): the layers are alike, so the first one's
        # shapes stand for all; a fresh policy per checkpoint call, as torchtitan's.
        name, layer = decoder_layers(model)[0]
        kw["context_fn"] = per_op_context(ac.extra_save_ops, ac.force_recompute_mm_shapes_by_fqns or (), layer, name)
    return kw


def apply_ac(model: nn.Module, ac: Any) -> None:
    """transformers' own `activation_checkpointing_enable` (or `gradient_checkpointing_enable` where that is all the
    release has) with the kwargs for `ac`; `selective_layer` is its `every_n_layers`."""
    if ac.mode == "none":
        return
    kwargs = checkpoint_kwargs(model, ac)
    every = ac.layer_every if ac.mode == "selective_layer" else 1
    offload = getattr(ac, "offload", False)
    hf = cast("PreTrainedModel", model)  # a model `build` made
    if hasattr(model, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs, every_n_layers=every, **({"offload": True} if offload else {})
        )
    else:
        if every != 1 or offload:
            raise ConfigError(
                "ACConfig",
                "mode" if every != 1 else "offload",
                f"transformers {version()} has no {'every_n_layers' if every != 1 else 'offload'}.",
                "use mode='full' without offload, or transformers 5.25.",
            )
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def apply_compile(model: nn.Module, c: Any) -> dict[str, str]:
    """`model.compile(...)`, `torch.compile(model, ...)` (the wrapper, kept for `runner`) or `layer.compile(...)` per
    decoder layer, with the Dynamo options the config sets for the run (`restoring_process_state` puts them back)."""
    if not c.enabled:
        return {}
    dynamo = compat.compiler_configs().dynamo
    for name in (
        "capture_scalar_outputs",
        "capture_dynamic_output_shape_ops",
        "skip_fwd_side_effects_in_bwd_under_checkpoint",
    ):
        if getattr(c, name):
            setattr(dynamo, name, True)
    options: dict[str, Any] = {"backend": c.backend, "fullgraph": c.fullgraph, "dynamic": c.dynamic}
    if c.inductor_options:
        options["options"] = dict(c.inductor_options)
    targets = [("", model)] if c.scope == "model" else decoder_layers(model)
    if c.method == "torch_compile":  # scope "model" (check); what transformers' docs and users write
        object.__setattr__(model, _WRAPPER, torch.compile(model, **options))
        return {"<model>": "compile(AC(x))"}
    for _, m in targets:
        m.compile(**options)
    return {name or "<model>": "compile(AC(x))" for name, _ in targets}


class TransformersStack:
    """transformers behind the `Stack` interface."""

    name = "transformers"
    config_type = TransformersConfig
    config_field = "model"

    def available(self) -> bool:
        return available()

    def require(self, owner: str, field: str) -> None:
        require(owner, field)

    def release(self) -> str | None:
        return version()

    def check(self, scenario: Any) -> None:
        own = "Scenario"
        require(own, "stack")
        if scenario.ep > 1:
            raise ConfigError(
                own, "ep", "expert parallel is torchtitan's.", "pass stack='torchtitan' with ep, or ep=1."
            )
        if scenario.fsdp != "none":
            raise ConfigError(
                own, "fsdp", "the transformers stack measures one process, unsharded.", "pass fsdp='none'."
            )
        if scenario.recipe is not None:
            raise ConfigError(
                own,
                "recipe",
                "a recipe is the toolkit's rebuild of torchtitan's transforms; transformers applies its own.",
                "drop recipe and pass ac=ACConfig.of(mode=...) and compile=CompileConfig(scope='model' | 'blocks').",
            )
        ac = scenario.ac
        if ac.mode not in AC_MODES:
            raise ConfigError(
                own,
                "ac",
                f"mode={ac.mode!r} is not one of transformers' own: {', '.join(AC_MODES)}.",
                "pass one of those (selective_op is its use_reentrant=False with a per-op context_fn).",
            )
        if getattr(ac, "early_stop", False):
            raise ConfigError(
                "ACConfig",
                "early_stop",
                "transformers passes kwargs to torch.utils.checkpoint.checkpoint, which has no early_stop.",
                "drop early_stop.",
            )
        if getattr(ac, "wrap_inductor_compiled_regions", False):
            raise ConfigError(
                "ACConfig",
                "wrap_inductor_compiled_regions",
                "it is an option of the toolkit's own wrappers.",
                "drop it, or use stack='toolkit'.",
            )
        c = scenario.compile
        if c.enabled:
            if c.scope not in SCOPES:
                raise ConfigError(
                    "CompileConfig",
                    "scope",
                    f"{c.scope!r}: the transformers stack compiles what its users do, the whole model or each "
                    "decoder layer.",
                    "pass scope='model' or scope='blocks'.",
                )
            if c.method not in ("module_compile", "torch_compile") or (
                c.method == "torch_compile" and c.scope != "model"
            ):
                raise ConfigError(
                    "CompileConfig",
                    "method",
                    f"{c.method!r} with scope={c.scope!r}: the transformers stack compiles as its users do, the whole "
                    "model in place (`model.compile()`) or by `torch.compile(model)`, and each decoder layer in "
                    "place (`layer.compile()`).",
                    "pass method='module_compile', or method='torch_compile' with scope='model'.",
                )
            if c.order == "ac_outside":
                raise ConfigError(
                    "CompileConfig",
                    "order",
                    "transformers checkpoints each layer's forward inside its call, so a compiled layer or model "
                    "holds its checkpoints: compile(AC(x)).",
                    "pass order=None or 'compile_outside'.",
                )
        if not isinstance(scenario.model, TransformersConfig):
            raise ConfigError(
                own,
                "model",
                f"is a {type(scenario.model).__name__}; stack='transformers' builds from a TransformersConfig.",
                "pass model=toolkit.stacks.transformers.TransformersConfig(...).",
            )

    def step_context(self, scenario: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def build(self, scenario: Any, *, sharded: bool) -> Built:
        cfg = scenario.model_config
        model = cast("PreTrainedModel", build(cfg))  # transformers' own model
        ids = make_batch(cfg)
        loss_function, vocab = model.loss_function, model.config.vocab_size

        def loss_of(out: Any) -> torch.Tensor:  # transformers' own causal-LM loss (it shifts the labels)
            return loss_function(logits=out.logits, labels=ids, vocab_size=vocab)

        return Built(
            model,
            ids,
            lambda m: runner(m)(input_ids=ids),
            loss_of,
            torch.device(cfg.device),
            next(model.parameters()).dtype,
            cfg.seed + 2,
        )

    def transform(self, scenario: Any, model: nn.Module, stage: Callable[[str], None]) -> dict[str, str]:
        stage("ac")
        apply_ac(model, scenario.ac)
        stage("compile")
        orders = apply_compile(model, scenario.compile)
        return orders if scenario.ac.mode != "none" else {}

    def called(self, model: nn.Module) -> nn.Module:
        return runner(model)

    def applied(self, model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What transformers' own flags say: the layers whose `gradient_checkpointing` is on, the modules compiled."""
        ckpt = tuple(n for n, m in decoder_layers(model) if m.gradient_checkpointing)
        compiled = tuple(n or "<model>" for n, m in model.named_modules() if compat.in_place_compiled(m))
        return ckpt, (("<model>",) if _WRAPPER in model.__dict__ else ()) + compiled

    def undo(self, model: nn.Module) -> None:
        model.__dict__.pop(_WRAPPER, None)
        if getattr(model, "is_gradient_checkpointing", False):
            cast("PreTrainedModel", model).gradient_checkpointing_disable()
        for m in model.modules():
            if compat.in_place_compiled(m):
                compat.clear_in_place_compile(m)

    def label(self, scenario: Any) -> str:
        c = scenario.compile
        comp = (
            "eager"
            if not c.enabled
            else f"{'torch.compile(model)' if c.method == 'torch_compile' else 'compile ' + c.scope} "
            f"({c.backend_name}{', fullgraph' if c.fullgraph else ''})"
        )
        return f"{scenario.model.label} | AC {scenario.ac.mode} | {comp}"

    def draws_random(self, config: TransformersConfig) -> bool:
        return config.attention_dropout > 0

    def blocks(self, model: nn.Module) -> list[str]:
        return [n for n, _ in decoder_layers(model)]


STACK: Stack = TransformersStack()

__all__ = [
    "CHECKED",
    "FAMILIES",
    "TransformersConfig",
    "available",
    "build",
    "make_batch",
    "apply_ac",
    "apply_compile",
    "hf_config",
    "require",
    "runner",
    "STACK",
]

"""torchtitan 0.3.0 in the loop: its own models at tiny sizes, its loss, its AC, compile and FSDP.

torchtitan 0.3.0 in the loop: its own Qwen3-MoE / DeepSeek-V3 at tiny sizes, its loss, and its own AC, compile and FSDP
applied in the order its `parallelize_*` uses.

Optional: `INSTALL` (`pip install -e ".[torchtitan]"`, or `.ci/run`'s `--no-deps` route that README gives, which
installs only what torchtitan's model and parallelize code import and leaves torch alone). On CPU, inner attention
is swapped for SDPA (FlexAttention has no CPU backward); with CUDA, flex stays.

What torchtitan changes for the rest of the process when applied — Dynamo's LRU switch off (`FullAC` /
`SelectiveAC.apply`), `capture_scalar_outputs` and `skip_fwd_side_effects_in_bwd_under_checkpoint` on
(`apply_compile`) — is undone after each toolkit run (`instrument.step.restoring_process_state`); importing it also
rebinds `FakeTensorMode.__init__` (pytorch#178887), which nothing can undo.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Literal, cast

import torch
from torch import nn

from .. import _extras
from .._config import ConfigError, PlainData, check_bool, check_choice, check_int
from ..transforms import ACConfig, CompileConfig
from ..transforms.naming import canonical_name, is_checkpoint_wrapper, is_compiled
from . import extra_of
from .base import Built, Stack

RELEASE = "0.3.0"
Family = Literal["qwen3_moe", "deepseek_v3"]
FAMILIES: tuple[str, ...] = ("qwen3_moe", "deepseek_v3")
INSTALL = extra_of("torchtitan").install  # the one install line: its line in the registry (stacks/__init__.py)


def available() -> bool:
    return _extras.available("torchtitan")


def version() -> str | None:
    return _extras.version("torchtitan")


def require(owner: str = "Scenario", field: str = "stack") -> None:
    """Raise ConfigError naming the install steps when torchtitan 0.3.0 is not importable."""
    if not available():
        raise ConfigError(owner, field, "torchtitan is not installed.", f"install it: {INSTALL}")
    v = version()
    if v is not None and v != RELEASE:
        raise ConfigError(
            owner, field, f"torchtitan {v} is installed; the toolkit drives {RELEASE}.", f"install {RELEASE}: {INSTALL}"
        )


@dataclass(frozen=True, kw_only=True)
class TorchtitanConfig(PlainData):
    """One of torchtitan 0.3.0's own MoE models at a size a CPU trains in milliseconds."""

    family: Family = "qwen3_moe"
    """"qwen3_moe" (GQA attention with fused `qkv_linear.wqkv`, all-MoE) or "deepseek_v3" (MLA attention, the
    first `n_dense_layers` blocks dense)."""
    n_layers: int = 2
    """Blocks `layers.0` … `layers.{n-1}`."""
    dim: int = 64
    """Model width D."""
    n_heads: int = 4
    """Attention heads."""
    n_experts: int = 4
    """Routed experts E."""
    top_k: int = 2
    """Experts per token K."""
    moe_hidden: int = 32
    """Hidden width of each routed expert (and of the shared expert)."""
    shared_experts: bool = True
    """A shared expert beside the routed ones (Qwen3's builder has none: the toolkit adds torchtitan's
    `FeedForward` config, as `MoE.Config.shared_experts` allows)."""
    n_dense_layers: int = 0
    """DeepSeek-V3: the first blocks with a dense `feed_forward` (`TorchtitanConfig.deepseek_v3()` takes its
    flavours' 1); must be 0 for Qwen3."""
    vocab_size: int = 128
    seq_len: int = 16
    """Sequence length of a batch (RoPE is built for 64 positions)."""
    batch: int = 2
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype; torchtitan's experts compute in bfloat16 either way."""
    seed: int = 0
    """Seed for `init_states` and the batch."""
    device: str = "cpu"
    """"cpu" (SDPA inner attention) or "cuda" (FlexAttention kept)."""

    def __post_init__(self) -> None:
        own = "TorchtitanConfig"
        check_choice(own, "family", self.family, FAMILIES)
        for name, minimum in (
            ("n_layers", 1),
            ("dim", 8),
            ("n_heads", 1),
            ("n_experts", 1),
            ("top_k", 1),
            ("moe_hidden", 8),
            ("vocab_size", 2),
            ("seq_len", 1),
            ("batch", 1),
            ("seed", 0),
            ("n_dense_layers", 0),
        ):
            check_int(own, name, getattr(self, name), minimum)
        check_choice(own, "dtype", self.dtype, ("float32", "bfloat16"))
        check_choice(own, "device", self.device, ("cpu", "cuda"))
        check_bool(own, "shared_experts", self.shared_experts)
        if self.top_k > self.n_experts:
            raise ConfigError(
                own,
                "top_k",
                f"top_k={self.top_k} exceeds n_experts={self.n_experts}.",
                f"use top_k <= {self.n_experts}.",
            )
        if self.seq_len > 64:
            raise ConfigError(
                own, "seq_len", f"{self.seq_len} exceeds the 64 positions RoPE is built for.", "use seq_len <= 64."
            )
        if self.family == "qwen3_moe" and self.n_dense_layers:
            raise ConfigError(own, "n_dense_layers", "Qwen3-MoE has no dense blocks.", "pass n_dense_layers=0.")
        if self.family == "deepseek_v3" and self.n_dense_layers >= self.n_layers:
            raise ConfigError(
                own,
                "n_dense_layers",
                f"{self.n_dense_layers} dense of {self.n_layers} blocks leaves no MoE block.",
                f"use n_dense_layers < {self.n_layers}.",
            )
        if self.dim % self.n_heads:
            raise ConfigError(
                own,
                "dim",
                f"dim={self.dim} is not divisible by n_heads={self.n_heads}.",
                "pick dim as a multiple of n_heads.",
            )
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                own, "device", "CUDA was asked for but torch.cuda.is_available() is False.", "use device='cpu'."
            )

    @classmethod
    def qwen3(cls, **kw: Any) -> "TorchtitanConfig":
        return cls(family="qwen3_moe", **kw)

    @classmethod
    def deepseek_v3(cls, **kw: Any) -> "TorchtitanConfig":
        return cls(family="deepseek_v3", **{"n_layers": 3, "n_dense_layers": 1, **kw})

    @classmethod
    def of_family(cls, family: str, **kw: Any) -> "TorchtitanConfig":
        """The preset of `family` ("qwen3_moe" → `qwen3()`, "deepseek_v3" → `deepseek_v3()`), with `kw` over it."""
        return cls.qwen3(**kw) if family == "qwen3_moe" else cls.deepseek_v3(**kw)

    def at_size(self, *, n_layers: int, n_experts: int, top_k: int) -> "TorchtitanConfig":
        """This model with other sizes; at least one MoE block after DeepSeek-V3's dense ones."""
        return self.replace(n_layers=max(n_layers, self.n_dense_layers + 1), n_experts=n_experts, top_k=top_k)

    @property
    def label(self) -> str:
        return f"torchtitan {self.family}"


def _model_config(cfg: TorchtitanConfig):
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config

    init = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}
    head_dim = cfg.dim // cfg.n_heads
    if cfg.family == "qwen3_moe":
        from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_moe_layers

        layers = _build_qwen3_moe_layers(
            n_layers=cfg.n_layers,
            dim=cfg.dim,
            n_heads=cfg.n_heads,
            n_kv_heads=max(1, cfg.n_heads // 2),
            head_dim=head_dim,
            moe_hidden_dim=cfg.moe_hidden,
            num_experts=cfg.n_experts,
            top_k=cfg.top_k,
            attn_backend="flex",
            moe_comm_backend="standard",
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=64, theta=1e6),
        )
        if cfg.shared_experts:  # the builder has no shared-expert option; MoE.Config takes one
            for layer in layers:
                layer.moe.shared_experts = make_ffn_config(
                    dim=cfg.dim, hidden_dim=cfg.moe_hidden, w1_param_init=init, w2w3_param_init=init
                )
        model_cls = Qwen3Model
        embed_std = 0.02
    else:
        from torchtitan.models.deepseek_v3 import DeepSeekV3Model, _build_dsv3_layers

        layers = _build_dsv3_layers(
            n_layers=cfg.n_layers,
            n_dense_layers=cfg.n_dense_layers,
            dim=cfg.dim,
            n_heads=cfg.n_heads,
            q_lora_rank=0,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            mscale=0.70,
            dense_hidden_dim=2 * cfg.dim,
            moe_hidden_dim=cfg.moe_hidden,
            num_experts=cfg.n_experts,
            num_shared_experts=1 if cfg.shared_experts else 0,
            router_top_k=cfg.top_k,
            router_score_func="softmax",
            attn_backend="flex",
            moe_comm_backend="standard",
            non_blocking_capacity_factor=None,
            rope=ComplexRoPE.Config(dim=8, max_seq_len=64, theta=10000.0),
        )
        model_cls = DeepSeekV3Model
        embed_std = 1.0
    if cfg.device == "cpu":  # FlexAttention has no backward on CPU
        for layer in layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return model_cls.Config(
        vocab_size=cfg.vocab_size,
        dim=cfg.dim,
        layers=layers,
        tok_embeddings=Embedding.Config(
            num_embeddings=cfg.vocab_size,
            embedding_dim=cfg.dim,
            param_init={"weight": partial(nn.init.normal_, std=embed_std)},
        ),
        norm=RMSNorm.Config(normalized_shape=cfg.dim, eps=1e-6, param_init={"weight": nn.init.ones_}),
        lm_head=Linear.Config(in_features=cfg.dim, out_features=cfg.vocab_size, param_init=init),
    )


def build(cfg: TorchtitanConfig, *, ep: int = 1) -> nn.Module:
    """torchtitan's own model for `cfg`, initialised by its `init_states` (same seed → identical weights; the
    global RNG is left as it was). `ep > 1`: with the sharding config expert parallel needs, set on the model
    config before the build as torchtitan's trainer does (through the family's own setter: its
    `update_from_config` imports the trainer, which needs torchdata)."""
    require()
    config = _model_config(cfg)
    if ep > 1:
        from torchtitan.config import ParallelismConfig

        if cfg.family == "qwen3_moe":
            from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config as set_sharding
        else:
            from torchtitan.models.deepseek_v3.sharding import set_deepseek_v3_sharding_config as set_sharding
        set_sharding(config, enable_sp=ParallelismConfig().enable_sequence_parallel, enable_ep=True)
    with torch.random.fork_rng(devices=[]):
        with torch.device(cfg.device):
            model = config.build()
        torch.manual_seed(cfg.seed)
        model.init_states(buffer_device=torch.device(cfg.device))
    model = model.to(dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype])
    model.train()
    return model


def make_batch(cfg: TorchtitanConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """`(tokens, labels)`, both [B, S] int64, deterministic for the seed."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len + 1), generator=g).to(cfg.device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def loss_fn(cfg: TorchtitanConfig) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """torchtitan's `CrossEntropyLoss` (a sum over tokens), divided by the number of tokens as its trainer does."""
    from torchtitan.components.loss import CrossEntropyLoss

    ce = CrossEntropyLoss(CrossEntropyLoss.Config())
    tokens = torch.tensor(cfg.batch * cfg.seq_len)

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ce(logits, labels, global_valid_tokens=tokens)[0]

    return loss


def apply_ac(model: nn.Module, mode: str) -> None:
    """torchtitan's own `FullAC` / `SelectiveAC` (`mode` "full" / "selective_op"), as `parallelize_*` applies them."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    check_choice("torchtitan AC", "mode", mode, ("none", "full", "selective_op"))
    if mode == "full":
        FullAC.Config().build().apply(model)
    elif mode == "selective_op":
        SelectiveAC.Config().build().apply(model)


def apply_compile(model: nn.Module, backend: Any) -> None:
    """torchtitan's own `apply_compile`: each block compiled whole in place with `fullgraph=True`."""
    from torchtitan.config import CompileConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.compile import apply_compile as titan_compile

    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1)
    titan_compile(
        model, compile_config=CompileConfig(enable=True, components=["model"], backend=backend), parallel_dims=dims
    )


def apply_fsdp(model: nn.Module) -> None:
    """torchtitan's own `apply_fsdp_to_decoder` on a CPU mesh over the default process group (gloo); with more
    than one rank, gradients are reduced by sum (gloo has no PREMUL_SUM)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    device = "cuda" if next(model.parameters()).is_cuda else "cpu"
    mesh = init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    dtype = next(model.parameters()).dtype
    apply_fsdp_to_decoder(model, mesh, param_dtype=dtype, reduce_dtype=torch.float32, pp_enabled=False)
    if dist.get_world_size() > 1:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)


SPMD_BACKEND = "partial_dtensor"
"""The SPMD backend the toolkit runs torchtitan's parallelize with: its default, "spmd_types", fails FSDP2 at two
ranks ("all parameters must be DTensors on the full SPMD mesh")."""


@contextlib.contextmanager
def parallel_state() -> Iterator[None]:
    """The module globals torchtitan's `parallelize_*` reads, set for CPU for the duration and then put back:
    meshes on "cpu" (torchtitan's `device_type` is "cuda" wherever torch sees no accelerator) and the
    "partial_dtensor" SPMD backend (the token dispatcher reads it in every forward, so it stays set for the step)."""
    import torchtitan.distributed.parallel_dims as tpd
    import torchtitan.distributed.utils as tdu

    device, backend = tpd.device_type, tdu.get_spmd_backend()
    tpd.device_type = "cuda" if torch.cuda.is_available() else "cpu"
    tdu.set_spmd_backend(SPMD_BACKEND)
    try:
        yield
    finally:
        tpd.device_type = device
        tdu.set_spmd_backend(backend)


def parallelize_ep(
    model: nn.Module, family: Family, *, ep: int, ac: str = "none", compile_backend: Any = None
) -> nn.Module:
    """torchtitan's own `parallelize_qwen3` / `parallelize_deepseekv3` with expert parallel over `ep` ranks of
    the default process group (the rest of the world data-parallel): EP by `Module.parallelize` from the
    sharding config (`build(cfg, ep=ep)`), then its AC, compile and FSDP2, in its order. Call it inside
    `parallel_state()`; gradients are reduced by sum (gloo has no PREMUL_SUM)."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    check_choice("torchtitan AC", "mode", ac, ("none", "full", "selective_op"))
    if family == "qwen3_moe":
        from torchtitan.models.qwen3 import parallelize_qwen3 as parallelize_family
    else:
        from torchtitan.models.deepseek_v3 import parallelize_deepseekv3 as parallelize_family
    world = dist.get_world_size()
    dims = ParallelDims(
        dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=ep, world_size=world, spmd_backend=SPMD_BACKEND
    )
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[next(model.parameters()).dtype]
    ac_config = {"none": None, "full": FullAC.Config(), "selective_op": SelectiveAC.Config()}[ac]
    with tempfile.TemporaryDirectory(prefix="toolkit-titan-") as dump:
        parallelize_family(
            model,
            parallel_dims=dims,
            training=TrainingConfig(mixed_precision_param=dtype),
            parallelism=ParallelismConfig(expert_parallel_degree=ep, spmd_backend=SPMD_BACKEND),
            compile_config=CompileConfig(
                enable=compile_backend is not None, components=["model"], backend=compile_backend or "aot_eager"
            ),
            ac_config=ac_config,
            dump_folder=dump,
        )
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    return model


def parallelize(model: nn.Module, *, ac: str = "none", compile_backend: Any = None, fsdp: bool = False) -> nn.Module:
    """torchtitan's transforms in `parallelize_qwen3`'s order: AC → compile → FSDP (no TP / EP / PP here)."""
    apply_ac(model, ac)
    if compile_backend is not None:
        apply_compile(model, compile_backend)
    if fsdp:
        apply_fsdp(model)
    return model


class TorchtitanStack:
    """torchtitan 0.3.0 behind the `Stack` interface: its own model, loss, `FullAC` / `SelectiveAC`, `apply_compile`
    and `apply_fsdp_to_decoder` (or, with `ep > 1`, its whole `parallelize_*`), in its order."""

    name = "torchtitan"
    config_type = TorchtitanConfig
    config_field = "torchtitan"

    def available(self) -> bool:
        return available()

    def require(self, owner: str, field: str) -> None:
        require(owner, field)

    def release(self) -> None:
        return None  # `require` accepts 0.3.0 only

    def check(self, scenario: Any) -> None:
        own = "Scenario"
        if scenario.torchtitan is not None and not isinstance(scenario.torchtitan, TorchtitanConfig):
            raise ConfigError(
                own,
                "torchtitan",
                f"is a {type(scenario.torchtitan).__name__}, not a TorchtitanConfig.",
                "pass toolkit.stacks.torchtitan.TorchtitanConfig(...).",
            )
        if scenario.ep > 1 and scenario.fsdp != "blocks":
            raise ConfigError(
                own,
                "ep",
                "torchtitan's parallelize applies FSDP2 together with expert parallel.",
                "pass fsdp='blocks' with ep > 1.",
            )
        if scenario.device is not None or scenario.seed is not None or not _default_model(scenario.model):
            raise ConfigError(
                own,
                "model",
                "stack='torchtitan' builds torchtitan's own model, so the toolkit's "
                "ModelConfig / device / seed would be ignored.",
                "set them on torchtitan=TorchtitanConfig(...).",
            )
        if scenario.recipe is not None:
            raise ConfigError(
                own,
                "recipe",
                "a recipe is the toolkit's rebuild of torchtitan's transforms; with "
                "stack='torchtitan' its own code applies them.",
                "pass ac=ACConfig.of(mode=...) and compile=CompileConfig(scope='blocks', fullgraph=True).",
            )
        ac = scenario.ac
        if ac.mode not in ("none", "full", "selective_op") or ac != ACConfig.of(mode=ac.mode):
            raise ConfigError(
                own,
                "ac",
                "torchtitan 0.3.0's AC is FullAC ('full') or SelectiveAC ('selective_op') with "
                "its own defaults (torch_remat arrived on main after the release, PR #4497).",
                "pass ACConfig.of(mode='none' | 'full' | 'selective_op') only; for torchtitan main's "
                "remat use stack='toolkit' with ACConfig.of(mode='remat') or recipe='torchtitan_main'.",
            )
        c = scenario.compile
        if c.enabled and (
            c.scope != "blocks"
            or not c.fullgraph
            or c.replace(backend="aot_eager") != CompileConfig(scope="blocks", fullgraph=True)
        ):
            raise ConfigError(
                own,
                "compile",
                "torchtitan's apply_compile compiles each block whole with fullgraph=True; only the backend is yours.",
                "pass CompileConfig(scope='blocks', fullgraph=True, backend=...).",
            )
        if scenario.fsdp == "blocks+experts":
            raise ConfigError(
                own,
                "fsdp",
                "torchtitan 0.3.0 shards the experts inside each block's unit.",
                "use fsdp='blocks' (its apply_fsdp_to_decoder) or stack='toolkit'.",
            )
        cfg = scenario.torchtitan_config
        if cfg.n_experts % scenario.ep:
            raise ConfigError(
                own,
                "ep",
                f"{cfg.n_experts} routed experts do not split over ep={scenario.ep} ranks.",
                f"pick ep dividing {cfg.n_experts}, or set TorchtitanConfig(n_experts=...).",
            )
        require()

    def step_context(self, scenario: Any) -> contextlib.AbstractContextManager[None]:
        """Expert parallel runs torchtitan's `parallelize_*`, which reads module globals set for CPU here."""
        return parallel_state() if scenario.ep > 1 else contextlib.nullcontext()

    def build(self, scenario: Any, *, sharded: bool) -> Built:
        cfg = scenario.torchtitan_config
        tokens, labels = make_batch(cfg)
        loss = loss_fn(cfg)
        model = build(cfg, ep=scenario.ep if sharded else 1)
        return Built(
            model,
            tokens,
            lambda m: m(tokens),
            lambda logits: loss(logits, labels),
            torch.device(cfg.device),
            next(model.parameters()).dtype,
            cfg.seed + 2,
        )

    def transform(self, scenario: Any, model: nn.Module, stage: Callable[[str], None]) -> dict[str, str]:
        n = len(list(cast(nn.Module, model.layers).children()))  # torchtitan's ModuleDict of blocks
        orders = (
            {f"layers.{i}": "compile(AC(x))" for i in range(n)}
            if scenario.compile.enabled and scenario.ac.mode != "none"
            else {}
        )
        backend = scenario.compile.backend if scenario.compile.enabled else None
        if scenario.ep > 1:  # its parallelize_*: EP, then AC, compile and FSDP2
            stage("parallelize")
            parallelize_ep(
                model, scenario.torchtitan_config.family, ep=scenario.ep, ac=scenario.ac.mode, compile_backend=backend
            )
            return orders
        stage("ac")
        apply_ac(model, scenario.ac.mode)
        stage("compile")
        if backend is not None:
            apply_compile(model, backend)
        if scenario.fsdp != "none":
            apply_fsdp(model)
        return orders

    def called(self, model: nn.Module) -> nn.Module:
        return model  # its compiles sit inside the model (in place, or a wrapper in the module's slot)

    def applied(self, model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What torchtitan's own code left on the model (it keeps no record of its own): the modules its `apply_ac`
        put in a CheckpointWrapper, and the compile targets, by canonical name. The Report checks that each of the
        former ran under its checkpoint (`Transforms.left_unwrapped`)."""
        named = list(model.named_modules())
        ckpt = tuple(dict.fromkeys(canonical_name(n) for n, m in named if is_checkpoint_wrapper(m)))
        compiled = tuple(dict.fromkeys(canonical_name(n) or "<model>" for n, m in named if is_compiled(m)))
        return ckpt, compiled

    def undo(self, model: nn.Module) -> None:
        return None  # its transforms have no undo; the model is discarded after the step

    def label(self, scenario: Any) -> str:
        fsdp = f" | FSDP {scenario.fsdp}" if scenario.fsdp != "none" else ""
        fsdp += f" | EP {scenario.ep}" if scenario.ep > 1 else ""
        c = scenario.compile
        comp = "eager" if not c.enabled else f"compile blocks ({c.backend_name}, fullgraph)"
        return f"{scenario.torchtitan_config.label} | AC {scenario.ac.mode} | {comp}{fsdp}"

    def draws_random(self, config: TorchtitanConfig) -> bool:
        return False  # its tiny models have no dropout and no router noise

    def blocks(self, model: nn.Module) -> list[str]:
        return [f"layers.{key}" for key, _ in cast(nn.Module, model.layers).named_children()]  # its ModuleDict


def _default_model(model: Any) -> bool:
    from ..models import ModelConfig

    return isinstance(model, ModelConfig) and model == ModelConfig()


STACK: Stack = TorchtitanStack()

__all__ = [
    "FAMILIES",
    "RELEASE",
    "TorchtitanConfig",
    "available",
    "require",
    "build",
    "make_batch",
    "loss_fn",
    "apply_ac",
    "apply_compile",
    "apply_fsdp",
    "parallelize",
    "parallel_state",
    "parallelize_ep",
]

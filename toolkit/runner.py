"""`Scenario` → `run()` → `Report`: one measured training step (saved, recompute, compile, memory, numerics, timing), optionally in a subprocess."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ._config import ConfigError
from .ac import ACConfig, apply_ac
from .compile import CompileConfig, apply_compile, check_ac_compile
from .models import ModelConfig, build_model, loss_fn as model_loss_fn, make_batch
from .naming import canonical_name
from .probes import Probes
from .report import CompileInfo, ErrorInfo, GraphBreak, Memory, Numerics, Recompute, Report, Saved, SavedTensor, Timing
from .state import applied, torch_settings


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Everything needed to rebuild and measure one training step."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to build."""
    ac: ACConfig = field(default_factory=ACConfig)
    """Activation checkpointing to apply (ignored when `recipe` is set)."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """What to compile (ignored when `recipe` is set)."""
    recipe: str | None = None
    """A name from `toolkit.RECIPES`, applied instead of `ac` + `compile`."""
    recipe_backend: str = "aot_eager"
    """Compile backend the recipe uses."""
    name: str = ""
    """A label shown in reports and tables."""
    device: str | None = None
    """Overrides `model.device` when set."""
    seed: int | None = None
    """Overrides `model.seed` when set."""
    check_numerics: bool = True
    """Compare loss and gradients with the same model run eagerly without AC."""
    measure_memory: bool = True
    """Run one extra step to measure peak memory (profiler replay on CPU, allocator stats on CUDA)."""
    steady_steps: int = 2
    """Extra un-instrumented steps timed for the steady-state step time (0 skips them)."""
    memory_snapshot: str | None = None
    """CUDA only: write an allocator snapshot (for PyTorch's memory viewer) to this path."""

    def __post_init__(self) -> None:
        from .compile import BACKENDS
        from .recipes import RECIPES

        own = "Scenario"
        for name, cls in (("model", ModelConfig), ("ac", ACConfig), ("compile", CompileConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(own, name, f"is a {type(getattr(self, name)).__name__}, not a {cls.__name__}.",
                                  f"pass {cls.__name__}(...).")
        if self.recipe is not None:
            if self.recipe not in RECIPES:
                raise ConfigError(own, "recipe", f"{self.recipe!r} is not a recipe.", f"use one of {', '.join(RECIPES)}.")
            if self.ac != ACConfig() or self.compile != CompileConfig():
                raise ConfigError(own, "recipe", "a recipe applies its own AC and compile, but ac/compile were set too.",
                                  "drop ac/compile, or drop recipe.")
            if self.recipe_backend not in BACKENDS:
                raise ConfigError(own, "recipe_backend", f"{self.recipe_backend!r} is not a backend.",
                                  f"use one of {', '.join(BACKENDS)}.")
        check_ac_compile(self.ac, self.compile)
        if not isinstance(self.steady_steps, int) or self.steady_steps < 0:
            raise ConfigError(own, "steady_steps", f"{self.steady_steps!r} is not an int >= 0.", "pass e.g. 2.")
        self.model_config  # validates device/seed overrides

    @property
    def model_config(self) -> ModelConfig:
        changes = {}
        if self.device is not None:
            changes["device"] = self.device
        if self.seed is not None:
            changes["seed"] = self.seed
        return self.model.replace(**changes) if changes else self.model

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.recipe:
            return f"recipe {self.recipe}"
        c = self.compile
        comp = "eager" if not c.enabled else f"compile {c.scope if isinstance(c.scope, str) else ','.join(c.scope)} ({c.backend_name}{', fullgraph' if c.fullgraph else ''})"
        return f"{self.model.experts_impl if self.model.has_moe else 'dense'} | AC {self.ac.mode} | {comp}"

    def replace(self, **changes) -> "Scenario":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(), "ac": self.ac.to_dict(), "compile": self.compile.to_dict(),
            "recipe": self.recipe, "recipe_backend": self.recipe_backend, "name": self.name, "device": self.device,
            "seed": self.seed, "check_numerics": self.check_numerics, "measure_memory": self.measure_memory,
            "steady_steps": self.steady_steps, "memory_snapshot": self.memory_snapshot,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Scenario":
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError("Scenario", unknown[0], "is not a field of Scenario.", f"use one of {', '.join(sorted(known))}.")
        if "model" in data:
            data["model"] = ModelConfig.from_dict(data["model"])
        if "ac" in data:
            data["ac"] = ACConfig.from_dict(data["ac"])
        if "compile" in data:
            data["compile"] = CompileConfig.from_dict(data["compile"])
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Scenario":
        return cls.from_dict(json.loads(text))


def check_structure(scenario: Scenario) -> None:
    """Raise ConfigError for what only the model's structure can tell (a scope the model lacks, an order the
    wrappers cannot give) — by building a 2-block model and applying the transforms, without running anything."""
    if scenario.recipe:
        return
    from .recipes import prepare, reset

    model = build_model(scenario.model_config.replace(n_layers=min(2, scenario.model.n_layers), device="cpu"))
    prepare(model, ac=scenario.ac, compile=scenario.compile)
    reset(model, dynamo=False)


# --- helpers --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_fd2() -> Iterator[None]:
    """Silence writes to file descriptor 2 (kineto prints `USDT: ... profiler_start` there, past Python)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _LogCapture(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record):
        try:
            self.sink.append(f"{record.name}: {record.getMessage().strip()}")
        except Exception:
            pass


@contextlib.contextmanager
def capture_warnings(sink: list[str]) -> Iterator[None]:
    """Python warnings and torch's logger warnings go into `sink` instead of the notebook's stderr."""
    logger = logging.getLogger("torch")
    handler = _LogCapture(sink)
    old_propagate = logger.propagate
    old_handlers = list(logger.handlers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for h in old_handlers:
            logger.removeHandler(h)
        logger.addHandler(handler)
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(handler)
            for h in old_handlers:
                logger.addHandler(h)
            logger.propagate = old_propagate
            for w in caught:
                sink.append(f"{w.category.__name__}: {str(w.message).strip()}")


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {canonical_name(n): p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def _numerics(loss: float, grads: dict, ref_loss: float | None, ref_grads: dict | None, dtype: torch.dtype) -> Numerics:
    if ref_grads is None:
        return Numerics(loss=loss)
    rtol, atol = (1e-4, 1e-5) if dtype == torch.float32 else (5e-2, 5e-2)
    worst, worst_diff, ok = "", 0.0, True
    for name, ref in ref_grads.items():
        g = grads.get(name)
        if g is None:
            ok = False
            continue
        diff = (g - ref).abs()
        d = diff.max().item() if diff.numel() else 0.0
        if d > worst_diff or not worst:
            worst, worst_diff = name, d
        if not bool((diff <= atol + rtol * ref.abs()).all()):
            ok = False
    missing = tuple(sorted(set(ref_grads) - set(grads)))
    loss_diff = abs(loss - ref_loss)
    ok = ok and loss_diff <= atol + rtol * abs(ref_loss)
    return Numerics(loss=loss, reference_loss=ref_loss, loss_diff=loss_diff, max_grad_diff=worst_diff,
                    worst_param=worst, grads_match=ok and not missing, missing_grads=missing)


def _saved(rows: list[dict], params_bytes: int) -> Saved:
    tensors = tuple(SavedTensor(module=r["module"], op=r["op"], shape=tuple(r["shape"]), dtype=r["dtype"],
                                bytes=int(r["bytes"]), kind=r["kind"], is_input=bool(r.get("is_input"))) for r in rows)
    by_module, by_op, by_kind = {}, {}, {}
    for t in tensors:
        by_module[t.module] = by_module.get(t.module, 0) + t.bytes
        by_op[t.op] = by_op.get(t.op, 0) + t.bytes
        by_kind[t.kind] = by_kind.get(t.kind, 0) + t.bytes
    return Saved(tensors=tensors, total_bytes=sum(t.bytes for t in tensors), by_module=by_module, by_op=by_op,
                 by_kind=by_kind, params_bytes=params_bytes)


def _cpu_memory_step(step: Callable[[Callable[[], None]], None]) -> tuple[int, int]:
    """Peak and held-after-forward bytes above the start, from the profiler's allocation events replayed.

    Frees of blocks allocated before the window (garbage of an earlier step collected now) are ignored by
    matching each free to an allocation of the same pointer inside the window.
    """
    import gc

    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    def mark():
        with record_function("toolkit::forward_end"):
            pass

    gc.collect()
    with quiet_fd2(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step(mark)
    allocs, marks = [], []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu":
                allocs.append((node.start_time_ns, f.ptr, f.alloc_size))
        elif node.name == "toolkit::forward_end":
            marks.append(node.start_time_ns)
        stack.extend(node.children)
    allocs.sort()
    live: dict[int, int] = {}
    cum = peak = 0
    held = None
    for t, ptr, size in allocs:
        if held is None and marks and t >= marks[0]:
            held = cum
        if size > 0:
            live[ptr] = size
            cum += size
        elif ptr in live:
            cum -= live.pop(ptr)
        peak = max(peak, cum)
    return peak, held if held is not None else cum


def _cuda_memory_step(step, device, snapshot_path: str | None) -> tuple[int, int]:
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = {}

    def mark():
        torch.cuda.synchronize(device)
        held["v"] = torch.cuda.memory_allocated(device) - start

    if snapshot_path:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        step(mark)
        torch.cuda.synchronize(device)
        if snapshot_path:
            torch.cuda.memory._dump_snapshot(snapshot_path)
    finally:
        if snapshot_path:
            torch.cuda.memory._record_memory_history(enabled=None)
    return torch.cuda.max_memory_allocated(device) - start, held.get("v", 0)


def environment() -> dict[str, Any]:
    import platform

    env = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(terse=True),
           "cpu": platform.processor() or platform.machine(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


# --- the measured step ----------------------------------------------------------------------------------


class _Stage:
    def __init__(self, on_change: Callable[[str], None] | None = None):
        self.name = "build"
        self.on_change = on_change

    def __call__(self, name: str) -> None:
        self.name = name
        if self.on_change:
            self.on_change(name)


def _measure_steps(model: nn.Module, inputs: tuple, forward: Callable, loss_of: Callable, device: torch.device,
                   stage: _Stage, scenario: Scenario | None, seed: int | None = None) -> dict[str, Any]:
    """Step 1 with probes (compile happens here), then a memory step and bare steady steps."""
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {}
    probes = Probes(model, inputs)
    t0 = time.perf_counter()
    with torch_settings(model), probes.active():
        stage("forward")
        if seed is not None:
            torch.manual_seed(seed)  # the same RNG stream as the reference run (router noise, dropout)
        with probes.phase_scope("forward"):
            result = forward(*inputs)
        t_fwd = time.perf_counter()
        rows, params_bytes = probes.census(exclude=(result,))
        loss = loss_of(result)
        del result
        stage("backward")
        t_bwd = time.perf_counter()
        with probes.phase_scope("backward"):
            loss.backward()
    out["first_step_s"] = time.perf_counter() - t0
    out["first_forward_s"], out["first_backward_s"] = t_fwd - t0, time.perf_counter() - t_bwd
    out["loss"] = float(loss.detach().float())
    out["grads"] = _grads(model)
    out["rows"], out["params_bytes"] = rows, params_bytes
    out["probe"] = probes.collect()
    out["graphs"] = int(counters["stats"]["unique_graphs"])
    out["graph_breaks"] = int(sum(counters["graph_break"].values()))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def bare_step(mark=lambda: None, times=None):
        model.zero_grad(set_to_none=True)
        with torch_settings(model):
            t = time.perf_counter()
            res = forward(*inputs)
            sync()
            t_f = time.perf_counter()
            # The output is alive at the mark because we hold it; subtract it unless backward needs it too.
            output_saved = any(r.get("is_output") for r in out.get("rows", ()))
            extra = res.untyped_storage().nbytes() if isinstance(res, torch.Tensor) and not output_saved else 0
            mark()
            out.setdefault("output_bytes", extra)
            l = loss_of(res)
            del res
            t_b = time.perf_counter()
            l.backward()
            sync()
            if times is not None:
                times.append((t_f - t, time.perf_counter() - t_b, time.perf_counter() - t))

    if scenario is None or scenario.measure_memory:
        stage("measure")
        if device.type == "cuda":
            peak, held = _cuda_memory_step(bare_step, device, scenario.memory_snapshot if scenario else None)
            out["memory"] = Memory(device=str(device), peak_bytes=int(peak),
                                   held_after_forward_bytes=int(held - out.get("output_bytes", 0)),
                                   method="cuda caching allocator (max_memory_allocated)",
                                   snapshot_path=scenario.memory_snapshot if scenario else None)
        else:
            peak, held = _cpu_memory_step(bare_step)
            out["memory"] = Memory(device=str(device), peak_bytes=int(peak),
                                   held_after_forward_bytes=int(held - out.get("output_bytes", 0)),
                                   method="profiler allocation events replayed")
    steady: list[tuple[float, float, float]] = []
    for _ in range(scenario.steady_steps if scenario is not None else 2):
        bare_step(times=steady)
    for i, name in enumerate(("steady_forward_s", "steady_backward_s", "steady_step_s")):
        out[name] = statistics.median(t[i] for t in steady) if steady else 0.0
    out["graphs_after"] = int(counters["stats"]["unique_graphs"])
    return out


def _assemble(scenario_dict: dict, stage: _Stage, steps: dict | None, err: BaseException | None, warn: list[str],
              timing: dict, requested: bool, orders: dict, numerics: Numerics | None) -> Report:
    error = None
    if err is not None:
        msg = str(err).strip() or repr(err)
        error = ErrorInfo(type=f"{type(err).__module__}.{type(err).__qualname__}".replace("builtins.", ""),
                          message=msg[:4000], stage=stage.name)
    saved, recompute, comp, memory = Saved(), Recompute(), CompileInfo(requested=requested, orders=orders), Memory()
    if steps is not None:
        if "rows" in steps:
            saved = _saved(steps["rows"], steps["params_bytes"])
        p = steps.get("probe")
        if p is not None:
            recompute = Recompute(ops=sum(p.recompute_by_op.values()), by_op=dict(sorted(p.recompute_by_op.items())),
                                  by_module=dict(sorted(p.recompute_by_module.items())),
                                  compiled_reruns=dict(sorted(p.compiled_reruns.items())),
                                  in_compiled_backward=int(p.in_compiled_backward))
            breaks = tuple(GraphBreak(reason=r, file=f, line=ln) for r, f, ln in p.breaks)
            without = tuple(p.regions_without_graphs) if requested else ()
            comp = CompileInfo(requested=requested, graphs=steps.get("graphs_after", steps.get("graphs", 0)),
                               graph_breaks=steps.get("graph_breaks", 0), breaks=breaks,
                               recompiles=tuple(p.recompiles),
                               fell_back_to_eager=bool(requested and (without or steps.get("graphs", 0) == 0)),
                               regions_without_graphs=without, orders=orders)
        memory = steps.get("memory", Memory())
    return Report(
        outcome="ok" if err is None else "error", error=error, warnings=tuple(dict.fromkeys(warn)),
        scenario=scenario_dict, environment=environment(), saved=saved, recompute=recompute, compile=comp,
        memory=memory, numerics=numerics or Numerics(),
        timing=Timing(build_s=round(timing.get("build_s", 0.0), 4), apply_s=round(timing.get("apply_s", 0.0), 4),
                      compile_s=round(steps["probe"].compile_s, 4) if steps and "probe" in steps else 0.0,
                      **{k: round((steps or {}).get(k, 0.0), 4) for k in (
                          "first_step_s", "first_forward_s", "first_backward_s", "steady_step_s", "steady_forward_s",
                          "steady_backward_s")}),
    )


@contextlib.contextmanager
def _restoring_global_state() -> Iterator[None]:
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from .state import _lru_enabled, set_dynamo_lru_cache

    saved = [(mod, mod.save_config()) for mod in (torch._dynamo.config, functorch_config, inductor_config)]
    lru = _lru_enabled
    rng = torch.random.get_rng_state()
    try:
        yield
    finally:
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # load_config warns about deprecated keys it sets back
            for mod, blob in saved:
                mod.load_config(blob)
        set_dynamo_lru_cache(lru)
        torch.random.set_rng_state(rng)


def run(scenario: Scenario, *, isolate: bool = False, timeout_s: float | None = None,
        on_stage: Callable[[str], None] | None = None, threads: int | None = None) -> Report:
    """Build, transform and measure one training step. Errors come back as a Report, never as an exception
    (except an invalid Scenario, which fails when it is constructed). `isolate=True` runs it in a subprocess
    so a segfault, abort or hang comes back as `crashed` / `timeout`; `threads` caps its intra-op threads
    (several isolated runs side by side must share the cores, or OpenMP oversubscription slows each 10x)."""
    if not isinstance(scenario, Scenario):
        raise TypeError(f"run() needs a Scenario, got {type(scenario).__name__}")
    if isolate:
        return _run_isolated(scenario, timeout_s, on_stage, threads)
    from .recipes import apply_recipe, reset

    stage = _Stage(on_stage)
    warn: list[str] = []
    timing: dict[str, float] = {}
    steps = None
    err = None
    orders: dict[str, str] = {}
    numerics = None
    sdict = {**scenario.to_dict(), "name": scenario.label}
    requested = scenario.recipe is not None or scenario.compile.enabled
    model = None
    with _restoring_global_state(), capture_warnings(warn):
        try:
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            stage("build")
            t = time.perf_counter()
            cfg = scenario.model_config
            model = build_model(cfg)
            batch = make_batch(cfg)
            timing["build_s"] = time.perf_counter() - t
            ref_loss = ref_grads = None
            if scenario.check_numerics:
                ref = build_model(cfg)
                ref.zero_grad(set_to_none=True)
                torch.manual_seed(cfg.seed + 2)
                l = model_loss_fn(ref(batch.tokens), batch.labels)
                l.backward()
                ref_loss, ref_grads = float(l.detach().float()), _grads(ref)
                del ref, l
            t = time.perf_counter()
            if scenario.recipe is not None:
                stage("compile")
                apply_recipe(model, scenario.recipe, backend=scenario.recipe_backend)
            else:
                stage("ac")
                apply_ac(model, scenario.ac)
                stage("compile")
                apply_compile(model, scenario.compile)
            timing["apply_s"] = time.perf_counter() - t
            orders = dict(applied(model).compile_orders)
            steps = {}
            steps = _measure_steps(model, (batch.tokens,), model, lambda logits: model_loss_fn(logits, batch.labels),
                                   torch.device(cfg.device), stage, scenario, seed=cfg.seed + 2)
            numerics = _numerics(steps["loss"], steps["grads"], ref_loss, ref_grads, cfg.torch_dtype)
        except Exception as e:  # the scenario failing is a result
            err = e
            if steps is not None and "loss" in steps:
                numerics = Numerics(loss=steps["loss"])
        finally:
            if model is not None:
                with contextlib.suppress(Exception):
                    reset(model, dynamo=False)
    return _assemble(sdict, stage, steps, err, warn, timing, requested, orders, numerics)


def measure(module_or_fn: nn.Module | Callable, *example_inputs: Any, loss_fn: Callable | None = None,
            name: str = "") -> Report:
    """Measure one training step of any module or callable exactly as given (your own AC / compile included).

    `loss_fn(output)` makes the scalar to differentiate; by default a scalar output is used as is and any other
    output `o` becomes `o.float().square().mean()` (a dense gradient, unlike `sum()`). Saved tensors are
    counted at the end of the forward, before the loss, so the loss's own saved tensors are not included.
    """
    model = module_or_fn if isinstance(module_or_fn, nn.Module) else nn.Module()
    forward = module_or_fn
    if loss_fn is None:
        def loss_fn(out):
            out = out[0] if isinstance(out, (tuple, list)) else out
            return out if out.dim() == 0 else out.float().square().mean()
    stage = _Stage()
    warn: list[str] = []
    steps = None
    err = None
    device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    requested = any(getattr(m, "_compiled_call_impl", None) is not None or type(m).__name__ == "OptimizedModule"
                    for m in model.modules()) or hasattr(forward, "_torchdynamo_orig_callable")
    with _restoring_global_state(), capture_warnings(warn):
        try:
            torch._dynamo.utils.counters.clear()
            steps = {}
            steps = _measure_steps(model, tuple(example_inputs), forward, loss_fn, device, stage, None)
        except Exception as e:
            err = e
    numerics = Numerics(loss=steps["loss"]) if steps and "loss" in steps else None
    return _assemble({"name": name or type(module_or_fn).__name__, "measured": "user module"}, stage, steps, err,
                     warn, {}, requested, {}, numerics)


# --- isolation ------------------------------------------------------------------------------------------


def _run_isolated(scenario: Scenario, timeout_s: float | None, on_stage, threads: int | None = None) -> Report:
    sdict = {**scenario.to_dict(), "name": scenario.label}
    with tempfile.TemporaryDirectory(prefix="toolkit-run-") as tmp:
        spec, out, stage_file = (os.path.join(tmp, n) for n in ("scenario.json", "report.json", "stage"))
        with open(spec, "w") as f:
            f.write(scenario.to_json())
        cmd = [sys.executable, "-m", "toolkit._worker", spec, out, stage_file]
        t0 = time.perf_counter()
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOOLKIT_THREADS=str(threads),
                       TORCHINDUCTOR_COMPILE_THREADS=str(threads))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Report(outcome="timeout", scenario=sdict, environment=environment(),
                          error=ErrorInfo("Timeout", f"no result after {timeout_s:g} s", _read(stage_file)),
                          timing=Timing(first_step_s=round(time.perf_counter() - t0, 2)))
        if proc.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                return Report.from_json(f.read())
        rc = proc.returncode
        why = f"killed by {signal.Signals(-rc).name} ({rc})" if rc < 0 else f"exited with status {rc}"
        tail = (stderr or b"").decode(errors="replace").strip().splitlines()[-5:]
        return Report(outcome="crashed", scenario=sdict, environment=environment(),
                      error=ErrorInfo("Crash", why + ("; stderr: " + " | ".join(tail) if tail else ""), _read(stage_file)))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip() or "build"
    except OSError:
        return "build"


__all__ = ["Scenario", "run", "measure"]

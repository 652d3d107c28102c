"""A stack's compile path wraps checkpoints in its own loop, which skips a module: AC is off there only under compile.

Symptom (NVIDIA-NeMo/Automodel#3213, 2026-07): with `enable_compile: true`, Qwen3.6's 48 GatedDeltaNet mixers
(`linear_attn`) were not activation-checkpointed, because the compile path wrapped submodules in checkpoints from a
list of its own, which lacked `linear_attn`; the eager path's list had it. On 8 H100s the compiled run went out of
memory where the eager run took 40 GiB. Nothing raised or warned: the class is "AC asked for, a module left unwrapped".

Check: a two-layer model whose layers hold `attn` or `linear_attn` and an `mlp`. Two AC loops, as the stack had them:
the eager path wraps every mixer and MLP, the compile path forgets `linear_attn` and then compiles each layer
(`aot_eager`). Seen without reading the loops: how many `tag_activation_checkpoint` calls Dynamo put in each compiled
layer's graph (a counting backend), and the bytes the step packs for backward (a saved-tensors hook), against the
compile path given the eager path's list.

Verdict on the releases the toolkit runs: reproduced on 2.13.0, 2.14.1 and 2.15.0. It is the stack's code, not torch:
no release can fix it. The toolkit names such a module on the Report's first line (`module_left_unwrapped`) when it
is told what AC was asked for: `tk.measure(model, ..., checkpointed=(...))`, and for its own and transformers'
transforms by itself.

Fix: one list of what to checkpoint, read by both paths (Automodel#3213 added `linear_attn` to the compile path's).

Upstream: NVIDIA-NeMo/Automodel#3213 (merged).

Run: python c80_compile_path_ac_loop_skips_a_module.py

Shape suffixes: T tokens, D dim.
"""

import json

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

CASE = "C80"
NEEDS = "cpu"

D = 64
EAGER_PATH = ("attn", "linear_attn", "mlp")
COMPILE_PATH = ("attn", "mlp")  # the compile path's own list: `linear_attn` forgotten, as in Automodel before #3213


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_DD = nn.Linear(D, D)
        self.out_DD = nn.Linear(D, D)

    def forward(self, x_TD):
        return self.out_DD(torch.tanh(self.proj_DD(x_TD)))


class Layer(nn.Module):
    def __init__(self, linear: bool):
        super().__init__()
        if linear:
            self.linear_attn = Mixer()
        else:
            self.attn = Mixer()
        self.mlp = Mixer()

    def forward(self, x_TD):
        mixer = self.linear_attn if hasattr(self, "linear_attn") else self.attn
        x_TD = x_TD + mixer(x_TD)
        return x_TD + self.mlp(x_TD)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Layer(linear=False), Layer(linear=True))


def _wrap(model: nn.Module, names: tuple[str, ...]) -> list[str]:
    wrapped = []
    for i, layer in enumerate(model):
        for name in names:
            if hasattr(layer, name):
                setattr(layer, name, checkpoint_wrapper(getattr(layer, name)))
                wrapped.append(f"{i}.{name}")
    return wrapped


def _step(names: tuple[str, ...], compiled: bool) -> dict:
    torch._dynamo.reset()
    model = _model()
    wrapped = _wrap(model, names)
    hops = []

    def counting(gm, example_inputs):
        hop = torch.ops.higher_order.tag_activation_checkpoint
        hops.append(sum(n.op == "call_function" and n.target is hop for n in gm.graph.nodes))
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    if compiled:
        for layer in model:
            layer.compile(backend=counting)
    x_TD = torch.randn(32, D, requires_grad=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.nbytes) or t, lambda t: t):
        out = model(x_TD)
    out.square().mean().backward()
    return {"wrapped": wrapped, "saved_bytes": sum(packed), "checkpoints_per_graph": hops}


def bug() -> dict:
    """Each path with its own list, and the compile path with the eager path's list: per compiled layer, how many
    checkpoints Dynamo traced, and what the step packed for backward."""
    eager = _step(EAGER_PATH, compiled=False)
    compiled = _step(COMPILE_PATH, compiled=True)
    one_list = _step(EAGER_PATH, compiled=True)
    return {
        "eager_path": eager,
        "compile_path": compiled,
        "compile_path_one_list": one_list,
        # The second layer's graph holds one checkpoint fewer, and the step saves more, with nothing said.
        "unwrapped_only_under_compile": compiled["checkpoints_per_graph"][1] < one_list["checkpoints_per_graph"][1]
        and compiled["saved_bytes"] > one_list["saved_bytes"],
    }


def fix() -> dict:
    """One list read by both paths: every mixer is in the compiled graphs' checkpoints."""
    return {"compile_path": _step(EAGER_PATH, compiled=True)}


def user_models() -> dict:
    """The case as a user's training code holds it: the compile path's wrapping, each layer compiled, its input, and
    the modules the code meant to checkpoint (the eager path's list)."""
    model = _model()
    _wrap(model, COMPILE_PATH)
    for layer in model:
        layer.compile(backend="aot_eager")
    meant = [f"{i}.{name}" for i, layer in enumerate(model) for name in EAGER_PATH if hasattr(layer, name)]
    return {"C80": {"model": model, "inputs": (torch.randn(32, D, requires_grad=True),), "meant_checkpointed": meant}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))

"""Small helpers the tests share (kept out of conftest.py: notebooks/ has a conftest module of its own)."""


import toolkit as tk


def grads(model):
    return {tk.canonical_name(n): p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def graph_count():
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def break_count():
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))

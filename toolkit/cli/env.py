"""`python -m toolkit env`: this torch, every private torch API the toolkit relies on (available or not), and the
optional packages."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Rule

INERT: tuple[Rule, ...] = ()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "env", description="This torch, and every private torch API the toolkit relies on: available or not."
    )
    return p


def command(args: argparse.Namespace) -> int:
    from .. import compat
    from .._extras import available
    from ..execution import environment
    from ..stacks import extras, reason

    print("\n".join(f"{k}: {v}" for k, v in environment().items()))
    print(compat.table())
    print("\n".join(f"optional: {reason(m)}" for m in extras() if not available(m)) or "optional: all installed")
    return 0

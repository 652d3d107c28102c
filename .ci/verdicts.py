"""CI's one line on the catalogue's verdicts for the torch this stage ran: new release, agreement, or what changed.

The bug notebooks and the repro test no notebook covers (tests/test_bugs.py: between them every repro `cases --check
all` runs, each once) confirm each case on this torch and append a finding to $TOOLKIT_FINDINGS whenever the
catalogue has no verdict for it here, or a different one. So, after them:
- a release the catalogue has no verdicts for (the package index served a newer torch) is said in one line, with
  what this run found, and the stage passes: the catalogue is brought up to date by hand, from that line;
- on a release the catalogue knows, a finding that differs from its verdict is a verdict that changed (a fixed case
  that reproduces again, or a build that behaves otherwise): each is named, and the stage fails.

Usage (in the stage's venv): python .ci/verdicts.py STAGE
"""

from __future__ import annotations

import sys

import torch

from toolkit.analysis import catalogue


def main(stage: str, version: str | None = None) -> int:
    """Print the line; 0 unless a verdict changed on a release the catalogue knows. `version`: the running torch's
    by default."""
    version = version or torch.__version__
    release = catalogue.torch_release(version)
    cases = catalogue.cases()
    known = sorted({r for c in cases for r in c.verified}, key=lambda r: tuple(int(x) for x in r.split(".")))
    found = catalogue.findings()
    here = {case: verdicts[release] for case, verdicts in found.items() if release in verdicts}
    if not any(release in c.verified for c in cases):
        counts = {
            v: sorted((c for c, w in here.items() if w == v), key=lambda c: int(c[1:])) for v in set(here.values())
        }
        parts = [f"{len(ids)} {v}" + (f" ({', '.join(ids)})" if v != "reproduced" else "") for v, ids in counts.items()]
        print(
            f"{stage}: torch {version} is a release the catalogue has no verdicts for (it knows "
            f"{', '.join(known)}); this run found {', '.join(sorted(parts)) or 'nothing'}: add them as "
            f'"verified" entries in toolkit/analysis/catalogue.json'
        )
        return 0
    changed = [
        f"{c.id} {c.verified.get(release, 'no verdict')} -> {here[c.id]}"
        for c in cases
        if c.id in here
        and c.verified.get(release) != here[c.id]
        # "fixed" and "not reproduced" are both a run that did not show the signature
        and not (here[c.id] == "not reproduced" and c.verified.get(release) in ("fixed", "not reproduced"))
    ]
    if changed:
        print(f"{stage}: torch {version}: verdicts that changed from the catalogue's: {'; '.join(changed)}")
        return 1
    print(f"{stage}: torch {version}: every verdict this run checked agrees with the catalogue")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "verdicts"))

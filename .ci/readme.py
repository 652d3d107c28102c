"""README's two commands, read from README.md itself: `python3 .ci/readme.py install|test` prints one.

`.ci/run` runs what this prints, so a change to README's commands changes what CI runs; tests/test_packaging.py
checks that `.ci/run` does. Plain Python (no toolkit, no torch): it runs before anything is installed.
"""

import pathlib
import re
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def commands(text: str | None = None) -> dict[str, str]:
    """{"install": ..., "test": ...}: the first two ```bash blocks of README, in that order."""
    text = README.read_text() if text is None else text
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]
    if len(blocks) < 2:
        raise SystemExit("README.md must open with two ```bash blocks: the install command, then the test command")
    return {"install": blocks[0], "test": blocks[1]}


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("install", "test"):
        raise SystemExit("usage: python3 .ci/readme.py install|test")
    print(commands()[sys.argv[1]])

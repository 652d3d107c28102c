"""`python -m toolkit …`: the command line (see `toolkit.cli`)."""

import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while torch imports: stop as quietly as a running command does
    print("interrupted", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":
    raise SystemExit(main())

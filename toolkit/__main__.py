"""`python -m toolkit …`: the command line (see `toolkit.cli`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

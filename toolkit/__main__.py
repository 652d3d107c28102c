"""`python -m toolkit …` and the `toolkit` script: the command line (`toolkit.cli`), with its Ctrl-C handling."""


def main() -> int:
    # The entry point, not the package, owns the process's Ctrl-C: until `cli.main` hands it back to
    # KeyboardInterrupt, an interrupt (landing in the imports the command starts with) ends the process at once with
    # one line and 130 (toolkit/_interrupt.py). Importing `toolkit` as a library changes no handler.
    from . import _interrupt

    _interrupt.stop_at_once_while_importing()
    from .cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())

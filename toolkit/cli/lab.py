"""`python -m toolkit lab`: JupyterLab on the notebooks, with autosave off."""

from __future__ import annotations

import json
import sys


def command(extra: list[str]) -> int:
    """`python -m toolkit lab [JUPYTER-LAB-ARGS]`: JupyterLab on the notebooks with autosave off, so that running a
    committed notebook does not rewrite it (File > Save still saves). The other settings are the user's own."""
    import os
    import pathlib
    import subprocess
    import tempfile

    from .. import _files

    here = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
    # JupyterLab reads overrides.json from its app settings folder: start from the environment's own overrides.
    own = pathlib.Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    overrides = (
        _files.loads(_files.read_capped(own, "lab", "overrides.json"), "lab", "overrides.json") if own.is_file() else {}
    )
    overrides.setdefault("@jupyterlab/docmanager-extension:plugin", {})["autosave"] = False
    with tempfile.TemporaryDirectory(prefix="toolkit-lab-") as settings:
        _files.write_text(pathlib.Path(settings) / "overrides.json", json.dumps(overrides, indent=1))
        cmd = [sys.executable, "-m", "jupyterlab", f"--LabApp.app_settings_dir={settings}"]
        if not any(not a.startswith("-") for a in extra) and here.is_dir():
            cmd.append(str(here))
        from ..execution.channel import ends_with_this_process

        # JupyterLab ends with this command, however it ends (a kill -9 left it serving, an orphan): the mechanism
        # the toolkit's own children use, given to a program it does not control.
        proc = subprocess.Popen(cmd + extra, env=dict(os.environ), preexec_fn=ends_with_this_process())
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            return 130

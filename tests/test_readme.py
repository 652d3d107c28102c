"""README's claims, run as a reader would: its demo table against `demo`, every `python -m toolkit` command it shows,
and every Python snippet — README's and those of the pages it links (docs/*.md, notebooks/README.md), read as one.

Commands run in a scratch folder. Sweeps (`matrix …`) run with `--dry-run` appended — they check their options,
cells and files and say what they would run; CI's first stage runs README's main job itself — and paths under
`/shared/` go to the scratch folder. A command that needs an optional package that is missing must fail with the
one-line reason naming its install, not a traceback.
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from _helpers import extra

from toolkit._extras import available

ROOT = pathlib.Path(__file__).resolve().parents[1]
# README first (its snippets run first, in one namespace), then the pages it links; the central list is generated.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "notebooks" / "README.md"]
README = "\n\n".join(page.read_text() for page in PAGES)
FENCED = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _blocks(lang: str) -> list[str]:
    return [body for kind, body in FENCED.findall(README) if kind == lang]


def commands() -> list[str]:
    """Every `python -m toolkit …` command in README: the lines of its bash blocks and its inline code."""
    out = []
    for body in _blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" # ", 1)[0].strip()
            if "python -m toolkit" in line:
                out.append(line.split("&&")[-1].strip())
    prose = FENCED.sub("", README)
    for span in re.findall(r"`([^`]*python -m toolkit[^`]*)`", prose):
        out.append(" ".join(span.split()))
    return list(dict.fromkeys(out))


def _argv(command: str) -> list[str]:
    """The toolkit arguments of a README command (`srun …` and another env's python in front dropped)."""
    words = shlex.split(command)
    i = next(i for i in range(len(words) - 2) if words[i + 1 : i + 3] == ["-m", "toolkit"])
    return words[i + 3 :]


def _needs(argv: list[str]) -> str | None:
    """The optional package a command needs, if any."""
    joined = " ".join(argv)
    if "--stack transformers" in joined:
        return "transformers"
    if re.search(r"--stack (torchtitan|all)", joined) or "sc.json" in joined:
        return "torchtitan"
    m = re.search(r"--executor (submitit|ray)", joined)
    return m.group(1) if m else None


def test_readme_shows_commands_of_every_subcommand():
    argvs = [_argv(c) for c in commands()]
    assert {a[0] for a in argvs if a} >= {"matrix", "run", "demo", "cases", "env", "lab"}
    assert not [c for c in commands() if re.search(r"\b[A-Z]{3,}\b|\.\.\.|…|\[--", c.split("--address")[0])], (
        "a README command with a placeholder cannot be run as written"
    )


@pytest.fixture
def scratch(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text("")
    # The your-own-model command names the example model README points to.
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    # The central list's commands name the committed folder: its records, read by --merge (a dry run writes nothing).
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "central-list").mkdir()
    for name in ("results.jsonl.xz",):
        (tmp_path / "docs" / "central-list" / name).symlink_to(ROOT / "docs" / "central-list" / name)
    if available("torchtitan"):
        import toolkit as tk

        sc = tk.Scenario(
            stack="torchtitan",
            torchtitan=tk.TorchtitanConfig.deepseek_v3(),
            ac=tk.ACConfig.of(mode="selective_op"),
            compile=tk.CompileConfig(scope="blocks", fullgraph=True),
            fsdp="blocks",
        )
        (tmp_path / "sc.json").write_text(sc.to_json())
    else:
        (tmp_path / "sc.json").write_text(json.dumps({"stack": "torchtitan"}))
    return tmp_path


def _run(argv, cwd, timeout=900):
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "toolkit", *argv], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
    )


def _readme_commands() -> list:
    """Each distinct toolkit invocation once: README shows some twice (one under another environment's python)."""
    distinct = {}
    for c in commands():
        argv = _argv(c)
        if argv[:1] not in (["lab"], ["demo"]):
            distinct.setdefault(tuple(argv), c)
    return [
        # One that needs an extra runs where CI installs the extras (`-m extras`); README's stage has none of them.
        pytest.param(c, marks=[pytest.mark.extras] if _needs(list(argv)) else [])
        for argv, c in distinct.items()
    ]


@pytest.mark.parametrize("command", _readme_commands())
def test_every_readme_command_runs(command, scratch):
    argv = [w.replace("/shared/", f"{scratch}/shared/") for w in _argv(command)]
    if argv[:1] == ["matrix"]:
        argv.append("--dry-run")
    out = _run(argv, scratch)
    need = _needs(argv)
    if need and not available(need):
        assert out.returncode == 2, (command, out.stdout[-2000:], out.stderr[-2000:])
        assert "Traceback" not in out.stderr and need in out.stderr and "pip install" in out.stderr, out.stderr
        return
    assert out.returncode == 0, (command, out.stdout[-3000:], out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    if argv[:1] == ["matrix"]:
        assert "Nothing was run." in out.stdout, out.stdout
        assert not (scratch / "matrix-out").exists() and not (scratch / "merged").exists()


def _demo_table() -> list[str]:
    block = next(b for b in _blocks("") if b.startswith("setup "))
    return [line.rstrip() for line in block.strip().splitlines()]


def test_demo_prints_readmes_table_row_by_row():
    """`python -m toolkit demo` prints README's table, and nothing on stderr (e.g. no torch log line such as
    "W1201 … Detected that context_fn is passed …")."""
    out = subprocess.run([sys.executable, "-m", "toolkit", "demo"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr
    assert out.stdout.splitlines()[0].startswith("setup") and "recipe torchtitan_0_3_0" in out.stdout
    printed = [line.rstrip() for line in out.stdout.splitlines()]
    table = _demo_table()
    assert printed[: len(table)] == table
    # Row 4 is what the demo exists to show: C2's silent fallback, no graph and one break.
    row4 = table[4].split()
    assert table[4].startswith("full AC, compile(AC(block)), fullgraph=False") and row4[-8:-6] == ["0", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lab_opens_the_notebooks_with_autosave_off():
    """`python -m toolkit lab`: JupyterLab on notebooks/, its document manager's autosave default False (read back
    from JupyterLab's own settings API), so that running a committed notebook does not rewrite it."""
    assert "python -m toolkit lab" in commands()
    port, token = _free_port(), "readme-test"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolkit",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/docmanager-extension:plugin"
        for _ in range(240):
            try:
                req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
                settings = json.loads(urllib.request.urlopen(req, timeout=5).read())
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
                time.sleep(0.5)
        else:
            raise AssertionError("JupyterLab did not answer")
        assert settings["schema"]["properties"]["autosave"]["default"] is False
        tree = urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{port}/api/contents", headers={"Authorization": f"token {token}"}
            ),
            timeout=5,
        )
        names = {item["name"] for item in json.loads(tree.read())["content"]}
        assert "00_quickstart.ipynb" in names and "bugs" in names
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def test_readmes_python_snippets_run():
    """The snippets in order, in one namespace, as a reader pastes them; torchtitan's and transformers' are the next
    tests."""
    snippets = [s for s in _blocks("python") if 'stack="torchtitan"' not in s and 'stack="transformers"' not in s]
    assert snippets
    code = "\n".join(snippets)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    # Each `# line 1: VERDICT — …` comment names the verdict of a Report printed there, in order.
    said = [part.split(" — ", 1)[0].strip() for part in code.split("# line 1: ")[1:]]
    firsts = [
        line.split(": ", 1)[1].split(" ", 1)[0]
        for line in out.stdout.splitlines()
        if ": " in line and not line.startswith(" ")
    ]
    firsts = [f for f in firsts if f in ("ok", "error") or "_" in f]
    assert said and said == firsts[: len(said)], (said, out.stdout[-3000:])


def test_readmes_transformers_snippet_runs_and_says_what_it_says():
    extra("transformers")
    snippet = next(s for s in _blocks("python") if 'stack="transformers"' in s)
    out = subprocess.run([sys.executable, "-c", "import toolkit as tk\n" + snippet], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    # README's comments name each printed Report's line 1 verdict, in order: the stack's, then the user-built model's.
    said = [part.split(" — ", 1)[0] for part in snippet.split("# line 1: ")[1:]]
    firsts = [line for line in out.stdout.splitlines() if not line.startswith(" ")]
    assert len(said) == len(firsts) == 2, out.stdout[:2000]
    for verdict, line in zip(said, firsts):
        assert line.split(": ", 1)[1].startswith(verdict), out.stdout[:2000]


def test_readmes_torchtitan_snippet_runs(tmp_path):
    extra("torchtitan")
    first = next(s for s in _blocks("python") if "import toolkit as tk" in s)
    snippet = next(s for s in _blocks("python") if 'stack="torchtitan"' in s)
    out = subprocess.run(
        [sys.executable, "-c", "import toolkit as tk\n" + snippet],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert first and out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("ok") >= 2 and "2 ranks" in out.stdout, out.stdout[-3000:]
    assert (tmp_path / "sc.json").exists()


def test_the_releases_page_names_the_releases_compat_checks():
    """docs/releases.md opens with the checked releases: the same list as `toolkit.compat.CHECKED_ON`, not typed twice
    apart from it."""
    from toolkit.compat import CHECKED_ON

    first = (ROOT / "docs" / "releases.md").read_text().split("\n\n")[1]
    assert tuple(re.findall(r"\*\*(\d+\.\d+\.\d+)\*\*", first)) == CHECKED_ON, first


def test_readme_shows_the_central_lists_picture_before_its_commands():
    """README's one picture, the central list's heatmap (`cases --heatmap-svg`, committed and tested equal to what the
    records draw), above its first command, with alt text saying what it shows."""
    from toolkit.bugs.central_list import HEATMAP

    text = (ROOT / "README.md").read_text()
    pictures = re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", text)
    assert [target for _, target in pictures] == [HEATMAP.as_posix()] and (ROOT / HEATMAP).is_file()
    assert len(pictures[0][0].split()) >= 8  # alt text that says what the picture shows
    assert text.index(HEATMAP.as_posix()) < text.index("```bash")

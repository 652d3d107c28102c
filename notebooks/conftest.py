"""nbval settings for every notebook here: plots and widgets are not compared; the numbers are printed as text."""


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("application/vnd.plotly.v1+json", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json", "image/png")


# 08 drives torchtitan itself (`pip install -e ".[torchtitan]"`; .ci/run installs it): without it, nothing to run.
import importlib.util  # noqa: E402

collect_ignore = [] if importlib.util.find_spec("torchtitan") else ["08_torchtitan_in_the_loop.ipynb"]
# 09 applies torchtitan main's torch_remat (`pip install -e ".[remat]"`; .ci/run installs it).
if not importlib.util.find_spec("torch_remat"):
    collect_ignore.append("09_torchtitan_main.ipynb")

"""nbval settings for every notebook here: plots and widgets are not compared; the numbers are printed as text."""


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("application/vnd.plotly.v1+json", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json", "image/png")

"""MkDocs hook: the benchmark charts (SVG) and figure tables, drawn at every build by
``benchmarks/charts.py`` from the recorded figures in ``benchmarks/results.json``.

The charts are added to the build as ``charts/<name>.svg``; a line ``<!-- figures: NAME -->``
in a page is replaced by the table of those figures, so a figure is written down once.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
FIGURES = re.compile(r"^<!-- figures: ([a-z]+) -->$", re.M)


def _charts_module() -> Any:
    if str(ROOT) not in sys.path:  # benchmarks/ is part of the repository, not of the installed package
        sys.path.insert(0, str(ROOT))
    from benchmarks import charts

    return charts


def on_files(files: Files, config: Any) -> Files:
    charts = _charts_module()
    for name, svg in charts.charts(charts.load()).items():
        files.append(File.generated(config, f"charts/{name}.svg", content=svg))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if "<!-- figures:" not in markdown:
        return markdown
    charts = _charts_module()
    tables = charts.tables(charts.load())

    def table(m: re.Match[str]) -> str:
        if m.group(1) not in tables:
            raise ValueError(f"{page.file.src_uri}: no figures named {m.group(1)!r} (known: {sorted(tables)})")
        return tables[m.group(1)]

    return FIGURES.sub(table, markdown)

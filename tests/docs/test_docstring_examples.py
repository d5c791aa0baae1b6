"""The examples in the API's docstrings (shown on the generated API page) run as written."""

from __future__ import annotations

import doctest

import pytest

from streamkit.app import App
from streamkit.broker.embedded import EmbeddedBroker
from streamkit.testdriver.driver import TestDriver


@pytest.mark.parametrize("documented", [App, TestDriver, EmbeddedBroker], ids=lambda o: o.__name__)
def test_a_docstring_example_runs_as_written(documented: type) -> None:
    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    [example] = finder.find(documented, globs={documented.__name__: documented})
    result = runner.run(example)
    assert result.attempted > 0 and result.failed == 0, f"{documented.__name__}'s docstring example failed"

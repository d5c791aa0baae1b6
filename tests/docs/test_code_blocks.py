"""Docs cannot rot: every fenced block of README.md and docs/**/*.md is either run by a
test or visibly marked as not run (the convention: tests/docs/blocks.py), and the blocks
that name this file are run here:

- Python blocks run as they stand (their ``assert``s are the test), in a scratch
  directory. A block that imports faust or quixstreams (the migration guides) runs in a
  process of its own, as a module not named ``__main__`` (so ``app.run()`` behind
  ``if __name__ == "__main__"`` does not start), quixstreams against an embedded broker
  (``Quix__Broker__Address``) holding the topics the block declares.
- ``properties`` blocks are read with streamkit's own reader of Kafka client properties.

The commands of every shell block, run or not, are checked against the code: each
``streamkit`` command, sub-command and option exists; each ``python -m`` module of the
repository exists and takes the options given; each ``scripts/...`` exists.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import ROOT, Block, all_blocks, pages, stray_markers

THIS = "tests/docs/test_code_blocks.py"
BLOCKS = all_blocks()
RUN_HERE = [b for b in BLOCKS if b.test == THIS]
PEER = re.compile(r"^\s*(?:import|from)\s+(faust|quixstreams)\b", re.M)
SHELLS = ("bash", "sh", "shell", "console")


def test_the_docs_have_blocks_of_both_kinds() -> None:
    assert len(RUN_HERE) >= 10 and any(b.not_run for b in BLOCKS)
    assert any(b.page == "README.md" for b in RUN_HERE), "the README's app is run here"


def names_page(text: str, page: str) -> bool:
    """Whether a test's source names a page: ``"docs/guides/windows.md"``, or its parts
    joined as a path (``ROOT / "docs" / "guides" / "windows.md"``)."""
    parts = [re.escape(f'"{part}"') for part in page.split("/")]
    return page in text or re.search(r"\s*/\s*".join(parts), text) is not None


def test_every_block_is_run_by_a_test_or_visibly_not_run() -> None:
    problems = []
    for b in BLOCKS:
        if b.test and b.not_run:
            problems.append(f"{b.where}: both run by {b.test} and titled {b.title!r}")
        elif b.test:
            test = ROOT / b.test
            if not test.is_file():
                problems.append(f"{b.where}: the marker names {b.test}, which does not exist")
            elif b.test != THIS and not names_page(test.read_text(), b.page):
                problems.append(f"{b.where}: the marker names {b.test}, which does not read {b.page}")
        elif not b.not_run:
            problems.append(
                f"{b.where}: a {b.lang or 'plain'} block neither run by a test (the line before the fence: "
                '<!-- LABEL: tests/PATH.py runs this block -->) nor marked title="not run: WHY"'
            )
    problems += [f"{m}: a run marker must be the line right before a fence" for p in pages() for m in stray_markers(p)]
    assert problems == [], "\n".join(problems)


# -- the blocks that name this file ----------------------------------------------------------


@pytest.mark.parametrize("block", RUN_HERE, ids=[b.where for b in RUN_HERE])
def test_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.lang == "python" and PEER.search(block.code):
        run_peer_block(block, tmp_path)
    elif block.lang == "python":
        monkeypatch.chdir(tmp_path)
        exec(compile(block.code, block.where, "exec"), {"__name__": "docs_block"})
    elif block.lang == "properties":
        from streamkit.connection import from_properties

        path = tmp_path / "client.properties"
        path.write_text(block.code)
        found = from_properties(path)
        assert found.get("bootstrap"), found
    else:
        pytest.fail(f"{block.where}: this test does not know how to run a {block.lang or 'plain'} block")


def run_peer_block(block: Block, tmp_path: Path) -> None:
    from streamkit.broker import resolve_broker
    from streamkit.testing import DEFAULT_TOPIC_CONFIGS, create_topic

    script = tmp_path / "block.py"
    script.write_text(block.code)
    runner = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='docs_block')"
    with resolve_broker(None) as broker:
        env = {**os.environ, "Quix__Broker__Address": broker.bootstrap, "Quix__State__Dir": str(tmp_path / "state")}
        # quixstreams reads each topic's retention when it declares state; the embedded broker
        # reports only configs set at creation, so the topics are made with them.
        for name in dict.fromkeys(re.findall(r"""\.topic\(\s*["']([^"']+)["']""", block.code)):
            create_topic(broker.bootstrap, name, 1, configs=DEFAULT_TOPIC_CONFIGS)
        done = subprocess.run(
            [sys.executable, "-c", runner, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, f"{block.where}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


# -- the commands of shell blocks ------------------------------------------------------------


def commands(block: Block) -> Iterator[list[str]]:
    """Each command line of a shell block as argv: continuations joined, comments, leading
    ``NAME=value`` assignments and a trailing ``&`` dropped."""
    for line in block.code.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
            argv = argv[1:]
        if argv and argv[-1] == "&":
            argv = argv[:-1]
        if argv:
            yield argv


def streamkit_problems(args: list[str]) -> list[str]:
    """What in ``streamkit ARGS`` the command line does not have: a command or an option."""
    import typer

    from streamkit.cli import CONNECTION_OPTIONS, app

    root = typer.main.get_command(app)
    command: Any = root
    path = ["streamkit"]
    problems = []
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-") and token != "-":
            name = token.split("=", 1)[0]
            scopes = [command] if command is root or name not in CONNECTION_OPTIONS else [command, root]
            params = [p for c in scopes for p in c.params if name in (*p.opts, *p.secondary_opts)]
            if not params and name != "--help":
                problems.append(f"{' '.join(path)} has no option {name}")
            elif params and not params[0].is_flag and "=" not in token:
                i += 1  # its value
        elif hasattr(command, "commands") and command.commands:
            if token not in command.commands:
                problems.append(f"{' '.join(path)} has no command {token!r}")
                return problems
            command = command.commands[token]
            path.append(token)
        i += 1
    if getattr(command, "commands", None) and not {"--help", "--version"} & set(args):
        problems.append(f"{' '.join(path)} needs a command")
    return problems


@functools.cache
def module_help(module: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    return done.stdout if done.returncode == 0 else f"FAILED: {done.stderr[-500:]}"


def module_problems(module: str, args: list[str]) -> list[str]:
    help_text = module_help(module)
    if help_text.startswith("FAILED"):
        return [f"python -m {module} --help: {help_text}"]
    options = sorted({a.split("=", 1)[0] for a in args if a.startswith("--")})
    return [
        f"python -m {module} has no option {o}" for o in options if not re.search(rf"(?<![\w-]){o}(?![\w-])", help_text)
    ]


def test_the_commands_of_shell_blocks_exist() -> None:
    shell = [b for b in BLOCKS if b.lang in SHELLS]
    assert shell, "no shell blocks found"
    modules: list[tuple[Block, str, list[str]]] = []
    problems, checked = [], 0
    for block in shell:
        for argv in commands(block):
            if argv[0] == "streamkit":
                problems += [f"{block.where}: {p}" for p in streamkit_problems(argv[1:])]
                checked += 1
            elif Path(argv[0]).name.startswith("python") and argv[1:2] == ["-m"] and len(argv) > 2:
                if argv[2].split(".")[0] in ("benchmarks", "examples"):
                    modules.append((block, argv[2], argv[3:]))
            elif argv[0].startswith("scripts/"):
                checked += 1
                script = ROOT / argv[0]
                if not (script.is_file() and os.access(script, os.X_OK)):
                    problems.append(f"{block.where}: {argv[0]} is not an executable file of the repository")
    with ThreadPoolExecutor(2) as pool:  # each --help is a process of its own
        list(pool.map(module_help, sorted({m for _, m, _ in modules})))
    for block, module, args in modules:
        problems += [f"{block.where}: {p}" for p in module_problems(module, args)]
    assert checked + len(modules) >= 20, "the shell blocks hold fewer commands than expected: is the parser broken?"
    assert problems == [], "\n".join(problems)


def test_the_command_check_finds_what_does_not_exist() -> None:
    assert streamkit_problems(["topics", "expand", "orders", "--partitions", "6"]) == []
    assert streamkit_problems(["--client-config", "c.properties", "worker", "m:app", "--members", "2"]) == []
    assert streamkit_problems(["worker", "m:app", "--sasl-username", "alice"]) == []  # hoisted
    assert streamkit_problems(["topics", "grow", "orders"]) == ["streamkit topics has no command 'grow'"]
    assert streamkit_problems(["scale", "m:app", "--processes", "3"]) == ["streamkit scale has no option --processes"]
    assert streamkit_problems(["topics"]) == ["streamkit topics needs a command"]
    assert streamkit_problems(["--version"]) == []
    assert names_page('PAGE = ROOT / "docs" / "guides" / "windows.md"', "docs/guides/windows.md")
    assert not names_page('PAGE = ROOT / "docs" / "windows.md"', "docs/guides/windows.md")
    assert module_problems("benchmarks.keys_moved", ["--keys", "10", "--nope"]) == [
        "python -m benchmarks.keys_moved has no option --nope"
    ]

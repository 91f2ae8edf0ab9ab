"""`python -m fastloop` help texts: each says what it does and its defaults, once; serve's
help shows without the serve extra and says what to install."""

from __future__ import annotations

import re
import sys

import pytest

from fastloop.__main__ import main
from fastloop.demo import parser as demo_parser


def help_of(capsys, *argv):
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    assert stop.value.code == 0
    return capsys.readouterr().out


def options(help_text):
    """{option: its help text, lines joined} of an argparse help."""
    found, current = {}, None
    for line in help_text.splitlines():
        match = re.match(r"  (-[-\w]+)", line)
        if match:
            current = match.group(1)
            found[current] = line
        elif current and line.startswith("   "):
            found[current] += " " + line.strip()
        else:
            current = None
    return {k: " ".join(v.split()) for k, v in found.items()}


def test_demo_help_gives_each_default_once():
    shown = options(demo_parser().format_help())
    assert {o: h.count("default") for o, h in shown.items() if h.count("default") > 1} == {}
    assert "(default: the task; -2, -3... when taken)" in shown["--name"] and "None" not in shown["--name"]
    assert "(default: 0)" in shown["--seed"] and "(default: 2)" in shown["--num-workers"]
    assert "default" not in shown["--resume"]  # a flag: no "(default: False)"


def test_demo_quick_help_says_what_the_quick_run_takes():
    quick = options(demo_parser().format_help())["--quick"]
    assert "a few seconds" not in quick
    assert "48 steps on 4,096 images" in quick and "320 steps" in quick


def test_bench_help_describes_the_command_and_the_default_out_folder(capsys):
    text = help_of(capsys, "bench", "-h")
    assert "threads, processes" in text and "report.md" in text
    assert "(default: bench-results)" in options(text)["--out"]


def test_serve_help_shows_without_the_serve_extra_and_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    assert main(["serve", "-h"]) == 0
    text = capsys.readouterr().out
    assert "--model" in text and "--max-batch" in text
    assert "pip install 'fastloop[serve]'" in " ".join(text.split())


def test_serve_without_the_serve_extra_refuses_saying_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert main(["serve", "--model", "ckpts"]) == 2
    assert "needs the serve extra" in capsys.readouterr().err

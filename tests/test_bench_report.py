"""fastloop.bench.report's script output: a suite's title on this machine, its progress as it
runs, then its table with the summary lines below it."""

from __future__ import annotations

from types import SimpleNamespace

from fastloop.bench import report
from fastloop.bench.report import format_section, format_table, print_suite


def test_a_section_is_the_table_then_one_note_a_line():
    table = format_table(["name", "rate"], [["a", 1.5], ["b", 250.0]])
    assert format_section(["name", "rate"], [["a", 1.5], ["b", 250.0]], ["a is slower", "b wins"]) == \
        table + "\na is slower\nb wins"
    assert format_section(["name", "rate"], [["a", 1.5]], []) == format_table(["name", "rate"], [["a", 1.5]])


def test_print_suite_prints_the_title_progress_table_and_summary(capsys, monkeypatch):
    monkeypatch.setattr(report, "machine_summary", lambda: "this machine")  # its date may change meanwhile
    asked = []

    def run(quick: bool = False, log=lambda _: None) -> list[int]:
        asked.append(quick)
        log("measuring 2 rows")
        return [1, 2]

    suite = SimpleNamespace(HEADERS=["n", "double"], run=run, table_rows=lambda rows: [[n, 2 * n] for n in rows],
                            summary=lambda rows: [f"{len(rows)} rows"])
    assert print_suite(suite, "doubling", quick=True) == 0
    assert asked == [True]
    assert capsys.readouterr().out.splitlines() == [
        "doubling on this machine", "measuring 2 rows",
        *format_table(["n", "double"], [[1, 2], [2, 4]]).splitlines(), "2 rows"]

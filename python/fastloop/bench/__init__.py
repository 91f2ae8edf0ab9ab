"""Benchmarks that compare threads and processes on this machine, side by side in one run.

Run them with ``python -m fastloop bench [--quick]`` (tables, a PNG plot and a markdown
report) or import a suite and call its ``run()``.

    >>> from fastloop.bench import preprocess
    >>> rows = preprocess.run(quick=True)
"""

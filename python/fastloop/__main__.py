"""The fastloop command line.

    $ python -m fastloop demo            # the main job: train on generated data, log, checkpoint, plot
    $ python -m fastloop bench --quick   # every benchmark suite, tables + PNG + markdown report
    $ python -m fastloop info            # what this build has (CUDA, why not)
"""

from __future__ import annotations

import argparse
import os
import sys


def run_bench(quick: bool, out_dir: str) -> int:
    """All suites side by side: the speed targets, then threads vs processes."""
    import warnings

    from .bench import loader, logistics, model, preprocess, targets
    from .bench.report import format_table, machine_summary

    warnings.simplefilter("ignore", RuntimeWarning)  # "no GPU metrics" is expected on CPU hosts
    print(f"fastloop benchmarks ({'quick' if quick else 'full'}) on {machine_summary()}\n")
    print("== targets")
    results = targets.run(quick=quick, log=print) + logistics.run(quick=quick, log=print)
    print(format_table(targets.HEADERS, targets.table_rows(results)))
    print("\n== data loading: fastloop.Loader vs torch DataLoader")
    loader_rows = loader.run(quick=quick)
    print(format_table(loader.HEADERS, loader.table_rows(loader_rows)))
    print("\n".join(loader.summary(loader_rows)))
    print("\n== model core: fastloop.nn vs torch on the CPU")
    model_rows = model.run(quick=quick)
    print(format_table(model.HEADERS, model.table_rows(model_rows)))
    print("\n".join(model.summary(model_rows)))
    print("\n== threads vs processes")
    preprocess.main(quick=quick, out_dir=out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "targets.md"), "w") as f:
        f.write(f"# fastloop targets\n\n{machine_summary()}\n\n")
        f.write(format_table(targets.HEADERS, targets.table_rows(results), markdown=True) + "\n")
        f.write("\n## Data loading\n\n" + format_table(loader.HEADERS, loader.table_rows(loader_rows), markdown=True))
        f.write("\n\n" + "\n".join(f"- {line}" for line in loader.summary(loader_rows)) + "\n")
        f.write("\n## Model core\n\n" + format_table(model.HEADERS, model.table_rows(model_rows), markdown=True))
        f.write("\n\n" + "\n".join(f"- {line}" for line in model.summary(model_rows)) + "\n")
    missed = [r.name for r in results if r.passed is False]
    print(f"\ntargets met: {sum(r.passed is True for r in results)}/{sum(r.passed is not None for r in results)}"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # the demo parses its own options
        from .demo import main as demo_main

        return demo_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m fastloop", description="fastloop command line")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="the main job on an embedded default: train, log, checkpoint (see demo -h)")
    bench = commands.add_parser("bench", help="every benchmark suite, side by side, with a report")
    bench.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    bench.add_argument("--out", default="bench-results", help="folder for the PNG plots and the report")
    commands.add_parser("info", help="what this build of fastloop has (CUDA, and why not)")
    args = parser.parse_args(argv)

    if args.command == "info":
        from .bench.report import print_info

        print_info()
        return 0
    return run_bench(args.quick, args.out)


if __name__ == "__main__":
    sys.exit(main())

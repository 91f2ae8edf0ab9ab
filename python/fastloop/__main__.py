"""The fastloop command line: ``python -m fastloop demo`` and ``python -m fastloop bench``.

    $ python -m fastloop demo            # the main job on an embedded default
    $ python -m fastloop bench --quick   # threads vs processes on this machine
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastloop", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the main job on an embedded default")
    demo.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    bench = commands.add_parser("bench", help="threads vs processes benchmarks on this machine")
    bench.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    bench.add_argument("--out", default="bench-results", help="folder for the PNG plot and report")
    commands.add_parser("info", help="what this build of fastloop has (CUDA, threads)")
    args = parser.parse_args(argv)

    if args.command == "info":
        from .bench.report import print_info

        print_info()
        return 0
    from .bench import preprocess

    out = getattr(args, "out", "bench-results")
    return preprocess.main(quick=args.quick, out_dir=out)


if __name__ == "__main__":
    sys.exit(main())

"""The fastloop command line.

    $ python -m fastloop demo            # the main job: train on generated data, log, checkpoint, plot
    $ python -m fastloop bench --quick   # every suite side by side: tables, PNG plots, a report with the answer
    $ python -m fastloop info            # what this build has (CUDA, why not)
    $ python -m fastloop serve --model ckpts --port 8000   # a checkpointed model over HTTP
"""

from __future__ import annotations

import argparse
import os
import sys

from ._cli import DefaultsFormatter


def run_bench(quick: bool, out_dir: str) -> int:
    """Every suite side by side, then one report (report.md + PNG plots in out_dir) that
    ends with the answer to "threads or processes?" for this machine."""
    import warnings

    from .bench import answer, images, loader, logistics, model, preprocess, targets
    from .bench.report import format_section, format_table, machine_summary

    warnings.simplefilter("ignore", RuntimeWarning)  # "no GPU metrics" is expected on CPU hosts
    machine = machine_summary()
    print(f"fastloop benchmarks ({'quick' if quick else 'full'}) on {machine}\n")
    sections: list[tuple[str, list[str], list[list[object]], list[str]]] = []  # title, headers, rows, notes

    def section(title: str, headers: list[str], rows: list[list[object]], notes: list[str]) -> None:
        print(f"\n== {title}\n" + format_section(headers, rows, notes))
        sections.append((title, headers, rows, notes))

    print("== targets (ops, queue, logging, checkpointing)")
    results = targets.run(quick=quick, log=print) + logistics.run(quick=quick, log=print)
    section("Targets: ops, queue, logging, checkpointing", targets.HEADERS, targets.table_rows(results), [])
    print("\n== data loading: threads, processes, torch's DataLoader (each in a fresh interpreter)")
    loader_rows = loader.run(quick=quick, log=print)
    section("Data loading", loader.HEADERS, loader.table_rows(loader_rows), loader.summary(loader_rows))
    print("\n== images: JPEG files through the ImageNet train pipeline (each row in a fresh interpreter)")
    image_rows = images.suite(quick=quick, log=print)
    if image_rows:
        section("Images: JPEG decode + RandomResizedCrop + flip + normalize", images.HEADERS,
                images.table_rows(image_rows), images.summary(image_rows))
    model_rows = model.run(quick=quick)
    section("Model core: fastloop.nn vs torch on the CPU", model.HEADERS, model.table_rows(model_rows),
            model.summary(model_rows))
    print("\n== preprocessing: threads vs processes")
    preprocess_rows = preprocess.run(quick=quick, log=print)
    section("Preprocessing: threads vs processes", preprocess.HEADERS, preprocess.table_rows(preprocess_rows),
            [preprocess.verdict(preprocess_rows)])
    from .bench import free_threading

    if free_threading.free_threaded():  # Python code in threads: the question answered again
        print("\n== Python datasets: threads vs processes, with and without the GIL (each in a fresh interpreter)")
        ft_rows = free_threading.run(quick=quick, log=print)
        section("Python datasets on a free-threaded interpreter", free_threading.HEADERS,
                free_threading.table_rows(ft_rows), free_threading.summary(ft_rows))

    side_by_side = answer.side_by_side(results, loader_rows, model_rows, preprocess_rows)
    final = answer.answer(results, loader_rows, model_rows, preprocess_rows)
    print("\n== side by side\n" + format_table(answer.HEADERS, side_by_side))
    print("\n" + "\n".join(final))
    os.makedirs(out_dir, exist_ok=True)
    plots = [p for p in (preprocess.save_plot(preprocess_rows, out_dir), loader.save_plot(loader_rows, out_dir)) if p]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write(f"# fastloop: threads or processes, on this machine\n\n{machine}; "
                f"`python -m fastloop bench{' --quick' if quick else ''}`\n\n")
        f.write("## Side by side\n\n" + format_table(answer.HEADERS, side_by_side, markdown=True) + "\n\n")
        f.write("".join(f"![{os.path.basename(p)}]({os.path.basename(p)})\n\n" for p in plots))
        for title, headers, rows, notes in sections:
            f.write(f"## {title}\n\n" + format_table(headers, rows, markdown=True) + "\n\n")
            f.write("".join(f"{line}\n" if line.startswith("- ") else f"- {line}\n" for line in notes if line))
            f.write("\n" if notes else "")
        f.write("\n".join(final) + "\n")
    missed = [r.name for r in results if r.passed is False]
    print(f"\nreport: {path}" + (f"; plots: {', '.join(plots)}" if plots else ""))
    print(f"targets met: {sum(r.passed is True for r in results)}/{sum(r.passed is not None for r in results)}"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # the demo parses its own options
        from .demo import main as demo_main

        return demo_main(argv[1:])
    if argv[:1] == ["serve"]:  # the server parses its own options
        from .serve.cli import main as serve_main

        return serve_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m fastloop", description="fastloop command line")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="the main job on an embedded default: train, log, checkpoint (see demo -h)")
    commands.add_parser("serve", help="a model over HTTP: fastloop.nn checkpoint, module:factory, TorchScript (see serve -h)")
    bench = commands.add_parser(
        "bench", help="every benchmark suite, side by side, with a report", formatter_class=DefaultsFormatter,
        description="Times threads, processes and a yardstick (NumPy, torch where installed) side by side on this "
                    "machine: preprocessing, loading, logging, checkpointing, training steps. Prints each table, then "
                    "which to use for what, from the numbers of this run; writes report.md and PNG plots.")
    bench.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds (minutes, not tens)")
    bench.add_argument("--out", default="bench-results", help="folder for the PNG plots and report.md")
    commands.add_parser("info", help="what this build of fastloop has (CUDA, and why not)")
    args = parser.parse_args(argv)

    if args.command == "info":
        from .bench.report import print_info

        print_info()
        return 0
    return run_bench(args.quick, args.out)


if __name__ == "__main__":
    sys.exit(main())

"""What pytest checks in benchmarks/ (collected by `make test` through pyproject's testpaths).

Each bench_*.py runs a quick configuration once and asserts its bookkeeping, never its speed
(a loaded 2-core machine must not fail a test; the numbers go to BENCHMARKS.md):
- every row of the table is measured: the designed number of rows, each time or rate finite
  and > 0 (bench_checkpoint_torch, bench_decode, bench_gpu, bench_logistics, bench_model,
  bench_monitor_summaries, bench_serve, bench_serve_http, bench_targets);
- bench_samples measures each kind of sample once (CPU per sample, >= 0);
- bench_args runs each hot call's loop a few times (its counts need valgrind: script only);
- the loader rows (bench_loader, bench_torch_loader) also report a first batch and a peak PSS;
  their "first batch < 60 s / 120 s" is a hang guard, not a speed target;
- results, where a benchmark can check them: bench_preprocess's ways compute equal values,
  bench_targets' queue rows lose no item;
- bench_gpu_feed: every row has a rate, CPU cores and a first batch, or says why it is not
  available (none failed), in its CPU smoke run everywhere and its --quick run on a GPU.
Skips say why (no torch, torchvision, uvicorn or GPU).
"""

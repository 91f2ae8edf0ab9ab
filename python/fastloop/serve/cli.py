"""``python -m fastloop serve``: a model behind the HTTP front: a checkpointed fastloop.nn
model, or any model a factory in the user's code builds, or a TorchScript file
(fastloop.serve.model_source says how each is read).

    $ python -m fastloop serve --model ckpts --port 8000 --num-workers 2 --store file:jobs
    $ python -m fastloop serve --model mypkg.models:build --port 8000
    $ python -m fastloop serve --model cnn.ts --input float32:3,32,32

The checkpoint (a fastloop.Checkpointer directory, whose latest checkpoint is used, or one
checkpoint file: .safetensors, or .npz of earlier versions) holds what ``fastloop.nn.training_state(model, arch=arch_of(model))`` saved: the
"model.<name>" parameters and ``arch``, a JSON string naming the layers, e.g.
``{"dtype": "float32", "layers": [["Linear", 784, 512, true], ["ReLU"], ["Linear", 512, 10, true]]}``.
A checkpoint without ``arch`` needs ``--layers 784,512,10`` (Linear layers with bias, ReLU
between them).

SIGTERM (Docker, Kubernetes) and Ctrl-C drain: new jobs get 503 with Retry-After while what
was accepted runs and is answered, for up to ``--drain-s`` seconds; then the server
stops, the service closes its store and the process exits 0 (draining.py). Without
``--store`` the jobs live in memory (nothing outlives the process); ``--store file:DIR``
keeps them on disk, ``redis://`` in Redis.

``--processes N --store redis://HOST:PORT/DB`` runs N server processes on the port (one
parent forks them and replaces any that dies; processes.py), sharing the jobs and the queue
in Redis; ``--queue redis`` shares them with servers on other machines too.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import re
import sys
import tempfile
import time
from typing import Any

from .. import nn
from .model_source import load_source, parse_input

__all__ = ["main"]


def _set_threads(model: Any, blas_threads: int, torch_threads: int | None) -> None:
    if isinstance(model, nn.Sequential) and model.device == "cpu":
        nn.set_blas_threads(blas_threads)
    if torch_threads is not None:
        import torch
        torch.set_num_threads(torch_threads)


STORE_HELP = ("where jobs are kept. memory (the default): in this process, the fastest; a restart forgets "
              "every job. file:DIR: a folder that persists, each job written and fsynced (~3 fsyncs per job); "
              "after a restart, queued jobs run again and running ones fail. redis://HOST:PORT/DB: in Redis, "
              "shared by several processes or hosts; as durable as that Redis is configured")


def _store(spec: str, index: int = 0, peers: list[str] | None = None, model: str | None = None) -> Any:
    """The store `spec` names; for share-nothing process `index` (peers given), its own; for
    one of several models (`model` named), its own too (a folder, or a Redis key prefix)."""
    from .filestore import FileStore
    if spec.startswith("file:"):
        parts = [spec[len("file:"):]] + ([] if peers is None else [f"process-{index}"]) + ([] if model is None else [model])
        return FileStore(os.path.join(*parts))
    if spec == "memory":
        from .stores import MemoryStore
        return MemoryStore()
    if spec.startswith("redis://"):
        try:
            from .redisstore import RedisStore  # type: ignore[import-not-found]
        except ImportError as error:
            raise SystemExit(f"--store {spec}: the Redis store is not available ({error}); "
                             "install redis (pip install redis) or use --store file:DIR") from None
        return RedisStore(spec) if model is None else RedisStore(spec, prefix=f"fastloop:{model}:")
    raise SystemExit(f"--store must be file:DIR, memory or redis://HOST:PORT/DB, not {spec!r}")


_MODEL_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")  # as a job id: it goes in paths and labels


def _named_models(values: list[str]) -> list[tuple[str | None, str]]:
    """(name or None, target) per --model: NAME=TARGET, or TARGET alone (one model only).
    ValueError naming what is wrong."""
    models: list[tuple[str | None, str]] = []
    for value in values:
        name, sep, target = value.partition("=")
        if sep and _MODEL_NAME.fullmatch(name) and target:
            models.append((name, target))
        else:
            models.append((None, value))
    if len(models) > 1:
        unnamed = [target for name, target in models if name is None]
        if unnamed:
            raise ValueError(f"--model: with several models name each one, NAME=MODEL (not {unnamed[0]!r})")
        names = [name for name, _ in models]
        if len(set(names)) != len(names):
            raise ValueError(f"--model: each model needs a name of its own, got {names}")
    return models


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        import uvicorn  # noqa: F401 (the limits below are its protocol's)
        from .http_limits import LIMITS, uvicorn_config
        missing = None
    except ImportError as error:  # the help still shows (the limits' values are not in it)
        LIMITS, missing = collections.defaultdict(lambda: None), error

    from .http import MAX_WEBSOCKETS

    parser = argparse.ArgumentParser(prog="python -m fastloop serve",
                                     description="serve a model over HTTP")
    parser.add_argument("--model", required=True, action="append", metavar="[NAME=]MODEL",
                        help="a fastloop.Checkpointer directory or checkpoint file (fastloop.nn), module:factory (a "
                             "function returning the model or (model, inputs)), a TorchScript file or a torch.export "
                             ".pt2. Repeat it as NAME=MODEL to serve several models, each with its own queue, workers "
                             "and metrics, at /v1/models/NAME/ (the first also at /v1/)")
    parser.add_argument("--input", action="append", default=[], metavar="[NAME=]DTYPE:SHAPE",
                        help="one input per row, e.g. float32:3,32,32 or ids=int64:* (repeat for several); "
                             "needed for a TorchScript file, overrides a factory's")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads for a torch model")
    parser.add_argument("--layers", help="the model's sizes (784,512,10: Linear+ReLU) when it holds no arch")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--max-queue", type=int, default=1024)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-delay-s", type=float, default=0.002,
                        help="how long a batch waits to fill after its first job (seconds)")
    parser.add_argument("--store", default="memory", metavar="memory | file:DIR | redis://HOST:PORT/DB",
                        help=STORE_HELP)
    parser.add_argument("--input-root", help="directory that 'path' inputs must lie in (default: none allowed)")
    parser.add_argument("--result-ttl-s", type=float, default=600.0)
    parser.add_argument("--max-body-bytes", type=int, default=4 << 20)
    parser.add_argument("--max-websockets", type=int, default=MAX_WEBSOCKETS,
                        help="event streams (WebSockets) open at once; more are closed with 1013 (default: %(default)s)")
    parser.add_argument("--max-header-bytes", type=int, default=LIMITS["max_header_bytes"],
                        help="a request's headers over this are answered 431")
    parser.add_argument("--header-timeout-s", type=float, default=LIMITS["header_timeout_s"],
                        help="a connection whose request headers are not complete by then is closed")
    parser.add_argument("--body-timeout-s", type=float, default=LIMITS["body_timeout_s"],
                        help="a request body not complete this long after its headers is answered 408")
    parser.add_argument("--keep-alive-s", type=float, default=LIMITS["keep_alive_s"],
                        help="an idle keep-alive connection is closed after this")
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="default job deadline from submit: a job not ended by then fails (default: none)")
    parser.add_argument("--drain-s", dest="drain_s", type=float, default=10.0, metavar="SECONDS",
                        help="after SIGTERM or Ctrl-C (new jobs get 503), how long the jobs already accepted may "
                             "take to run and be answered before the server stops anyway (default: 10)")
    parser.add_argument("--blas-threads", type=int, default=1,
                        help="CPU BLAS threads per matrix product (the workers already run in parallel)")
    parser.add_argument("--worker-priority", choices=("normal", "idle"), default="normal",
                        help="idle: the workers run under SCHED_IDLE (Linux), so the HTTP front preempts them "
                             "at once under load; for a machine that serves and does little else")
    parser.add_argument("--processes", type=int, default=1,
                        help="server processes sharing the port: with --store redis:// they share its jobs and "
                             "queue; otherwise each keeps its own (memory, or file:DIR/process-I) and a request "
                             "for another process's job is forwarded to it")
    parser.add_argument("--queue", choices=("memory", "redis"),
                        help="where the queue lives: memory (this process; the default for one process) or "
                             "redis (shared with every process and host on the same --store redis://)")
    parser.add_argument("--visibility-timeout-s", type=float, default=30.0,
                        help="with the queue in Redis: how long a stopped process's jobs wait before "
                             "another process reclaims them")
    parser.add_argument("--log-level", default="info")
    if missing is not None:
        need = f"needs the serve extra, not installed here ({missing}): pip install 'fastloop[serve]'"
        if {"-h", "--help"} & set(argv):
            parser.epilog = f"This command {need}"
            parser.print_help()
            return 0
        print(f"python -m fastloop serve {need}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        args.models = _named_models(args.model)
    except ValueError as error:
        print(str(error), file=sys.stderr)
        return 2
    if len(args.models) > 1 and args.input:
        print("--input declares the inputs of one model: with several, return (model, inputs) from each "
              "model's factory", file=sys.stderr)
        return 2
    redis_store = args.store.startswith("redis://")
    if args.processes < 1:
        print(f"--processes must be >= 1, not {args.processes}", file=sys.stderr)
        return 2
    if args.queue is None:
        args.queue = "redis" if args.processes > 1 and redis_store else "memory"
    if args.queue == "redis" and not redis_store:
        print("--queue redis needs --store redis://HOST:PORT/DB (the processes share its jobs and queue)",
              file=sys.stderr)
        return 2
    if args.processes > 1 and args.queue == "memory" and redis_store:
        print("--processes > 1 with --store redis:// share the queue in Redis: drop --queue memory",
              file=sys.stderr)
        return 2
    if args.processes > 1:
        from .peers import ConnectionShares
        from .processes import listen, run_processes
        try:
            sock = listen(args.host, args.port)
        except OSError as error:
            print(str(error), file=sys.stderr)
            return 2
        shares = ConnectionShares(args.processes)  # before the fork: the children share it
        if args.queue == "redis":
            return run_processes(args.processes, sock, lambda s, i: _serve(args, s, i, None, shares),
                                 grace_s=args.drain_s + 20)
        with tempfile.TemporaryDirectory(prefix="fastloop-serve-") as rundir:  # the processes' unix sockets
            peers = [os.path.join(rundir, f"process-{i}.sock") for i in range(args.processes)]
            return run_processes(args.processes, sock, lambda s, i: _serve(args, s, i, peers, shares),
                                 grace_s=args.drain_s + 20)
    return _serve(args, None)


def _serve(args: argparse.Namespace, sock: Any, index: int = 0, peers: list[str] | None = None,
           shares: Any = None) -> int:
    """One server process: the model, the service, the front; on `sock` when given. With
    `peers` (share-nothing processes, peers.py): process `index` of them, its own store, the
    jobs it creates its own, and requests for the others' jobs forwarded to their sockets."""
    from .draining import DrainingServer
    from .http import DEFAULT_NAME, App
    from .http_limits import uvicorn_config
    from .peers import KeepShares, PeerRouter, owned_id
    from .processes import listen_unix, note_stops, when_stopped
    from .factory import create_service
    from .spec import is_torch_module

    if sock is None:  # one process: a SIGTERM while the model loads stops it once it serves
        note_stops()
    services: dict[str, Any] = {}
    for name, target in args.models:
        try:
            model, inputs = load_source(target, [parse_input(text) for text in args.input], args.layers)
            if inputs is None and is_torch_module(model):
                raise ValueError(f"{type(model).__name__} is a torch model: declare its inputs with --input "
                                 "DTYPE:SHAPE, one row as forward() takes it without the batch axis (e.g. --input "
                                 "float32:3,224,224; repeat it for several inputs, NAME=DTYPE:SHAPE), or return "
                                 "(model, inputs) from a factory (--model module:factory)")
            _set_threads(model, args.blas_threads, args.torch_threads)
            extra = {} if peers is None else {"new_id": lambda: owned_id(index, len(peers))}
            if args.queue == "redis":
                from .redisqueue import RedisQueue
                extra["queue"] = RedisQueue(visibility_timeout_s=args.visibility_timeout_s)
            store = _store(args.store, index, peers, name if len(args.models) > 1 else None)
            services[name or DEFAULT_NAME] = create_service(
                model, num_workers=args.num_workers, max_queue=args.max_queue, max_batch=args.max_batch,
                max_delay_s=args.max_delay_s, store=store, **extra, result_ttl_s=args.result_ttl_s,
                worker_priority=args.worker_priority, inputs=inputs, timeout=args.timeout_s)
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"cannot serve the model from {target}: {error}", file=sys.stderr)
            for service in services.values():
                service.close(timeout=0)
            return 2
    front = App(services, input_root=args.input_root, max_body_bytes=args.max_body_bytes,
                max_websockets=args.max_websockets)
    app: Any = front
    sockets = None if sock is None else [sock]
    on_connections = None
    if shares is not None:  # one of --processes N: clients are moved off a process over its share
        shares.reset(index)
        on_connections = lambda delta: shares.add(index, delta)  # noqa: E731
        app = KeepShares(app, index, shares) if peers is None else PeerRouter(app, index, peers, shares)
    if peers is not None:
        sockets.append(listen_unix(peers[index]))
    config = uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level,
                            max_header_bytes=args.max_header_bytes, header_timeout_s=args.header_timeout_s,
                            body_timeout_s=args.body_timeout_s, keep_alive_s=args.keep_alive_s,
                            timeout_graceful_shutdown=args.drain_s, on_connections=on_connections)  # a stuck connection does not hold the stop
    # What exists now (modules, the model) lives as long as the server: frozen, the garbage
    # collector's full passes skip it (one took ~23 ms, a stall of every request, unfrozen).
    gc.collect()
    gc.freeze()
    server = DrainingServer(config, front=front, busy=lambda: sum(s.busy() for s in services.values()),
                            drain_s=args.drain_s)
    when_stopped(server.stop)  # a stop asked for while starting is not lost
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # a Ctrl-C before uvicorn took over the signals
        pass
    finally:
        stopped = time.monotonic()
        for service in services.values():
            service.close(timeout=server.drain_left())
        _log_drain(server, stopped, time.monotonic())
    return 0


def _log_drain(server: Any, stopped: float, closed: float) -> None:
    """One line on a drained stop: how long the accepted jobs took, and closing the service."""
    if server.drain_started is None:
        return
    import logging

    ran = (server.drained or stopped) - server.drain_started
    logging.getLogger("uvicorn.error").info(
        "fastloop serve: drained: the accepted jobs ran in %.3f s after the signal; the server stopped %.3f s "
        "later; closing the service and its store took %.3f s", ran, stopped - (server.drained or stopped),
        closed - stopped)

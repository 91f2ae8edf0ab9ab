"""``python -m fastloop serve``: a model behind the HTTP front: a checkpointed fastloop.nn
model, or any model a factory in the user's code builds, or a TorchScript file
(fastloop.serve.model_source says how each is read).

    $ python -m fastloop serve --model ckpts --port 8000 --workers 2 --store file:jobs
    $ python -m fastloop serve --model mypkg.models:build --port 8000
    $ python -m fastloop serve --model cnn.ts --input float32:3,32,32

The checkpoint (a fastloop.Checkpointer directory, whose latest checkpoint is used, or one
.npz file) holds what ``fastloop.nn.training_state(model, arch=arch_of(model))`` saved: the
"model.<name>" parameters and ``arch``, a JSON string naming the layers, e.g.
``{"dtype": "float32", "layers": [["Linear", 784, 512, true], ["ReLU"], ["Linear", 512, 10, true]]}``.
A checkpoint without ``arch`` needs ``--layers 784,512,10`` (Linear layers with bias, ReLU
between them). Ctrl-C stops the server (uvicorn's handling), then the service drains.

``--processes N --store redis://HOST:PORT/DB`` runs N server processes on the port (one
parent forks them and replaces any that dies; processes.py), sharing the jobs and the queue
in Redis; ``--queue redis`` shares them with servers on other machines too.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import tempfile
from typing import Any

import numpy as np

from .. import nn
from ..checkpoint import Checkpointer
from .model_source import load_source, parse_input

__all__ = ["arch_of", "model_from_arch", "load_model", "main"]


def arch_of(model: Any) -> str:
    """The JSON string that describes `model`'s layers, to save beside its parameters.

    >>> ckpt.save(fl.nn.training_state(model, arch=arch_of(model)), step)
    """
    if isinstance(model, nn.Linear):
        model = nn.Sequential(nn.Linear(model.in_features, model.out_features, bias=model.has_bias))
    layers: list[list[Any]] = []
    for layer in model:
        if isinstance(layer, nn.Linear):
            layers.append(["Linear", layer.in_features, layer.out_features, layer.has_bias])
        else:
            layers.append([type(layer).__name__])
    return json.dumps({"dtype": np.dtype(model.dtype).name, "layers": layers})


def model_from_arch(arch: str) -> nn.Sequential:
    """A fresh Sequential built from an arch_of() string; ValueError naming what is wrong."""
    try:
        spec = json.loads(arch)
        kinds = {"Linear": lambda a, b, bias=True: nn.Linear(int(a), int(b), bias=bool(bias)),
                 "ReLU": nn.ReLU, "Flatten": nn.Flatten}
        layers = [kinds[entry[0]](*entry[1:]) for entry in spec["layers"]]
        return nn.Sequential(*layers, dtype=spec.get("dtype", "float32"))
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise ValueError(f"the checkpoint's arch {arch[:200]!r} is not a model description: {error}") from None


def _layers_arch(layers: str) -> str:
    sizes = [int(n) for n in layers.split(",")]
    if len(sizes) < 2:
        raise ValueError("--layers takes at least two sizes: in,out (e.g. 784,512,10)")
    spec: list[list[Any]] = []
    for a, b in zip(sizes, sizes[1:]):
        spec += [["Linear", a, b, True], ["ReLU"]]
    return json.dumps({"layers": spec[:-1]})


def load_model(path: str, layers: str | None = None) -> nn.Sequential:
    """The model a checkpoint directory (latest checkpoint) or .npz file holds."""
    if os.path.isdir(path):
        state = Checkpointer(path).load()
    else:
        with np.load(path, allow_pickle=False) as npz:
            state = {name: npz[name] for name in npz.files}
    if layers is not None:
        arch = _layers_arch(layers)
    elif "arch" in state:
        arch = str(state["arch"])
    else:
        raise ValueError(f"{path} holds no 'arch' entry: save it with training_state(model, arch=arch_of(model)) "
                         "or pass --layers (e.g. 784,512,10)")
    model = model_from_arch(arch)
    nn.load_training_state(state, model)
    return model


def _set_threads(model: Any, blas_threads: int, torch_threads: int | None) -> None:
    if isinstance(model, nn.Sequential) and model.device == "cpu":
        nn.set_blas_threads(blas_threads)
    if torch_threads is not None:
        import torch
        torch.set_num_threads(torch_threads)


def _store(spec: str | None, index: int = 0, peers: list[str] | None = None) -> Any:
    """The store `spec` names; for share-nothing process `index` (peers given), its own."""
    from .filestore import FileStore
    if spec is None:
        return None
    if spec.startswith("file:"):
        root = spec[len("file:"):]
        return FileStore(root if peers is None else os.path.join(root, f"process-{index}"))
    if spec == "memory":
        from .stores import MemoryStore
        return MemoryStore()
    if spec.startswith("redis://"):
        try:
            from .redisstore import RedisStore  # type: ignore[import-not-found]
        except ImportError as error:
            raise SystemExit(f"--store {spec}: the Redis store is not available ({error}); "
                             "install redis (pip install redis) or use --store file:DIR") from None
        return RedisStore(spec)
    raise SystemExit(f"--store must be file:DIR, memory or redis://HOST:PORT/DB, not {spec!r}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        import uvicorn  # noqa: F401 (the limits below are its protocol's)
        from .http_limits import LIMITS, uvicorn_config
        missing = None
    except ImportError as error:  # the help still shows (the limits' values are not in it)
        LIMITS, missing = collections.defaultdict(lambda: None), error

    parser = argparse.ArgumentParser(prog="python -m fastloop serve",
                                     description="serve a model over HTTP")
    parser.add_argument("--model", required=True,
                        help="a fastloop.Checkpointer directory or .npz (fastloop.nn), module:factory (a function "
                             "returning the model or (model, inputs)), a TorchScript file or a torch.export .pt2")
    parser.add_argument("--input", action="append", default=[], metavar="[NAME=]DTYPE:SHAPE",
                        help="one input per row, e.g. float32:3,32,32 or ids=int64:* (repeat for several); "
                             "needed for a TorchScript file, overrides a factory's")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads for a torch model")
    parser.add_argument("--layers", help="the model's sizes (784,512,10: Linear+ReLU) when it holds no arch")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-queue", type=int, default=1024)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-delay-ms", type=float, default=2.0)
    parser.add_argument("--store", help="file:DIR (default: a temporary directory), memory, or redis://HOST:PORT/DB")
    parser.add_argument("--input-root", help="directory that 'path' inputs must lie in (default: none allowed)")
    parser.add_argument("--result-ttl-s", type=float, default=600.0)
    parser.add_argument("--max-body-bytes", type=int, default=4 << 20)
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
    parser.add_argument("--drain-s", type=float, default=10.0, help="after Ctrl-C, how long queued jobs may run")
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
    redis_store = (args.store or "").startswith("redis://")
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
    import uvicorn

    from .http import App
    from .http_limits import uvicorn_config
    from .peers import KeepShares, PeerRouter, owned_id
    from .processes import listen_unix
    from .service import InferenceService

    queue = None
    if args.queue == "redis":
        from .redisqueue import RedisQueue
        queue = RedisQueue(visibility_timeout_s=args.visibility_timeout_s)
    try:
        model, inputs = load_source(args.model, [parse_input(text) for text in args.input], args.layers)
        _set_threads(model, args.blas_threads, args.torch_threads)
        extra = {} if peers is None else {"new_id": lambda: owned_id(index, len(peers))}
        service = InferenceService(model, workers=args.workers, max_queue=args.max_queue, max_batch=args.max_batch,
                                   max_delay_ms=args.max_delay_ms, store=_store(args.store, index, peers), **extra,
                                   result_ttl_s=args.result_ttl_s, worker_priority=args.worker_priority,
                                   inputs=inputs, timeout_s=args.timeout_s, queue=queue)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"cannot serve the model from {args.model}: {error}", file=sys.stderr)
        return 2
    app: Any = App(service, input_root=args.input_root, max_body_bytes=args.max_body_bytes)
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
    server = uvicorn.Server(config)
    if sock is not None:  # one of --processes N: a stop asked for while starting must not be lost
        from .processes import when_stopped
        when_stopped(lambda: setattr(server, "should_exit", True))
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled, once it has shut down
        pass
    finally:
        service.close(drain_s=args.drain_s)
    return 0

"""A server process of the shared-queue tests: a SharedInferenceService on a RedisStore with
a toy model, running until it is killed or sent SIGTERM. It prints "ready" once serving.

    python tests/serve_shared_child.py URL PREFIX --num-workers 1 --max-batch 1 --model affine
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

import numpy as np

from fastloop.serve import InferenceService, RedisQueue, RedisStore, create_service


def affine(batch: np.ndarray) -> np.ndarray:
    return batch * 2 + 1


def block(batch: np.ndarray) -> np.ndarray:
    threading.Event().wait()  # a model call that never returns (the process is killed in it)
    return batch


def slow(seconds: float):
    def model(batch: np.ndarray) -> np.ndarray:
        time.sleep(seconds)  # the model's cost: a GIL-free wait, as a device call is
        return batch * 2 + 1
    return model


def logged(seconds: float, log: str):
    """Waits `seconds` per batch, then appends each row's tag (its first value) to `log`, one
    line per run of a job, so that the test counts how often each job ran."""
    def model(batch: np.ndarray) -> np.ndarray:
        time.sleep(seconds)
        with open(log, "a") as f:
            f.write("".join(f"{int(row[0])}\n" for row in batch))
        return batch * 2 + 1
    return model


def serve_http(svc: InferenceService, where: str) -> None:
    import uvicorn

    from fastloop.serve import App
    host, port = where.rsplit(":", 1)
    uvicorn.Server(uvicorn.Config(App(svc), host=host, port=int(port), log_level="warning", lifespan="on")).run()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--max-batch", type=int, default=1)
    parser.add_argument("--visibility-timeout-s", type=float, default=1.0)
    parser.add_argument("--model", default="affine")
    parser.add_argument("--model-s", type=float, default=0.0)
    parser.add_argument("--log", help="--model logged: where it writes the tags of the rows it ran")
    parser.add_argument("--http", help="HOST:PORT: serve the HTTP front there until SIGTERM/SIGINT")
    args = parser.parse_args()
    model = {"affine": affine, "block": block, "slow": slow(args.model_s),
             "logged": logged(args.model_s, args.log)}[args.model]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    svc = create_service(model, num_workers=args.num_workers, max_batch=args.max_batch, max_delay_s=0,
                         store=RedisStore(args.url, prefix=args.prefix),
                         queue=RedisQueue(visibility_timeout_s=args.visibility_timeout_s))
    print("ready", flush=True)
    if args.http:
        try:
            serve_http(svc, args.http)
        except KeyboardInterrupt:
            pass
    else:
        stop.wait()
    svc.close(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

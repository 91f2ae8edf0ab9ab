"""Requests of several rows on the queue in Redis: one job (one entry), its rows run in model
calls of at most max_batch rows beside other jobs' rows, and come back in order; a failed row
fails only its own entry."""

from __future__ import annotations

import numpy as np
import pytest

from redis_fixtures import prefix, redis, server  # noqa: F401 (fixtures; skips without Redis)

from fastloop.serve import Input, JobFailed, RedisQueue, RedisStore, RowsFailed, create_service  # noqa: E402


class Model:
    """Doubles; fails a row whose first value is negative; records each call's batch size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.sizes.append(len(batch))
        if (batch[:, 0] < 0).any():
            raise ValueError("a negative row")
        return batch * 2


def test_a_job_of_several_rows_runs_in_calls_of_at_most_max_batch_and_comes_back_in_order(server, prefix):
    model = Model()
    store = RedisStore(server.url, prefix=prefix)
    with create_service(model, num_workers=1, max_batch=4, store=store, queue=RedisQueue(),
                        inputs=Input("float64", (2,))) as svc:
        x = np.arange(20, dtype=np.float64).reshape(10, 2)
        job = svc.submit(x)
        np.testing.assert_array_equal(svc.result(job, timeout=20), 2 * x)
        assert svc.record(job).rows == 10 and max(model.sizes) <= 4 and sum(model.sizes) == 10
        x[3, 0] = -1
        with pytest.raises(RowsFailed) as failed:
            svc.result(svc.submit(x), timeout=20)
        assert set(failed.value.errors) == {3} and failed.value.result[4].tolist() == [16.0, 18.0]
        with pytest.raises(JobFailed, match="every one of the 2 rows failed"):
            svc.result(svc.submit(-np.ones((2, 2))), timeout=20)

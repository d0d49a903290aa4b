"""MicroBatcher: batches form under concurrency, never beyond max_batch_size, and every caller
gets exactly its own rows back."""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np
import pytest

from fastinfer.serving.batching import MicroBatcher

pytestmark = pytest.mark.anyio


def slow_double(seconds: float = 0.03):
    calls: list[int] = []

    def run(x: np.ndarray) -> np.ndarray:
        calls.append(len(x))
        time.sleep(seconds)
        return x * 2

    return run, calls


def rows(i: int, n: int = 1) -> np.ndarray:
    return np.full((n, 3), i, dtype=np.float32)


async def test_concurrent_calls_are_batched_and_answered_in_order() -> None:
    run, calls = slow_double()
    batcher = MicroBatcher(run, max_batch_size=8, max_latency_ms=0)
    results = await asyncio.gather(*(batcher.submit(rows(i)) for i in range(20)))
    for i, out in enumerate(results):
        assert out.shape == (1, 3) and np.all(out == 2 * i)
    assert sum(calls) == 20
    assert max(calls) == 8  # requests queued behind a running batch were taken together
    assert all(c <= 8 for c in calls)


async def test_an_idle_model_runs_a_lone_request_at_once() -> None:
    run, calls = slow_double(0)
    batcher = MicroBatcher(run, max_batch_size=8, max_latency_ms=0)
    out = await batcher.submit(rows(5, n=2))
    assert np.all(out == 10) and calls == [2]


async def test_multi_row_requests_never_exceed_the_limit() -> None:
    run, calls = slow_double()
    batcher = MicroBatcher(run, max_batch_size=4, max_latency_ms=0)
    results = await asyncio.gather(*(batcher.submit(rows(i, n=3)) for i in range(5)))
    assert [len(r) for r in results] == [3] * 5
    assert all(np.all(r == 2 * i) for i, r in enumerate(results))
    assert all(c <= 4 for c in calls)


async def test_linger_collects_companions_for_an_idle_model() -> None:
    run, calls = slow_double(0)
    batcher = MicroBatcher(run, max_batch_size=8, max_latency_ms=200)
    first = asyncio.ensure_future(batcher.submit(rows(1)))
    await asyncio.sleep(0.01)
    await asyncio.gather(first, batcher.submit(rows(2)))
    assert calls == [2]


def broken(x: np.ndarray) -> np.ndarray:
    raise RuntimeError("model exploded")


@pytest.mark.parametrize(
    ("model", "said"), [(broken, "model exploded"), (lambda x: x[:1], "returned 1 rows for a batch of [36]")]
)
async def test_a_model_failure_reaches_every_caller_of_the_batch(model, said: str) -> None:
    """A model that raises, or returns the wrong row count: each caller hears why."""
    batcher = MicroBatcher(model, max_batch_size=8, max_latency_ms=0)
    calls = (batcher.submit(rows(i, n=3)) for i in range(3))
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
    assert all(isinstance(r, RuntimeError) and re.search(said, str(r)) for r in results), results


async def test_cancelled_callers_are_dropped_from_the_queue() -> None:
    run, calls = slow_double()
    batcher = MicroBatcher(run, max_batch_size=8, max_latency_ms=0)
    busy = asyncio.ensure_future(batcher.submit(rows(0)))
    await asyncio.sleep(0.005)  # the model is now busy with `busy`
    gone = asyncio.ensure_future(batcher.submit(rows(1)))
    await asyncio.sleep(0)
    gone.cancel()
    kept = await batcher.submit(rows(2))
    await busy
    assert np.all(kept == 4)
    assert sum(calls) == 2  # the cancelled request never reached the model


def test_invalid_batch_size() -> None:
    with pytest.raises(ValueError):
        MicroBatcher(lambda x: x, max_batch_size=0, max_latency_ms=0)


async def test_a_malformed_job_fails_its_batch_and_every_caller_hears_why() -> None:
    """One job whose rows do not fit the others' (np.concatenate raises) must not end the batcher:
    every caller taken with it gets the error, and the next call is served."""
    run, _calls = slow_double()
    batcher = MicroBatcher(run, max_batch_size=8, max_latency_ms=0)
    first = asyncio.ensure_future(batcher.submit(rows(0)))  # runs alone, keeps the model busy
    await asyncio.sleep(0.005)
    queued = [batcher.submit(rows(1)), batcher.submit(np.zeros((1, 5), np.float32)), batcher.submit(rows(2))]
    results = await asyncio.wait_for(asyncio.gather(first, *queued, return_exceptions=True), 5)
    after = await asyncio.wait_for(batcher.submit(rows(3)), 5)
    assert np.all(results[0] == 0)
    assert all(isinstance(r, ValueError) for r in results[1:]), results
    assert np.all(after == 6)


@pytest.mark.parametrize(
    "images, message",
    [
        ([[1, 2]], "numpy array"),
        (np.zeros((1, 224, 224, 3), np.float32), "uint8"),
        (np.zeros((224, 224, 3), np.uint8), r"\[N,S,S,3\]"),
        (np.zeros((1, 3, 224, 224), np.uint8), r"\[N,S,S,3\]"),
        (np.zeros((1, 16, 16, 3), np.uint8), r"\[N,S,S,3\]"),  # smaller than any model takes
        (np.zeros((0, 224, 224, 3), np.uint8), "1..256"),
        (np.zeros((257, 224, 224, 3), np.uint8), "1..256"),
    ],
    ids=["list", "float32", "no batch axis", "NCHW", "too small", "empty", "too many"],
)
def test_runners_refuse_malformed_arrays(images, message: str) -> None:
    from fastinfer.engines import check_batch

    with pytest.raises(ValueError, match=message):
        check_batch(images)


async def test_work_whose_deadline_passed_while_it_queued_is_dropped_not_run() -> None:
    """A request answered 504 by the front is not computed by the model afterwards."""
    from fastinfer.serving.batching import Expired

    run, calls = slow_double(0.2)
    batcher = MicroBatcher(run, max_batch_size=2, max_latency_ms=0)

    async def late(call):  # queued on the model thread behind the first batch
        await asyncio.sleep(0.05)
        return await call

    soon = time.monotonic() + 0.1  # passes while the first batch (0.2 s) runs
    first, expired, later, now = await asyncio.gather(
        batcher.submit(rows(0, 2)),
        batcher.submit(rows(1, 2), deadline=soon),
        batcher.submit(rows(2, 2), deadline=time.monotonic() + 60),
        late(batcher.run_now(rows(3), deadline=soon)),
        return_exceptions=True,
    )
    assert np.all(first == 0) and np.all(later == 4)
    assert isinstance(expired, Expired) and isinstance(now, Expired)
    assert calls == [2, 2] and batcher.expired_rows == 3

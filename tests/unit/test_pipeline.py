"""The request pipeline without a server: a stand-in runner (a real model is not what is under
test here), real decoding, the real in-memory cache, the real CPU pool."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastinfer.catalog.store import PreprocessSpec, StoredModelInfo
from fastinfer.common.errors import BackendUnavailable, InvalidImage, RunnerNotLoaded, UnknownBackend
from fastinfer.common.schemas import BatchResponse, ClassifyResponse
from fastinfer.serving.cache import MemoryCache
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.live import LiveStats
from fastinfer.serving.pipeline import Image, Pipeline
from tests import images

CLASSES = [f"class {i}" for i in range(1000)]


def model(backend: str) -> StoredModelInfo:
    return StoredModelInfo(
        tag=f"resnet50-{backend}:v1",
        path="/nowhere",
        backend=backend,
        weights="random-init",
        source_hash="x",
        preprocess=PreprocessSpec(),
        categories=CLASSES,
    )


class StandInRunner:
    """Logits whose top-1 is the image's mean pixel value: different images, different answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, bool | None]] = []
        self.not_loaded: set[str] = set()
        self.engines = {"onnx": "stand-in 1.0 on CPU at fp32"}

    async def engine(self, backend: str) -> str:
        if backend in self.not_loaded:
            raise RunnerNotLoaded(f"{backend} could not be loaded")
        return self.engines.get(backend, f"stand-in for {backend}")

    async def __call__(self, backend: str, pixels: np.ndarray, batched: bool | None, engine: str) -> np.ndarray:
        assert pixels.dtype == np.uint8 and pixels.shape[1:] == (224, 224, 3)
        assert engine == self.engines.get(backend, f"stand-in for {backend}"), "computed by the engine it names"
        self.calls.append((backend, len(pixels), batched))
        if backend in self.not_loaded:
            raise RunnerNotLoaded(f"{backend} could not be loaded")
        logits = np.zeros((len(pixels), 1000), np.float32)
        for row, image in enumerate(pixels):
            logits[row, int(image.mean())] = 10.0
        return logits


def make(
    unavailable: dict[str, str] | None = None, runner: Any = None, models: dict[str, Any] | None = None
) -> tuple[Pipeline, Any]:
    """A pipeline over a stand-in runner (StandInRunner unless given) serving ``models`` (onnx, pytorch, coreml)."""
    runner = runner or StandInRunner()
    models = models or {n: model(n) for n in ["onnx", "pytorch", "coreml"]}
    pipeline = Pipeline(
        list(models),
        models,
        lambda n: (unavailable or {}).get(n),
        runner,
        runner.engine,
        MemoryCache(max_entries=100, ttl_s=60),
        CpuPool(2),
        LiveStats(),
        max_pixels=50_000_000,
    )
    return pipeline, runner


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def grey(level: int) -> bytes:
    from PIL import Image as PILImage

    return images.encode(PILImage.new("RGB", (320, 240), (level, level, level)), "PNG")


def test_one_image_gives_a_typed_answer_then_a_cache_hit_without_inference() -> None:
    pipeline, runner = make()

    async def main() -> tuple[dict, dict]:
        first = await pipeline.classify(Image(grey(100)), "onnx", 3)
        again = await pipeline.classify(Image(grey(100)), "onnx", 3)
        return first, again

    first, again = run(main())
    ClassifyResponse.model_validate(first)  # the documented shape, keys in their order
    assert list(first) == [*ClassifyResponse.model_json_schema(by_alias=True)["properties"]]
    assert first["class"] == "class 100" and first["cached"] is False and len(first["top_k"]) == 3
    assert again["cached"] is True and again["class"] == "class 100"
    assert again["timings_ms"]["inference"] == 0 and again["timings_ms"]["decode"] == 0
    assert runner.calls == [("onnx", 1, None)]  # one inference for two requests


def test_bypass_never_reads_or_writes_the_cache() -> None:
    pipeline, runner = make()

    async def main() -> None:
        await pipeline.classify(Image(grey(50)), "onnx", 5, bypass=True)
        second = await pipeline.classify(Image(grey(50)), "onnx", 5)
        assert second["cached"] is False  # the bypassed request stored nothing

    run(main())
    assert len(runner.calls) == 2
    assert pipeline.cache.stats.bypasses == 1


def test_no_store_reads_the_cache_but_never_writes_it() -> None:
    """Cache-Control: no-store (RFC 9111 §5.2.1.5): a stored answer may be read; a computed one is not kept."""
    pipeline, runner = make()

    async def main() -> list[list[bool]]:
        await pipeline.classify(Image(grey(70)), "onnx", 5)  # stored
        held = await pipeline.classify(Image(grey(70)), "onnx", 5, store=False)
        fresh = [await pipeline.classify(Image(grey(71)), "onnx", 5, store=False)]
        fresh.append(await pipeline.classify(Image(grey(71)), "onnx", 5))  # the no-store answer was not kept
        pair = [Image(grey(72)), Image(grey(73))]
        batches = [await pipeline.classify_many(pair, "onnx", 5, store=False) for _ in range(2)]
        return [[held["cached"]], [a["cached"] for a in fresh], *[[a["cached"] for a in b] for b in batches]]

    assert run(main()) == [[True], [False, False], [False, False], [False, False]]
    assert runner.calls == [("onnx", 1, None)] * 3 + [("onnx", 2, None)] * 2  # each no-store miss computed
    assert pipeline.cache.stats.bypasses == 0  # not a bypass: the cache was read


def test_unknown_and_unavailable_backends_say_why() -> None:
    pipeline, _ = make({"coreml": "CoreML prediction needs macOS"})
    with pytest.raises(UnknownBackend, match="valid backends: onnx, pytorch, coreml"):
        run(pipeline.classify(Image(grey(1)), "tpu", 5))
    with pytest.raises(BackendUnavailable, match="needs macOS"):
        run(pipeline.classify(Image(grey(1)), "coreml", 5))


def test_a_batch_is_one_runner_call_answered_in_order_with_per_image_errors() -> None:
    pipeline, runner = make()
    sent = [Image(grey(10)), Image(b"not an image"), Image(grey(30)), Image(b""), Image(grey(20))]
    results = run(pipeline.classify_many(sent, "onnx", 1, bypass=True))
    BatchResponse.model_validate({"results": results})
    assert [r.get("class") for r in results] == ["class 10", None, "class 30", None, "class 20"]
    assert results[1]["error"]["code"] == "invalid_image" and results[3]["error"]["code"] == "invalid_image"
    assert runner.calls == [("onnx", 3, None)]  # the three good images, together


def test_a_batch_uses_the_cache_per_image() -> None:
    pipeline, runner = make()

    async def main() -> list[dict]:
        await pipeline.classify(Image(grey(40)), "onnx", 5)  # cached from a single request
        return await pipeline.classify_many([Image(grey(41)), Image(grey(40))], "onnx", 5)

    results = run(main())
    assert [r["cached"] for r in results] == [False, True]
    assert runner.calls == [("onnx", 1, None), ("onnx", 1, None)]  # only the new image was inferred


def test_compare_skips_a_runner_that_could_not_load_and_with_none_left_is_a_503() -> None:
    pipeline, runner = make({"coreml": "CoreML prediction needs macOS"})
    runner.not_loaded.add("pytorch")
    results, skipped = run(pipeline.compare(Image(grey(60)), 5, ["onnx", "pytorch", "coreml"]))
    assert [r["backend"] for r in results] == ["onnx"]
    assert sorted(skipped) == ["coreml", "pytorch"]
    assert results[0]["cached"] is False
    runner.not_loaded.add("onnx")
    with pytest.raises(BackendUnavailable, match="No backend can run here"):
        run(pipeline.compare(Image(grey(60)), 5, ["onnx", "pytorch", "coreml"]))


def test_a_batch_decodes_at_most_one_image_per_core_at_a_time() -> None:
    """The CPU pool serves first come first served: a batch that queued all its decodes at once would make
    every other request wait behind 32 costly images."""
    pipeline, _ = make()
    running, peak = 0, 0
    real = pipeline._prepare

    async def counting(*args, **kwargs):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(0.01)
            return await real(*args, **kwargs)
        finally:
            running -= 1

    pipeline._prepare = counting  # type: ignore[method-assign]
    results = run(pipeline.classify_many([Image(grey(i)) for i in range(8)], "onnx", 1, bypass=True))
    assert [r["class"] for r in results] == [f"class {i}" for i in range(8)]
    assert peak == pipeline.cpu.workers == 2


def test_the_same_image_twice_in_a_batch_is_decoded_and_inferred_once() -> None:
    pipeline, runner = make()
    a, b = grey(40), grey(90)
    results = run(pipeline.classify_many([Image(a), Image(b), Image(a), Image(a)], "onnx", 3))
    assert runner.calls == [("onnx", 2, None)]  # a and b, once each
    assert [r["class_index"] for r in results] == [40, 90, 40, 40]
    assert results[0] == results[2] == results[3]
    again = run(pipeline.classify_many([Image(b), Image(b)], "onnx", 3))
    assert [r["cached"] for r in again] == [True, True] and len(runner.calls) == 1
    # An invalid image sent twice is one error, in both its slots.
    bad = run(pipeline.classify_many([Image(b"junk"), Image(b"junk")], "onnx", 3, bypass=True))
    assert [r["error"]["code"] for r in bad] == ["invalid_image", "invalid_image"]


def test_a_batch_is_one_request_in_live_stats() -> None:
    pipeline, _ = make()
    run(pipeline.classify_many([Image(grey(level)) for level in (10, 20, 30, 40)], "onnx", 3))
    run(pipeline.classify(Image(grey(50)), "onnx", 3))
    run(pipeline.classify_many([Image(grey(10)), Image(grey(20))], "onnx", 3))  # both from the cache
    live = pipeline.live.snapshot()
    assert (live["served"], live["images"], live["cached"]) == (3, 7, 2)
    assert len(pipeline.live._latencies["onnx"]) == 2  # the all-cached batch is not an inference request


def test_a_batch_observes_its_stages_once(monkeypatch) -> None:
    from fastinfer.serving import metrics

    seen: list[tuple[str, dict[str, float]]] = []
    monkeypatch.setattr(metrics, "observe_stages", lambda backend, t: seen.append((backend, dict(t))))
    pipeline, _ = make()
    run(pipeline.classify_many([Image(grey(level)) for level in (11, 22, 33)], "onnx", 3))
    ((backend, stages),) = seen
    assert backend == "onnx" and set(stages) >= {"read", "cache", "decode", "preprocess", "inference", "total"}
    assert stages["total"] >= stages["inference"] > 0


def test_cached_copies_of_a_repeated_image_are_each_counted_and_bad_images_never_call_the_runner() -> None:
    pipeline, runner = make()
    same = [Image(grey(60))] * 4
    run(pipeline.classify_many(same, "onnx", 3))
    run(pipeline.classify_many(same, "onnx", 3))  # all four answered by the cache
    bad = run(pipeline.classify_many([Image(b"junk"), Image(images.truncated_jpeg())], "onnx", 3))
    assert [r["error"]["code"] for r in bad] == ["invalid_image", "invalid_image"]
    assert runner.calls == [("onnx", 1, None)]  # no inference for the bad batch, nothing cached
    live = pipeline.live.snapshot()
    assert (live["served"], live["images"], live["cached"]) == (3, 10, 4)
    assert len(pipeline.live._latencies["onnx"]) == 1


def test_an_answer_names_its_engine_and_another_engine_never_serves_it() -> None:
    """Two servers on one cache whose engines compute otherwise (OpenVINO at BF16 and at f32, say) never
    answer with each other's numbers (a key of the model alone would); the same engine shares them."""
    pipeline, runner = make()

    async def main() -> list[dict]:
        first = await pipeline.classify(Image(grey(120)), "onnx", 3)
        runner.engines["onnx"] = "stand-in 1.0 on CPU at bf16"
        other = await pipeline.classify(Image(grey(120)), "onnx", 3)
        runner.engines["onnx"] = "stand-in 1.0 on CPU at fp32"
        again = await pipeline.classify(Image(grey(120)), "onnx", 3)
        return [first, other, again]

    first, other, again = run(main())
    assert first["engine"] == again["engine"] == "stand-in 1.0 on CPU at fp32"
    assert other["engine"] == "stand-in 1.0 on CPU at bf16" and other["cached"] is False
    assert again["cached"] is True
    assert len(runner.calls) == 2


CRASHERS = Path(__file__).parent.parent / "data" / "decode_crashers"


@pytest.mark.parametrize(
    ("file", "said"),
    [("tiff-float-tile-typeerror.tif", "could not be decoded"), ("dds-pixel-format-flags-0.dds", "not an image in")],
)
def test_an_image_pillow_cannot_read_is_a_400_alone_and_its_batch_is_answered(file: str, said: str) -> None:
    """A fuzzed TIFF makes Pillow raise TypeError (a 192-byte DDS raised NotImplementedError; DDS is not opened
    at all): a 400 for that image, not a 500 for the request and its whole batch."""
    bad = (CRASHERS / file).read_bytes()
    pipeline, _ = make()
    with pytest.raises(InvalidImage, match=said):
        run(pipeline.classify(Image(bad), "onnx", 5, bypass=True))
    results = run(pipeline.classify_many([Image(grey(10)), Image(bad)], "onnx", 1, bypass=True))
    assert results[0]["class"] == "class 10" and results[1]["error"]["code"] == "invalid_image"


class NonFiniteRunner(StandInRunner):
    """onnx's scores NaN for images darker than 50, as a model whose weights overflow would give."""

    async def __call__(self, backend: str, pixels: np.ndarray, batched: bool | None, engine: str) -> np.ndarray:
        logits = await super().__call__(backend, pixels, batched, engine)
        if backend == "onnx":
            logits[pixels.reshape(len(pixels), -1).mean(axis=1) < 50] = np.nan
        return logits


def test_nan_scores_are_a_clear_503_never_cached_and_alone_in_a_batch() -> None:
    pipeline, runner = make(runner=NonFiniteRunner())
    for _ in range(2):  # the second time too: nothing was cached
        with pytest.raises(BackendUnavailable, match=r"NaN or infinite scores.*broken"):
            run(pipeline.classify(Image(grey(10)), "onnx", 5))
    assert len(runner.calls) == 2
    results = run(pipeline.classify_many([Image(grey(10)), Image(grey(90))], "onnx", 1))
    assert results[0]["error"]["code"] == "backend_unavailable" and results[1]["class"] == "class 90"
    answered, skipped = run(pipeline.compare(Image(grey(90)), 1, ["onnx", "pytorch"]))
    assert [a["backend"] for a in answered] == ["onnx", "pytorch"] and skipped == []
    answered, skipped = run(pipeline.compare(Image(grey(10)), 1, ["onnx", "pytorch"]))
    assert [a["backend"] for a in answered] == ["pytorch"] and skipped == ["onnx"]
    with pytest.raises(BackendUnavailable, match=r"resnet50-onnx:v1 computed NaN"):  # none answered: said why
        run(pipeline.compare(Image(grey(10)), 1, ["onnx"]))

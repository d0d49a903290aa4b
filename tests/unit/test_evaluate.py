"""``fastinfer evaluate --url`` (issue 34): scored by the server's own labels, without this machine's store;
a bad photo skipped and counted, never a whole backend lost; a URL that is not FastInfer's said in one line;
the speed beside the accuracy only a bench of the same family's; ``make bench MODEL=...`` measuring that family.

Most of it talks to a stand-in server (a few lines of http.server answering GET /backends and POST /classify as
FastInfer does): the cases are a server's answers a real one will not give on demand (labels that differ from
this machine's store, a 500 on one backend, a URL that is not FastInfer's). The last test serves a family with
the real ``bentoml serve`` and evaluates it from an empty model store.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastinfer import cli
from fastinfer.catalog import choice
from fastinfer.common import hardware
from fastinfer.measure import evaluate as ev
from load_tests.service import ROOT

LABELS = ["blue", "green", "purple", "red"]  # the server's, in its index order; "purple" has no folder here
COLOURS = {"red": (220, 30, 30), "green": (30, 220, 30), "blue": (30, 30, 220)}
MAX_BYTES = 200_000


def photos(root: Path) -> Path:
    """Two photos per colour the stand-in tells apart, a yellow one filed under green (it answers red first,
    green second: a top-1 miss, a top-k hit), a photo over its byte limit and a file that is no image."""
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True)
        for i in range(1 if name == "blue" else 2):
            Image.new("RGB", (64 + i, 48), colour).save(root / name / f"{i}.png")
    Image.new("RGB", (64, 48), (230, 200, 30)).save(root / "green" / "yellow.png")  # green's folder, red first
    noise = np.random.default_rng(0).integers(0, 256, (400, 400, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "blue" / "big.png")  # ~480 kB: over MAX_BYTES
    (root / "blue" / "bad.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    return root


def ranked_labels(data: bytes) -> list[str]:
    """The stand-in's classifier: the labels by how much of their colour the photo has."""
    mean = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=float).mean(axis=(0, 1))
    score = {"red": mean[0], "green": mean[1], "blue": mean[2], "purple": (mean[0] + mean[2]) / 3}
    return sorted(LABELS, key=lambda label: -score[label])


class StandIn:
    """GET /backends and POST /classify as a FastInfer server answers them (``backends``: its body; ``fail``:
    backends whose every answer is a 500)."""

    def __init__(self, labels: list[str] | None = LABELS) -> None:
        family: dict[str, Any] = {"name": "shapes", "stored": True, "num_classes": len(LABELS)}
        if labels is not None:
            family["labels"] = labels
        self.backends: Any = {
            "family": family,
            "backends": [
                {"name": "pytorch", "available": True, "runs_on": {}},
                {"name": "onnx-int8", "available": True, "runs_on": {}},
                {"name": "openvino", "available": False, "reason": "OpenVINO is not installed"},
            ],
        }
        self.raw_backends: bytes | None = None  # answered as is instead, when set
        self.fail: set[str] = set()
        self.asked: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, status: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.answer(200, stand_in.raw_backends or stand_in.backends)

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                if length > MAX_BYTES:
                    return self.answer(413, {"error": {"code": "payload_too_large", "message": "over 200,000 bytes"}})
                head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
                parts = {
                    p.get_param("name", header="content-disposition"): p.get_payload(decode=True)
                    for p in BytesParser(policy=HTTP).parsebytes(head + body).iter_parts()
                }
                backend, k = parts["backend"].decode(), int(parts["top_k"])
                stand_in.asked.append(backend)
                if backend in stand_in.fail:
                    return self.answer(500, {"error": {"code": "internal_error", "message": "the runner died"}})
                try:
                    ranked = ranked_labels(parts["image"])
                except Exception:
                    return self.answer(400, {"error": {"code": "invalid_image", "message": "not an image"}})
                # Indices in the server's own order: scoring them against another label list would be wrong.
                top = [{"label": label, "index": LABELS.index(label), "score": 0.1} for label in ranked[:k]]
                self.answer(200, {"class": top[0]["label"], "class_index": top[0]["index"], "top_k": top})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.close()


@pytest.fixture
def no_bench(monkeypatch, tmp_path) -> Path:
    """Where `make bench` would leave its result, empty: the speed column is this test's own."""
    path = tmp_path / "bench" / "results.json"
    monkeypatch.setattr(choice, "served_result", lambda: path)
    return path


def quiet(what: str, done: int, total: int) -> None:
    pass


def run_cli(args: list[str], tmp_path: Path, capsys) -> tuple[int, str, str]:
    """The exit status, stdout and what stderr says beside the progress lines ("onnx-int8: 8/8 images")."""
    out = ["--json", str(tmp_path / "e.json"), "--plot", str(tmp_path / "e.png")]
    rc = cli.main(["evaluate", *args, *out])
    captured = capsys.readouterr()
    said = [line for line in captured.err.strip().splitlines() if not re.fullmatch(r".+: \d+/\d+ images", line)]
    return rc, captured.out, "\n".join(said)


# --- scored by the server's labels, no local store ----------------------------------------------------


def test_url_scores_each_answer_by_its_label_against_the_server_s_labels(stand_in, no_bench, tmp_path) -> None:
    """Family "shapes" is in no store here: the labels are the server's, each answer's label is scored against
    its photo's folder; a photo too large or not an image is skipped and counted, the backend still measured."""
    root = photos(tmp_path / "eval")
    report = ev.evaluate(root, "pytorch,onnx-int8,openvino", url=stand_in.url, progress=quiet)
    rows = {r.backend: r for r in report.rows}
    for backend in ("pytorch", "onnx-int8"):
        row = rows[backend]
        assert (row.status, row.images, row.top1, row.top5) == ("measured", 6, 5 / 6, 1.0), row
    assert rows["onnx-int8"].drop_pp == 0 and report.reference == f"pytorch (served by {stand_in.url})"
    assert rows["openvino"].status == "not measured" and "OpenVINO is not installed" in rows["openvino"].note
    skipped = {Path(s.path).name: s.why for s in report.skipped}
    assert set(skipped) == {"big.png", "bad.jpg"}
    assert "payload_too_large" in skipped["big.png"] and "invalid_image" in skipped["bad.jpg"]
    assert report.images == 6 and report.labels == 4 and report.unevaluated == ["purple"]
    assert report.extra["family"] == "shapes" and "the server" in report.extra["labels_from"]


def test_without_the_server_s_labels_answers_are_scored_by_their_names(tmp_path, no_bench) -> None:
    server = StandIn(labels=None)
    try:
        report = ev.evaluate(photos(tmp_path / "eval"), url=server.url, progress=quiet)
    finally:
        server.close()
    row = next(r for r in report.rows if r.backend == "onnx-int8")
    assert (row.status, row.images, row.top1, row.top5) == ("measured", 6, 5 / 6, 1.0)
    assert "folders' names" in report.extra["labels_from"] and report.unevaluated == []


def test_a_folder_that_is_not_one_of_the_server_s_labels_is_one_line(stand_in, tmp_path, capsys) -> None:
    root = photos(tmp_path / "eval")
    (root / "cyan").mkdir()
    rc, _, err = run_cli([str(root), "--url", stand_in.url], tmp_path, capsys)
    assert rc == 1 and "\n" not in err and "'cyan'" in err and "not among the family's 4 labels" in err


def test_a_backend_whose_server_fails_is_a_row_saying_why(stand_in, no_bench, tmp_path) -> None:
    stand_in.fail = {"onnx-int8"}
    report = ev.evaluate(photos(tmp_path / "eval"), url=stand_in.url, progress=quiet)
    rows = {r.backend: r for r in report.rows}
    assert rows["pytorch"].status == "measured"
    failed = rows["onnx-int8"]
    assert failed.status == "not measured" and "500 internal_error: the runner died" in failed.note


@pytest.mark.filterwarnings("error:Glyph")  # a control character drawn as a missing glyph
def test_a_server_s_text_is_shown_as_text(stand_in, no_bench, tmp_path, capsys) -> None:
    """Issue 41, finding 8: a family or precision name in mathtext crashed the plot after the JSON was written;
    a backend name with an escape sequence was printed raw (and cleared the terminal). The JSON keeps them as
    the server said them; the plot draws them as typed, the terminal shows each control character escaped."""
    clear, backwards, fraction = "pytorch\x1b[2J", "onnx\u202e\r", "$\\frac{$"
    stand_in.backends["family"]["name"] = f"shapes {fraction}"
    stand_in.backends["backends"] = [
        {"name": clear, "available": True, "runs_on": {"precision": fraction}},
        {"name": backwards, "available": True, "runs_on": {}},
    ]
    stand_in.fail = {backwards}  # its row: not measured, the server's answer as its note
    plot = tmp_path / "e.png"
    rc = cli.main(["evaluate", str(photos(tmp_path / "eval")), "--url", stand_in.url, "--json",
                   str(tmp_path / "e.json"), "--plot", str(plot)])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0 and plot.stat().st_size > 0, err
    written = json.loads((tmp_path / "e.json").read_text())
    assert written["family"] == f"shapes {fraction}" and [r["backend"] for r in written["rows"]] == [clear, backwards]
    assert written["rows"][0]["precision"] == fraction.lower()
    assert not any(c in out + err for c in "\x1b\r\u202e"), out + err
    assert "| pytorch\\x1b[2J | $\\frac{$ | 6 |" in out and "| onnx\\u202e\\r | — |" in out, out
    assert "pytorch\\x1b[2J: 8/8 images" in err, err  # the progress lines


# --- one line, non-zero, when nothing can be measured -------------------------------------------------


@pytest.mark.parametrize(
    ("body", "said"),
    [({}, "lists no backends"), (b"<html>hello</html>", "is not JSON"), ([1, 2], "lists no backends")],
)
def test_a_url_that_is_not_fastinfer_is_one_line(stand_in, tmp_path, capsys, body, said) -> None:
    stand_in.raw_backends = body if isinstance(body, bytes) else json.dumps(body).encode()
    rc, _, err = run_cli([str(photos(tmp_path / "eval")), "--url", stand_in.url], tmp_path, capsys)
    assert rc == 1 and "\n" not in err and said in err and "does not answer as a FastInfer server" in err
    assert not (tmp_path / "e.json").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--backends", ","], "names no backend"),
        (["--backends", "openvino"], "no backend was measured: openvino: "),
        (["--model", "Bad Name"], "cannot name a model family"),
        (["--model", "other"], "serves model family 'shapes', not 'other' (--model)"),
    ],
)
def test_nothing_to_measure_is_one_line_and_exit_1(stand_in, no_bench, tmp_path, capsys, args, said) -> None:
    rc, out, err = run_cli([str(photos(tmp_path / "eval")), "--url", stand_in.url, *args], tmp_path, capsys)
    assert rc == 1 and "\n" not in err and said in err, err
    assert err.startswith("fastinfer evaluate: ") and out == ""


def test_every_backend_failing_is_exit_1_naming_each(stand_in, no_bench, tmp_path, capsys) -> None:
    stand_in.fail = {"pytorch", "onnx-int8"}
    rc, _, err = run_cli([str(photos(tmp_path / "eval")), "--url", stand_in.url], tmp_path, capsys)
    assert rc == 1 and "\n" not in err and err.startswith("fastinfer evaluate: no backend was measured: ")
    assert "pytorch: 0.png: 500 internal_error" in err and "onnx-int8: 0.png: 500 internal_error" in err


# --- the speed beside it: this family's -----------------------------------------------------------------


def bench(path: Path, family: str | None) -> Path:
    result: dict[str, Any] = {
        "hardware": hardware.probe(),
        "runs": [{"scenario": "inference", "users": choice.SERVED_USERS, "backend": "onnx-int8", "req_per_s": 42.0}],
    }
    if family is not None:
        result["family"] = family
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return path


@pytest.mark.parametrize(("benched", "paired"), [("shapes", 42.0), ("resnet50", None), (None, None)])
def test_the_speed_beside_the_accuracy_is_a_bench_of_the_same_family(
    stand_in, no_bench, tmp_path, benched, paired
) -> None:
    """A results.json without a family is resnet50's (from before families): not shapes' speed either."""
    bench(no_bench, benched)
    report = ev.evaluate(photos(tmp_path / "eval"), url=stand_in.url, progress=quiet)
    assert next(r for r in report.rows if r.backend == "onnx-int8").req_per_s == paired
    if paired is None:
        assert f"model family '{benched or 'resnet50'}', not 'shapes'" in report.extra["req_per_s_source"]
    assert ev.plot(report, tmp_path / "e.png").stat().st_size > 0


def test_the_server_s_own_default_choice_still_reads_any_family_s_bench(tmp_path) -> None:
    """choice.served_here without a family (the server's default backend) is as before."""
    assert choice.served_here(bench(tmp_path / "r.json", "shapes"), hardware.probe())[0] == {"onnx-int8": 42.0}


@pytest.mark.parametrize("target", ["bench", "tune", "tune-check"])
def test_make_bench_and_tune_measure_the_family_named(tmp_path, target) -> None:
    """`make bench MODEL=shop` runs its commands with FASTINFER_MODEL=shop (PY is a probe that prints it)."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()  # newer than pyproject.toml: nothing to install
    env = {k: v for k, v in os.environ.items() if k not in ("FASTINFER_MODEL", "MAKEFLAGS", "MODEL")}
    done = subprocess.run(
        ["make", "-s", target, "MODEL=shop", f"VENV={venv}", "PY=sh -c 'printenv FASTINFER_MODEL' probe"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["shop", "shop"], done.stdout + done.stderr


def test_make_bench_records_the_family_the_server_serves(stand_in) -> None:
    from load_tests.__main__ import family_of

    assert family_of(stand_in.url) == "shapes"
    stand_in.raw_backends = b"{}"
    assert family_of(stand_in.url) is None


# --- the real server, evaluated from an empty store -----------------------------------------------------

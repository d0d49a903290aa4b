"""``fastinfer evaluate --url``: scored by the server's own labels, a bad photo skipped, never a backend lost; its
speed (served, several clients, cache bypassed) and the frontier; ``make bench MODEL=...``'s family. Most of it
talks to a stand-in server (http.server answering GET /backends and POST /classify as FastInfer does): answers a
real one will not give on demand (other labels, a 500 on one backend, a URL that is not FastInfer's).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import threading
import time
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
        self.cache_control: set[str] = set()  # the Cache-Control of every POST /classify
        self.cached = False  # answer "cached": true, as a server whose cache was not bypassed
        self.delay_s = 0.0
        self.flip: set[str] = set()  # backends that answer their second label where the first is red
        self.busy = self.most_busy = 0  # requests being answered now, and the most at once
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, status: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                if self.command == "POST":  # done before the client can read the answer and send its next
                    with stand_in.lock:
                        stand_in.busy -= 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.answer(200, stand_in.raw_backends or stand_in.backends)

            def do_POST(self) -> None:
                with stand_in.lock:
                    stand_in.busy += 1
                    stand_in.most_busy = max(stand_in.most_busy, stand_in.busy)
                    stand_in.cache_control.add(self.headers.get("Cache-Control", ""))
                time.sleep(stand_in.delay_s)
                self.classify()

            def classify(self) -> None:
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
                    if backend in stand_in.flip and ranked[0] == "red":
                        ranked[:2] = ranked[1::-1]
                except Exception:
                    return self.answer(400, {"error": {"code": "invalid_image", "message": "not an image"}})
                # Indices in the server's own order: scoring them against another label list would be wrong.
                top = [{"label": label, "index": LABELS.index(label), "score": 0.1} for label in ranked[:k]]
                self.answer(200, {"class": top[0]["label"], "class_index": top[0]["index"], "top_k": top,
                                  "cached": stand_in.cached})  # fmt: skip

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # Polled every 20 ms, not 500: shutdown() waits for the poll, at every test's end.
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.close()


def quiet(what: str, done: int, total: int) -> None:
    pass


FAST = ev.Timing(seconds=0.3, clients=2, warmup_s=0.1, say=lambda line: None)  # timed, but briefly
QUICK = ["--seconds", "0.3", "--clients", "2"]


def run_cli(args: list[str], tmp_path: Path, capsys) -> tuple[int, str, str]:
    """The exit status, stdout and what stderr says beside the progress lines ("onnx-int8: 8/8 images") and the
    timing's ("onnx-int8: timing ...", "onnx-int8: 12.5 images/s")."""
    out = ["--json", str(tmp_path / "e.json"), "--plot", str(tmp_path / "e.png"), *QUICK]
    rc = cli.main(["evaluate", *args, *out])
    captured = capsys.readouterr()
    timing = r".+: (\d+/\d+ images|timing .+|[\d.]+ images/s.*|no answer in time.*)"
    said = [line for line in captured.err.strip().splitlines() if not re.fullmatch(timing, line)]
    return rc, captured.out, "\n".join(said)


# --- scored by the server's labels, no local store ----------------------------------------------------


def test_url_scores_each_answer_by_its_label_against_the_server_s_labels(stand_in, tmp_path) -> None:
    """Family "shapes" is in no store here: the labels are the server's, each answer's label is scored against
    its photo's folder; a photo too large or not an image is skipped and counted, the backend still measured."""
    root = photos(tmp_path / "eval")
    report = ev.evaluate(root, "pytorch,onnx-int8,openvino", url=stand_in.url, progress=quiet, timing=FAST).report
    rows = {r.backend: r for r in report.rows}
    for backend in ("pytorch", "onnx-int8"):  # top-5 of 4 classes says nothing: not shown
        row = rows[backend]
        assert (row.status, row.images, row.top1, row.top5) == ("measured", 6, 5 / 6, None), row
    assert rows["onnx-int8"].drop_pp == 0 and report.reference == f"pytorch (served by {stand_in.url})"
    assert rows["openvino"].status == "not measured" and "OpenVINO is not installed" in rows["openvino"].note
    skipped = {Path(s.path).name: s.why for s in report.skipped}
    assert set(skipped) == {"big.png", "bad.jpg"}
    assert "payload_too_large" in skipped["big.png"] and "invalid_image" in skipped["bad.jpg"]
    assert report.images == 6 and report.labels == 4 and report.unevaluated == ["purple"]
    assert report.extra["family"] == "shapes" and "the server" in report.extra["labels_from"]


def test_without_the_server_s_labels_answers_are_scored_by_their_names(tmp_path) -> None:
    server = StandIn(labels=None)
    try:
        report = ev.evaluate(photos(tmp_path / "eval"), url=server.url, progress=quiet, timing=FAST).report
    finally:
        server.close()
    row = next(r for r in report.rows if r.backend == "onnx-int8")
    assert (row.status, row.images, row.top1, row.top5) == ("measured", 6, 5 / 6, None)
    assert "folders' names" in report.extra["labels_from"] and report.unevaluated == []


def test_a_folder_that_is_not_one_of_the_server_s_labels_is_one_line(stand_in, tmp_path, capsys) -> None:
    root = photos(tmp_path / "eval")
    (root / "cyan").mkdir()
    rc, _, err = run_cli([str(root), "--url", stand_in.url], tmp_path, capsys)
    assert rc == 1 and "\n" not in err and "'cyan'" in err and "not among the family's 4 labels" in err


def test_a_backend_whose_server_fails_is_a_row_saying_why(stand_in, tmp_path) -> None:
    stand_in.fail = {"onnx-int8"}
    report = ev.evaluate(photos(tmp_path / "eval"), url=stand_in.url, progress=quiet, timing=FAST)
    rows = {r.backend: r for r in report.rows}
    assert rows["pytorch"].status == "measured" and report.speeds["pytorch"].images_per_s
    assert "onnx-int8" not in report.speeds  # not timed: its accuracy failed
    failed = rows["onnx-int8"]
    assert failed.status == "not measured" and "500 internal_error: the runner died" in failed.note


@pytest.mark.filterwarnings("error:Glyph")  # a control character drawn as a missing glyph
def test_a_server_s_text_is_shown_as_text(stand_in, tmp_path, capsys) -> None:
    """A server's names in mathtext or with control characters: the JSON keeps them as said, the plot draws them as
    typed, the terminal shows each control character escaped."""
    clear, backwards, fraction = "pytorch\x1b[2J", "onnx\u202e\r", "$\\frac{$"
    stand_in.backends["family"]["name"] = f"shapes {fraction}"
    stand_in.backends["backends"] = [
        {"name": clear, "available": True, "runs_on": {"precision": fraction}},
        {"name": backwards, "available": True, "runs_on": {}},
    ]
    stand_in.fail = {backwards}  # its row: not measured, the server's answer as its note
    plot = tmp_path / "e.png"
    rc = cli.main(["evaluate", str(photos(tmp_path / "eval")), "--url", stand_in.url, "--json",
                   str(tmp_path / "e.json"), "--plot", str(plot), *QUICK])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0 and plot.stat().st_size > 0, err
    written = json.loads((tmp_path / "e.json").read_text())
    assert written["family"] == f"shapes {fraction}" and [r["backend"] for r in written["rows"]] == [clear, backwards]
    assert written["rows"][0]["precision"] == fraction.lower()
    assert not any(c in out + err for c in "\x1b\r\u202e"), out + err
    assert "| pytorch\\x1b[2J | $\\frac{$ | 6 |" in out and "| onnx\\u202e\\r | — |" in out, out
    assert "pytorch\\x1b[2J: 8/8 images" in err, err  # the progress lines


# --- one line, non-zero, when nothing can be measured -------------------------------------------------


NOT_FASTINFER = "does not answer as a FastInfer server: GET /backends "


@pytest.mark.parametrize(
    ("body", "args", "said"),
    [
        ({}, [], f"{NOT_FASTINFER}lists no backends"),
        (b"<html>hello</html>", [], f"{NOT_FASTINFER}is not JSON"),
        ([1, 2], [], f"{NOT_FASTINFER}lists no backends"),
        (None, ["--backends", ","], "names no backend"),
        (None, ["--backends", "openvino"], "no backend was measured: openvino: "),
        (None, ["--model", "Bad Name"], "cannot name a model family"),
        (None, ["--model", "other"], "serves model family 'shapes', not 'other' (--model)"),
    ],
)
def test_nothing_to_measure_is_one_line_and_exit_1(stand_in, tmp_path, capsys, body, args, said) -> None:
    if body is not None:  # a URL that is not FastInfer's
        stand_in.raw_backends = body if isinstance(body, bytes) else json.dumps(body).encode()
    rc, out, err = run_cli([str(photos(tmp_path / "eval")), "--url", stand_in.url, *args], tmp_path, capsys)
    assert rc == 1 and "\n" not in err and said in err, err
    assert err.startswith("fastinfer evaluate: ") and out == "" and not (tmp_path / "e.json").exists()


def test_every_backend_failing_is_exit_1_naming_each(stand_in, tmp_path, capsys) -> None:
    stand_in.fail = {"pytorch", "onnx-int8"}
    rc, _, err = run_cli([str(photos(tmp_path / "eval")), "--url", stand_in.url], tmp_path, capsys)
    assert rc == 1 and "\n" not in err and err.startswith("fastinfer evaluate: no backend was measured: ")
    assert "pytorch: 0.png: 500 internal_error" in err and "onnx-int8: 0.png: 500 internal_error" in err


# --- make bench: the family it measures ---------------------------------------------------------------------


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


def test_the_server_s_own_default_choice_still_reads_any_family_s_bench(tmp_path) -> None:
    """choice.served_here without a family (the server's default backend) is as before."""
    assert choice.served_here(bench(tmp_path / "r.json", "shapes"), hardware.probe())[0] == {"onnx-int8": 42.0}


@pytest.mark.parametrize("target", ["bench", "tune"])
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


# --- the speed: measured here, as make bench measures it -----------------------------------------------------


def test_each_backend_is_timed_by_several_clients_with_the_cache_bypassed(stand_in, tmp_path) -> None:
    """Served images/s per backend: every request bypasses the cache, the clients overlap, and the table says on
    which photos, at how many clients and on which CPU (the server's: its GET /backends says it)."""
    stand_in.delay_s = 0.02  # long enough for the two clients to overlap
    stand_in.backends["hardware"] = {"cpu": "Stand-in CPU 9000", "cores": 3}
    result = ev.evaluate(photos(tmp_path / "eval"), url=stand_in.url, progress=quiet, timing=FAST)
    for backend in ("pytorch", "onnx-int8"):
        speed = result.speeds[backend]
        assert speed.images_per_s and speed.images > 0 and speed.failures == 0 and speed.seconds == FAST.seconds
        assert speed.images_per_s < 2 / stand_in.delay_s  # no more than two clients' worth
    assert stand_in.cache_control == {"no-cache, no-store"}
    assert stand_in.asked.count("pytorch") > 7  # the accuracy pass's 7 requests (the 8th is too large), then timed
    table = result.table()
    assert "2 closed-loop clients" in table and "cache bypassed" in table and "posting 6 of the 6 photos" in table
    assert "CPU: Stand-in CPU 9000, 3 cores (the server's" in table
    speed = result.as_dict()["speed"]
    assert (speed["clients"], speed["seconds"], speed["cpu"].startswith("Stand-in CPU 9000")) == (2, 0.3, True)


def test_the_timing_keeps_its_clients_busy_and_counts_only_its_window(stand_in, tmp_path) -> None:
    import httpx

    stand_in.delay_s = 0.05
    three = ev.Timing(seconds=0.5, clients=3, warmup_s=0.2, say=lambda line: None)
    red = sorted((photos(tmp_path / "eval") / "red").iterdir())
    with httpx.Client(headers={"Cache-Control": "no-cache"}) as client:
        speed = ev.served_speed(client, stand_in.url, "pytorch", red, 2, three)
    assert stand_in.most_busy == 3  # three clients, each waiting for its answer
    assert 0 < speed.images_per_s <= 3 / 0.05  # three at a time, 50 ms each: 60/s at most, the warm-up's not counted
    assert speed.images == round(speed.images_per_s * 0.5) and len(stand_in.asked) > speed.images  # warm-up too


def test_a_cached_answer_while_timing_is_a_failure_not_a_speed(stand_in, tmp_path) -> None:
    stand_in.cached = True  # a server that ignored Cache-Control: its rate would be the cache's, not the backend's
    result = ev.evaluate(photos(tmp_path / "eval"), "pytorch", url=stand_in.url, progress=quiet, timing=FAST)
    speed = result.speeds["pytorch"]
    assert speed.images_per_s is None and speed.failures > 0 and "a cached answer" in speed.note
    assert result.fastest() is None and "no timed backend is within the limit" in result.table()


def test_each_backend_is_paired_with_pytorch_photo_by_photo_and_held_to_the_limit(stand_in, tmp_path) -> None:
    """onnx-int8 loses both red photos and gains the yellow one PyTorch gets wrong: 2 lost, 1 gained, 3 answers
    changed; its drop's interval is the build gate's (exact on the discordant pairs), and it is over the limit
    however fast it is."""
    stand_in.flip = {"onnx-int8"}
    result = ev.evaluate(photos(tmp_path / "eval"), url=stand_in.url, progress=quiet, timing=FAST, max_drop_pp=5)
    rows = {r.backend: r for r in result.rows}
    pairs = rows["onnx-int8"].paired
    assert (pairs.only_reference_right, pairs.only_backend_right, pairs.changed, pairs.images) == (2, 1, 3, 6)
    assert rows["onnx-int8"].drop_pp == pytest.approx(100 / 6) == pairs.drop_pp
    assert pairs.drop_low_pp < 100 / 6 < pairs.drop_high_pp
    assert rows["pytorch"].paired is None and result.fastest() == "pytorch"
    points = {p["backend"]: p for p in result.points()}
    assert points["onnx-int8"]["within_limit"] is False and points["pytorch"]["within_limit"] is True
    assert "drop's 95% interval" in result.table() and "| pytorch | fp32 | " in result.table()


def test_the_cli_writes_the_frontier_beside_the_family_in_the_store_s_home(stand_in, tmp_path, monkeypatch,
                                                                           capsys) -> None:  # fmt: skip
    """No --out, --json or --plot: evaluate.json and evaluate.png go to $BENTOML_HOME/artifacts/FAMILY, wherever
    the command runs from; the table names the fastest backend within the limit."""
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["evaluate", str(photos(tmp_path / "eval")), "--url", stand_in.url, *QUICK])
    out, err = capsys.readouterr()
    assert rc == 0, err
    folder = tmp_path / "home" / "artifacts" / "shapes"
    written = json.loads((folder / "evaluate.json").read_text())
    assert (folder / "evaluate.png").stat().st_size > 0 and not (tmp_path / "artifacts").exists()
    rows = {r["backend"]: r for r in written["rows"]}
    for backend in ("pytorch", "onnx-int8"):  # the two answer alike: both on the front only if equally fast
        row = rows[backend]
        assert row["images_per_s"] > 0 and row["within_limit"] is True and row["speed"]["failures"] == 0
        low, high = row["top1_interval"]
        assert low < 5 / 6 < high and row["top5"] is None  # 4 classes: no top-5
    fastest = max(("pytorch", "onnx-int8"), key=lambda b: rows[b]["images_per_s"])
    assert written["fastest_within_limit"] == fastest and fastest in written["pareto_front"]
    assert (written["limit_pp"], written["limit_from"].startswith("the build's default")) == (1.0, True)
    assert "fastest within the limit (1 pp below pytorch's top-1, from the build's default" in out
    assert out.rstrip().endswith(")") and f"| {fastest} |" in out and "yes: the fastest" in out


def test_a_served_family_name_no_folder_can_have_asks_for_out(stand_in, tmp_path, monkeypatch, capsys) -> None:
    """The default folder is named after the family the server names: one that is no family name (a path out of
    the store's home) writes nothing, and says to give --out, after the table."""
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "home"))
    stand_in.backends["family"]["name"] = "../../outside"
    rc = cli.main(["evaluate", str(photos(tmp_path / "eval")), "--url", stand_in.url, "--seconds", "0"])
    out, err = capsys.readouterr()
    assert rc == 1 and "give --out DIR" in err.splitlines()[-1] and "| onnx-int8 | int8 | — |" in out
    assert not (tmp_path / "home").exists() and not (tmp_path / "outside").exists()
    rc = cli.main(["evaluate", str(photos(tmp_path / "again")), "--url", stand_in.url, "--seconds", "0", "--out",
                   str(tmp_path / "mine")])  # fmt: skip
    assert rc == 0 and {f.name for f in (tmp_path / "mine").iterdir()} == {"evaluate.json", "evaluate.png"}


@pytest.mark.parametrize(("flag", "value"), [("--seconds", "-1"), ("--clients", "0"), ("--max-drop", "nan")])
def test_bad_timing_options_are_refused_before_anything_runs(stand_in, tmp_path, capsys, flag, value) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["evaluate", str(tmp_path), "--url", stand_in.url, flag, value])
    assert stopped.value.code == 2 and flag in capsys.readouterr().err and stand_in.asked == []


@pytest.mark.parametrize(
    ("args", "said"),
    [(["--clients", "7"], "--clients times a server's clients: it needs --url"),
     (["--max-drop", "1e300"], "--max-drop is in points of top-1, 0 to 100, got 1e+300"),
     (["--out", "{file}/x"], "cannot write there:"),
     (["--plot", "{file}.xyz"], "--plot names a .png, .svg or .pdf file, got ")],
)  # fmt: skip
def test_options_that_cannot_hold_are_refused_before_anything_is_measured(tmp_path, capsys, args, said) -> None:
    (file := tmp_path / "a-file").write_text("")
    given = [a.replace("{file}", str(file)) for a in args]
    assert cli.main(["evaluate", str(tmp_path / "none"), *given]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"fastinfer evaluate: {said}")


def test_the_command_line_s_defaults_are_evaluate_s() -> None:
    """Short by default, at the clients `make bench`'s headline is judged at."""
    args = cli.parser().parse_args(["evaluate", "photos"])
    assert (args.seconds, args.clients, args.max_drop) == (ev.SPEED_SECONDS, None, None)
    assert ev.SPEED_CLIENTS == choice.SERVED_USERS and ev.Timing().clients == ev.SPEED_CLIENTS
    assert ev.SPEED_SECONDS <= 5


def test_seconds_0_measures_accuracy_alone_and_still_draws_it(stand_in, tmp_path) -> None:
    timing = ev.Timing(seconds=0, say=lambda line: None)
    result = ev.evaluate(photos(tmp_path / "eval"), url=stand_in.url, progress=quiet, timing=timing)
    assert result.speeds == {} and stand_in.asked.count("pytorch") == 7  # the accuracy pass alone
    assert "speed not measured (--seconds 0)" in result.table()
    assert ev.plot(result, tmp_path / "e.png").stat().st_size > 0


# --- the frontier, on hand-made numbers -----------------------------------------------------------------


def test_the_pareto_front_is_the_points_no_other_matches_or_beats_on_both() -> None:
    points = {
        "pytorch": (20.0, 0.933),  # the most accurate: on the front however slow
        "onnx": (35.0, 0.933),  # as accurate and faster: pytorch is dominated
        "openvino": (30.0, 0.917),  # slower and less accurate than onnx: dominated
        "onnx-int8": (60.0, 0.917),  # faster than all: on the front
        "openvino-int8": (60.0, 0.900),  # as fast as onnx-int8, less accurate: dominated
        "twin": (35.0, 0.933),  # equal to onnx: neither beats the other
    }
    assert ev.pareto_front(points) == ["onnx", "twin", "onnx-int8"]
    assert ev.pareto_front({"alone": (1.0, 0.5)}) == ["alone"] and ev.pareto_front({}) == []


@pytest.mark.parametrize(
    ("limit", "fastest"),
    [(1.0, "onnx"), (1.67, "onnx-int8"), (5.0, "openvino-int8"), (0.0, "onnx")],
    ids=["INT8 one photo of 60 over", "at the limit", "a wider limit", "no loss at all"],
)
def test_the_fastest_within_the_limit(limit, fastest) -> None:
    speeds = {"pytorch": 20.0, "onnx": 35.0, "onnx-int8": 60.0, "openvino-int8": 70.0, "coreml": None}
    drops = {"pytorch": 0.0, "onnx": 0.0, "onnx-int8": 1.666667, "openvino-int8": 3.333333, "coreml": -5.0}
    assert ev.fastest_within(speeds, drops, limit) == fastest  # coreml: not timed, never the fastest
    assert ev.fastest_within({"onnx": 35.0}, {"onnx": None}, 1.0) is None  # no reference: no drop known


def test_the_top1_interval_is_wilson_s() -> None:
    """Wilson's 95% interval (Newcombe 1998, table I: 81 of 263 is 0.2553 to 0.3662); at 0 or all of n it stays a
    real interval on the inside of 0..1, as the plain normal one does not."""
    low, high = ev.wilson(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    assert ev.wilson(60, 60)[1] == 1.0 and 0.93 < ev.wilson(60, 60)[0] < 0.95
    assert ev.wilson(0, 10)[0] == 0.0 and 0.27 < ev.wilson(0, 10)[1] < 0.28
    with pytest.raises(ValueError):
        ev.wilson(0, 0)


def test_the_limit_is_the_family_s_recorded_one_else_the_build_s_default() -> None:
    from build_models.accuracy_gate import DEFAULT_MAX_DROP_PP

    assert DEFAULT_MAX_DROP_PP == 1.0  # the build's default is evaluate's: one definition
    assert ev.recorded_limit(0.5, [2.0]) == (0.5, "--max-drop")
    assert ev.recorded_limit(None, [None, 2.0, 1.5, True])[0] == 1.5  # the smallest a build recorded
    assert ev.recorded_limit(None, [None, "x"]) == (DEFAULT_MAX_DROP_PP, ev.recorded_limit(None, [])[1])


def test_the_plot_marks_the_front_and_the_fastest(tmp_path) -> None:
    """Drawn from hand-made points, top-5 in a second panel (more than 5 classes), names placed apart."""
    from fastinfer.measure.plots import plot_frontier

    def point(name, rate, top1, within, front=False, fastest=False):
        low, high = ev.wilson(round(top1 * 60), 60)
        return {"backend": name, "precision": "int8" if "int8" in name else "fp32", "images_per_s": rate,
                "top1": top1, "top1_low": low, "top1_high": high, "top5": 0.98, "top5_low": 0.9, "top5_high": 1.0,
                "within_limit": within, "on_front": front, "fastest_within_limit": fastest}  # fmt: skip

    points = [
        point("pytorch", 20.0, 0.933, True, front=True),
        point("onnx", 21.0, 0.933, True, front=True, fastest=True),
        point("onnx-int8", 60.0, 0.917, False, front=True),
        point("openvino-int8", 61.0, 0.917, False),
    ]
    plot_frontier(points, tmp_path / "f.png", "shop: accuracy against speed", "images / s", (0.923, "the limit"))
    top1_only = [{k: v for k, v in p.items() if not k.startswith("top5")} for p in points]
    plot_frontier([*top1_only[:3], {**top1_only[3], "images_per_s": None}], tmp_path / "g.png", "t", "x")
    with Image.open(tmp_path / "f.png") as both, Image.open(tmp_path / "g.png") as one:
        assert both.size[1] > 1.6 * one.size[1]  # top-5's panel below top-1's


def test_the_names_of_close_points_are_placed_apart() -> None:
    """Four backends at nearly the same speed and accuracy: each name lands where it covers no other."""
    from fastinfer.measure.plots import _label, pyplot

    fig, ax = pyplot().subplots(figsize=(6, 4))
    marks = [(20.0, 93.3, "pytorch (fp32)"), (21.0, 93.3, "onnx (fp32)"), (20.5, 93.0, "openvino (fp32)"),
             (60.0, 91.7, "onnx-int8 (int8)")]  # fmt: skip
    ax.scatter([m[0] for m in marks], [m[1] for m in marks])
    ax.set_xlim(0, 70)
    ax.set_ylim(90, 95)
    _label(ax, marks)
    from matplotlib.text import Text

    fig.canvas.draw()  # the names where they are drawn
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the names alone, not their lines
    assert len(boxes) == 4
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    pyplot().close(fig)

"""Fuzz the server's image decoder: any bytes, mutated from images, must end in a 4xx error or pixels.

Coverage-guided with atheris (``.venv/bin/pip install -e '.[fuzz]'``) over Pillow's Python plugins and FastInfer's
preprocessing, seeded with a small image in every format the service accepts (ACCEPTED_FORMATS), in each mode and
TIFF compression Pillow writes it in. Any exception other than ``InvalidImage``/``ImageTooLarge`` is a FINDING (a
500); each new (exception class, raising line) behind a 4xx is printed as a ``cause``. Each is printed once, its
input written to ``--out``, and fuzzing goes on. "No new exception class" means no new line of either kind.

    .venv/bin/python scripts/fuzz_decode.py --seconds 600 --out /tmp/decode-findings

Findings worth keeping go into tests/data/decode_crashers/ (tests/unit/test_preprocess.py reads every file there).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tempfile
import time
import traceback
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from PIL import Image

    Image.init()  # every format plugin imported now, so that its code is instrumented too

    from fastinfer.catalog.store import PreprocessSpec
    from fastinfer.common.errors import ImageTooLarge, InvalidImage
    from fastinfer.serving.preprocess import ACCEPTED_FORMATS, prepare

SPEC = PreprocessSpec()
MAX_PIXELS = 1_000_000  # lower than the server's 50 MP so that a header claiming a large picture stays fast
MODES = ("RGB", "L", "RGBA", "P", "1", "LA", "I;16", "I", "F", "CMYK", "YCbCr")
TIFF_COMPRESSIONS = ("raw", "tiff_lzw", "tiff_adobe_deflate", "packbits", "jpeg", "group4")


def seeds() -> list[bytes]:
    """A 13×9 picture in every accepted format, in each mode Pillow writes it in."""
    base = Image.linear_gradient("L").resize((13, 9)).convert("RGB")
    Image.init()
    out: list[bytes] = []
    for fmt in ACCEPTED_FORMATS:
        for mode in MODES:
            options = [{"compression": c} for c in TIFF_COMPRESSIONS] if fmt == "TIFF" else [{}]
            for extra in options:
                buf = io.BytesIO()
                try:
                    base.convert(mode).save(buf, fmt, **extra)
                except Exception:  # this format cannot hold this mode: no seed
                    continue
                out.append(buf.getvalue())
    return list(dict.fromkeys(out))


SEEN: set[tuple[str, str, str]] = set()
STARTED = time.monotonic()


def one_input(data: bytes, out: Path) -> None:
    try:
        prepare(data, SPEC, MAX_PIXELS)
        return
    except (InvalidImage, ImageTooLarge) as exc:
        raised, kind = exc.__cause__, "cause"  # what Pillow raised, turned into a 4xx: a class seen, not a finding
        if raised is None:
            return
    except Exception as exc:
        raised, kind = exc, "FINDING"  # escaped the decoder: the server would answer 500
    where = traceback.extract_tb(raised.__traceback__)[-1] if raised.__traceback__ else None
    seen = (kind, type(raised).__name__, f"{Path(where.filename).name}:{where.lineno}" if where else "?")
    if seen in SEEN:
        return
    SEEN.add(seen)
    name = out / f"{kind}-{seen[1]}-{hashlib.sha256(data).hexdigest()[:12]}.bin"
    name.write_bytes(data)
    elapsed = time.monotonic() - STARTED
    print(f"[{elapsed:6.0f} s] {kind} {seen[1]} at {seen[2]}: {str(raised)[:100]!r} -> {name.name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "decode-findings")
    args, rest = parser.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = Path(tempfile.mkdtemp(prefix="decode-corpus-"))
    for i, seed in enumerate(seeds()):
        (corpus / f"seed-{i:03d}").write_bytes(seed)
    crashers = Path(__file__).resolve().parent.parent / "tests" / "data" / "decode_crashers"
    dirs = [str(corpus)] + ([str(crashers)] if crashers.is_dir() else [])
    print(f"{len(list(corpus.iterdir()))} seeds in {corpus}; findings in {args.out}", flush=True)
    argv = [sys.argv[0], *rest, f"-max_total_time={args.seconds}", "-max_len=16384", "-rss_limit_mb=4096", *dirs]
    atheris.Setup(argv, lambda data: one_input(data, args.out))
    atheris.Fuzz()


if __name__ == "__main__":
    main()

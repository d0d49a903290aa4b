"""FastInfer from Python with BentoML's own client: backends, classify, a batch, compare.

python examples/client.py PHOTO.jpg [MORE.jpg ...] [--url http://127.0.0.1:3000] [--backend onnx-int8]
                          [--api-key KEY]   (or FASTINFER_API_KEY; needed when the server sets FASTINFER_API_KEYS)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import bentoml
import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("photo", type=Path)
    parser.add_argument("more", type=Path, nargs="*", help="more photos: classified together in one batch request")
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    parser.add_argument("--backend", default=None, help="default: the one /backends recommends")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("FASTINFER_API_KEY"),
        help="sent as 'Authorization: Bearer KEY' (default: $FASTINFER_API_KEY)",
    )
    args = parser.parse_args(argv)

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    answer = httpx.get(f"{args.url}/backends", headers=headers, timeout=30)  # a GET route, outside the typed APIs
    if answer.status_code == 401:
        print(f"the server wants an API key: {answer.json()['error']['message']} (--api-key)", file=sys.stderr)
        return 2
    answer.raise_for_status()
    backends = answer.json()
    available = [b["name"] for b in backends["backends"] if b["available"]]
    backend = args.backend or backends["recommended"]["backend"]
    print(f"available here: {', '.join(available)}; using {backend} ({backends['recommended']['why']})")

    with bentoml.SyncHTTPClient(args.url, timeout=120, token=args.api_key) as client:
        result = client.classify(image=args.photo, backend=backend, top_k=3)
        print(
            f"classify: {result['class']} ({result['confidence']:.1%}) in {result['latency_ms']:.1f} ms, "
            f"weights {result['weights']}, cached {result['cached']}"
        )
        print("  stages (ms):", json.dumps(result["timings_ms"]))
        photos = [args.photo, *args.more]
        batch = client.classify_batch(images=photos, backend=backend, top_k=1)  # one request, one runner call
        for photo, answer in zip(photos, batch["results"], strict=True):
            if "error" in answer:  # this image alone could not be classified; the others still are
                print(f"batch: {photo.name:24} {answer['error']['message']}")
            else:
                print(f"batch: {photo.name:24} {answer['class']} ({answer['confidence']:.1%})")
        compared = client.compare(image=args.photo, top_k=1)
        summary = compared["summary"]
        for r in compared["results"]:
            print(f"compare: {r['backend']:18} {r['class']:20} {r['timings_ms']['total']:7.1f} ms")
        print(f"fastest: {summary['fastest']}; all agree on top-1: {summary['all_agree_top1']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real HTTP server on loopback that speaks Groq's chat-completions route, for tests.

The service reaches it through GROQ_BASE_URL exactly as it would reach Groq.
``mode`` switches its behaviour: ``ok``, ``error`` (HTTP 500) or ``slow`` (answers after
``delay_s``). Every request is recorded (headers and JSON body) for the tests to inspect.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = "FAKE-GROQ: the backends agree; INT8 is fastest, decode is a small share."


class FakeGroq:
    def __init__(self) -> None:
        self.mode = "ok"
        self.delay_s = 5.0
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append({"path": self.path, "headers": dict(self.headers), "json": body})
                if self.path != "/openai/v1/chat/completions":
                    return self._reply(404, {"error": {"message": "unknown route"}})
                if fake.mode == "error":
                    return self._reply(500, {"error": {"message": "internal", "type": "server_error"}})
                if fake.mode == "slow":
                    time.sleep(fake.delay_s)
                self._reply(
                    200,
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", ""),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                    },
                )

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeGroq:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":  # manual use: python -m tests.fake_groq
    with FakeGroq() as fake:
        print(fake.url, flush=True)
        threading.Event().wait()

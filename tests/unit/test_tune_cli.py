"""How `fastinfer tune` takes signals."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import signal
from load_tests.tuning.__main__ import _interrupt, interrupt_on_signals
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
interrupt_on_signals()
print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is _interrupt)
"""


def test_a_signal_started_ignored_stays_ignored_and_sigterm_stops_it_like_ctrl_c() -> None:
    """``nohup fastinfer tune &`` must outlive the terminal: SIGHUP ignored at start stays ignored."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]

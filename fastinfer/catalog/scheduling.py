"""FASTINFER_SCHEDULING: how decoding and engine calls share the cores (fastinfer/serving/turns.py does it)."""

from __future__ import annotations

# The first is the default, today's: both at once. On a 2-core AVX2 EPYC taking turns was a few percent slower in
# process and within noise served (docs/tuning.md#scheduling), so `fastinfer tune` measures it on each machine.
MODES = ("shared", "turns")

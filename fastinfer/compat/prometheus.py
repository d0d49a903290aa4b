"""What FastInfer uses of prometheus_client beyond its public API. Written against prometheus-client==0.26.0.

fastinfer/serving/disk.py gives each multiprocess metric file its disk blocks before mapping it (a full disk
kills the process by SIGBUS otherwise). prometheus_client has no setting for how it opens or grows those files
(it sizes them with ``truncate``: sparse), so the guard subclasses its ``MmapedDict``, whose state is private.
Assumptions, one test each (tests/unit/test_compat_prometheus.py):

1. In multiprocess mode each metric file is opened as ``prometheus_client.values.MmapedDict(filename)``, the
   name looked up at each opening: :func:`use_mmaped_dict` replaces it there.
2. ``MmapedDict(filename, read_mode=False)`` keeps the file in ``_f``, its map in ``_m``, the map's size in
   ``_capacity``, the bytes in use in ``_used``, each key's value offset in ``_positions``, the path in
   ``_fname``; a new file is sized :data:`INITIAL_MMAP_SIZE`.
3. A key not seen yet is added by ``_init_value(key)``, which grows the file only when the entry (4 bytes of
   length, the UTF-8 key padded to 8 bytes, two doubles) does not fit in ``_capacity``; every method but
   ``__init__`` is called under prometheus_client's lock; ``close()`` leaves the map alone when ``_f`` is None.
4. A file begins with its used length (a 4-byte int) and 4 bytes of padding: :data:`HEADER` bytes.
"""

from __future__ import annotations

import prometheus_client.values
from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE as INITIAL_MMAP_SIZE
from prometheus_client.mmap_dict import MmapedDict

__all__ = ["HEADER", "INITIAL_MMAP_SIZE", "MmapedDict", "use_mmaped_dict"]

HEADER = 8


def use_mmaped_dict(cls: type[MmapedDict]) -> None:
    """Open the metric files of this process with ``cls`` from now on (a file already open keeps its class)."""
    prometheus_client.values.MmapedDict = cls  # type: ignore[misc]

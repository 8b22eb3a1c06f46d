"""Fixed-width integers read at many offsets of a byte array at once.

This is the one primitive of the vectorized decoder: instead of dissecting
frame after frame, read "the 4 bytes at offset 24 of every frame" as one numpy
fancy-index. The trick is a strided view of the bytes whose element i is the
`width`-byte integer starting at byte i (stride 1, unaligned), so a field of
any width costs one gather, not one per byte.
"""

from __future__ import annotations

import numpy as np

_DTYPES = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}


class ByteView:
    """Integer fields of a uint8 array (usually a memory-mapped file), read at absolute offsets."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self._views: dict[tuple[int, bool], np.ndarray] = {}

    def _view(self, width: int, little: bool) -> np.ndarray:
        key = (width, little)
        if key not in self._views:
            dtype = np.dtype(_DTYPES[width]).newbyteorder("<" if little else ">")
            count = max(len(self.data) - width + 1, 0)
            self._views[key] = np.ndarray((count,), dtype, buffer=self.data, offset=0, strides=(1,))
        return self._views[key]

    def uint(self, at: np.ndarray, width: int, little: bool = False) -> np.ndarray:
        """Unsigned integers of `width` bytes (1, 2, 3, 4 or 8; network order unless `little`) at `at`, as int64.

        Every offset must lie inside the data; 3-byte fields (PSN, QPN) are
        read as the 4 bytes ending with them, so their offset must be >= 1.
        """
        if width == 3:
            if little:
                return self.uint(at, 4, True) & 0xFFFFFF
            return self.uint(at - 1, 4) & 0xFFFFFF
        return self._view(width, little)[at].astype(np.int64)

    def uint_within(self, at: np.ndarray, width: int, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like `uint` (network order), but only where `at + width <= end`; elsewhere 0 and not valid."""
        valid = (at >= 1) & (at + width <= end)
        if valid.all():  # the usual case: nothing to mask
            return self.uint(at, width), valid
        return np.where(valid, self.uint(np.where(valid, at, 1), width), 0), valid

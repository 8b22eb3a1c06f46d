"""Headers of many frames copied at once from a byte array, and their fields read as columns.

This is the one primitive of the vectorized decoder: instead of dissecting
frame after frame, copy "the 20 bytes at offset 14 of every frame" with one
numpy fancy-index (a view of the bytes whose element i is the `size` bytes
starting at byte i), then read each field of that header as a strided view of
the copy. One gather per header, not one per field: a gather from the file
costs as much for 40 bytes as for 2 (it goes to memory for each frame), a
field of the copy costs a fraction of that.
"""

from __future__ import annotations

import functools

import numpy as np


class ByteView:
    """Blocks of bytes of a uint8 array (usually a memory-mapped file), read at absolute offsets."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self._views: dict[int, np.ndarray] = {}

    def _view(self, size: int) -> np.ndarray:
        if size not in self._views:
            count = max(len(self.data) - size + 1, 0)
            self._views[size] = np.ndarray((count,), f"V{size}", buffer=self.data, offset=0, strides=(1,))
        return self._views[size]

    def block(self, at: np.ndarray, size: int) -> np.ndarray:
        """The `size` bytes at each offset of `at` (>= 0), copied: one item of `size` bytes each.
        Bytes past the end of the data read as 0 (a header cut off by the end of the file)."""
        last = len(self.data) - size
        if not len(at) or int(at.max()) <= last:  # the usual case: every block inside the data
            return self._view(size)[at]
        inside = at <= last
        out = self._view(size)[at[inside]] if last >= 0 else np.zeros(0, f"V{size}")
        blocks = np.zeros(len(at), f"V{size}")
        blocks[inside] = out
        start = max(last, 0)  # the data's last bytes, followed by zeros
        tail = np.zeros(2 * size, np.uint8)
        tail[: len(self.data) - start] = self.data[start:]
        padded = np.ndarray((size + 1,), f"V{size}", buffer=tail, strides=(1,))
        blocks[~inside] = padded[np.minimum(at[~inside], len(self.data)) - start]
        return blocks


def field(blocks: np.ndarray, offset: int, width: int, little: bool = False) -> np.ndarray:
    """The unsigned integers of `width` bytes (1, 2, 3, 4 or 8; network order unless `little`) at
    `offset` of every block, as int64. A 3-byte field (PSN, QPN) is read as the 4 bytes ending with
    it (big-endian) or starting with it (little-endian), so it must lie inside a 4-byte window."""
    if width == 3:
        return field(blocks, offset if little else offset - 1, 4, little) & 0xFFFFFF
    return raw(blocks, offset, width, little).astype(np.int64)


def raw(blocks: np.ndarray, offset: int, width: int, little: bool = False) -> np.ndarray:
    """The field of `width` bytes (1, 2, 4 or 8) at `offset` of every block, as a strided view of
    the blocks in its own unsigned type: stored as it is, it is not converted twice."""
    return blocks.view(_layout(blocks.dtype.itemsize, offset, width, little))["v"]


@functools.cache
def _layout(size: int, offset: int, width: int, little: bool) -> np.dtype:
    """A block of `size` bytes seen as one integer field at `offset`: the rest is padding."""
    kind = ("<" if little else ">") + f"u{width}"
    return np.dtype({"names": ["v"], "formats": [kind], "offsets": [offset], "itemsize": size})

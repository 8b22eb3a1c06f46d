"""The decoder's columns as numpy arrays, and their Arrow arrays built straight from those buffers.

`pa.array` first checks whether its input is a pandas object, and that check imports pandas
(with pyarrow.compute) when it is installed: a cost of most of a second that a capture of a
few hundred thousand frames would pay more than for reading it. Arrow arrays are built here
from the numpy buffers instead, which imports nothing and copies only the bit-packed masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class Column:
    """One column of a chunk: its values, which of them are valid (None: all), and for a text column
    the distinct texts its values index."""

    values: np.ndarray
    valid: np.ndarray | None = None
    texts: list[str] | None = None

    def take(self, order: np.ndarray) -> Column:
        return Column(self.values[order], None if self.valid is None else self.valid[order], self.texts)

    def to_arrow(self, kind: pa.DataType) -> pa.Array:
        """The column as an Arrow array of type `kind` (a dictionary type for a text column)."""
        n = len(self.values)
        valid = None if self.valid is None or self.valid.all() else self.valid
        nulls = 0 if valid is None else n - int(np.count_nonzero(valid))
        validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
        if self.texts is not None:
            indices = _array(kind.index_type, n, validity, self.values, nulls)
            return pa.DictionaryArray.from_arrays(indices, texts(self.texts, kind.value_type))
        return _array(kind, n, validity, self.values, nulls)


def _array(kind: pa.DataType, n: int, validity: pa.Buffer | None, values: np.ndarray, nulls: int) -> pa.Array:
    if pa.types.is_boolean(kind):
        data = np.packbits(values.astype(bool, copy=False), bitorder="little")
    else:
        data = np.ascontiguousarray(values, dtype=np.dtype(f"{'i' if _signed(kind) else 'u'}{kind.bit_width // 8}"))
    return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(data)], null_count=nulls)


def _signed(kind: pa.DataType) -> bool:
    return not pa.types.is_unsigned_integer(kind)  # timestamps are signed 64-bit integers


def texts(values: list[str], kind: pa.DataType) -> pa.Array:
    """`values` as an Arrow string or large_string array."""
    encoded = list(map(str.encode, values))
    offsets = np.zeros(len(encoded) + 1, np.int64 if pa.types.is_large_string(kind) else np.int32)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    return pa.Array.from_buffers(kind, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])

"""Load an untrusted pickle without running anything it asks for.

A pickle is a program: its GLOBAL/STACK_GLOBAL/INST/OBJ opcodes import any callable and
REDUCE calls it, so `pickle.load` on a file someone attached to a ticket can run a command.
Flight Recorder dumps need none of that: they are dicts, lists and tuples of str, int,
float, bool and None. Every way to reach an object other than those goes through
`find_class` (globals, extensions) or `persistent_load` (persistent ids); both refuse here,
so such a pickle stops with `UnsafePickle` before anything is imported or called.

One exception, by name only: PyTorch's TorchScript pickler writes a typed list as a call
to `torch.jit._pickle.build_intlist` (and its siblings) with a plain list as argument. Those
names map to the builtin `list` here; torch itself is never imported.
"""

from __future__ import annotations

import io
import pickle

# PyTorch's typed-list builders (torch/jit/_pickle.py): each returns its one list argument.
_TYPED_LISTS = frozenset(
    {"build_intlist", "build_tensorlist", "build_doublelist", "build_boollist", "build_list", "restore_type_tag"}
)
MAX_BYTES = 512 << 20  # a Flight Recorder dump is a few MB; more is not one worth the memory


class UnsafePickle(pickle.UnpicklingError):
    """The pickle asks for something other than plain containers and scalars."""


def _list_of(value, *_type_tag):
    return list(value) if isinstance(value, (list, tuple)) else value


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "torch.jit._pickle" and name in _TYPED_LISTS:
            return _list_of
        raise UnsafePickle(f"refused to load {module}.{name}: only plain containers and scalars are read")

    def persistent_load(self, pid):
        raise UnsafePickle("refused a persistent id: only plain containers and scalars are read")


def loads(data: bytes):
    """The object in `data` if it is made of plain containers and scalars; UnsafePickle otherwise."""
    if len(data) > MAX_BYTES:
        raise UnsafePickle(f"pickle of {len(data):,} bytes is larger than the {MAX_BYTES >> 20} MiB read")
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except UnsafePickle:
        raise
    except Exception as exc:  # a damaged pickle raises anything (bad load key, EOF, struct, index ...)
        raise ValueError(f"damaged pickle ({type(exc).__name__}: {exc})") from None

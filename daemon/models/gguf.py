"""A GGUF file's header, read without llama.cpp: metadata, tensor shapes, and whether the file is whole.

Qualifying a model starts here, because llama.cpp cannot be asked safely about a file nobody has
checked: a truncated file or an architecture it does not know fails inside the loader. This reads
the key/value metadata (arrays longer than `KEEP_ARRAY` are kept as their length: a vocabulary is
tens of thousands of strings) and the tensor table, and computes where the data must end.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from sinkd.errors import InvalidInput

MAGIC = b"GGUF"
KEEP_ARRAY = 64
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class ArrayInfo:
    """A long array in the metadata: its item type and length, not its items."""

    item_type: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section

    @property
    def nbytes(self) -> int:
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        except (KeyError, ValueError):
            raise InvalidInput(f"tensor {self.name} has an unknown type {self.ggml_type}") from None
        n = 1
        for d in self.shape:
            n *= d
        return n // block * size


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_start: int
    file_size: int

    @property
    def data_end(self) -> int:
        """Where the last tensor's bytes end: a whole file is at least this long."""
        return self.data_start + max((t.offset + t.nbytes for t in self.tensors), default=0)

    @property
    def truncated(self) -> bool:
        return self.file_size < self.data_end

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, the per-architecture keys."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise InvalidInput(f"{self.path.name}: the GGUF header is cut short (truncated file)")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise InvalidInput(f"{self.path.name}: the GGUF header is cut short (truncated file)")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, nested: bool = False) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            if nested:  # llama.cpp reads none; a crafted file would nest until Python's stack ends
                raise InvalidInput(f"{self.path.name}: an array of arrays (GGUF readers take none)")
            item_type, length = self.take("<I"), self.take("<Q")
            if item_type == _ARRAY:
                self.value(_ARRAY, nested=True)
            if length <= KEEP_ARRAY:
                return [self.value(item_type) for _ in range(length)]
            if item_type in _SCALARS:  # skipped whole
                self.pos += struct.calcsize(_SCALARS[item_type]) * length
            else:
                for _ in range(length):
                    self.value(item_type)
            return ArrayInfo(item_type, length)
        raise InvalidInput(f"{self.path.name}: unknown GGUF value type {vtype}")


def read_header(path: Path) -> GGUFHeader:
    """Parse the header; InvalidInput names what is wrong with a file that is not a whole GGUF."""
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < 24:
                raise InvalidInput(f"{path.name} is not a GGUF file ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Cursor(buf, path), size)
    except OSError as e:
        raise InvalidInput(f"cannot read {path}: {e.strerror or e}") from None


def _parse(c: _Cursor, size: int) -> GGUFHeader:
    if bytes(c.buf[:4]) != MAGIC:
        raise InvalidInput(f"{c.path.name} is not a GGUF file (no GGUF magic)")
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise InvalidInput(f"{c.path.name}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        shape = tuple(c.take("<Q") for _ in range(n_dims))
        tensors.append(TensorInfo(name, shape, c.take("<I"), c.take("<Q")))
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align < 1 or align & (align - 1):
        raise InvalidInput(f"{c.path.name}: general.alignment {align!r} is not a power of two")
    data_start = (c.pos + align - 1) // align * align
    return GGUFHeader(version, metadata, tuple(tensors), data_start, size)

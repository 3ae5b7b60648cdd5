"""A GGUF header reader (versions 2 and 3, little-endian): metadata and tensor infos, from the
first bytes of a file. Every count and length read is bounded before anything is allocated."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

from .errors import MeshError

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}

# limits on lengths read from untrusted bytes (a header larger than these is not a model we serve)
MAX_STRING = 1 << 26  # 64 MiB: the longest metadata strings are chat templates (kilobytes)
MAX_ARRAY = 1 << 28  # vocabularies are ~10^5..10^6 entries
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_DIMS = 4
KEEP_ARRAY = 4096  # longer arrays (vocabularies) are skipped, not kept: a stage needs none

# metadata value types: id -> struct format for scalars
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class NeedMore(Exception):
    """The header runs past the bytes read so far."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    shape: tuple[int, ...]  # innermost first, as GGUF stores it
    offset: int  # absolute, within the file
    byte_length: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GgufHeader:
    version: int
    metadata: dict
    tensors: dict[str, TensorInfo]
    data_offset: int


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NeedMore()
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise MeshError("GGUF_MALFORMED_HEADER", f"a {n}-byte string at offset {self.pos} exceeds {MAX_STRING}")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise MeshError("GGUF_MALFORMED_HEADER", f"a {n}-byte string at offset {self.pos} exceeds {MAX_STRING}")
        self.take(n)

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if count > MAX_ARRAY:
                raise MeshError("GGUF_MALFORMED_HEADER", f"a metadata array of {count} entries exceeds {MAX_ARRAY}")
            if count > KEEP_ARRAY:
                if etype in _SCALARS:
                    self.take(count * struct.calcsize(_SCALARS[etype]))
                elif etype == STRING:
                    for _ in range(count):
                        self.skip_string()
                else:
                    raise MeshError("GGUF_MALFORMED_HEADER", f"metadata array element type {etype} is not a scalar or string")
                return None
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                return list(struct.unpack(f"<{count}{fmt[1]}", self.take(count * struct.calcsize(fmt))))
            return [self.value(etype) for _ in range(count)]
        raise MeshError("GGUF_MALFORMED_HEADER", f"unknown metadata value type {vtype}")


def parse_header(data: bytes) -> GgufHeader:
    """Parses the header at the start of `data`; raises NeedMore when `data` ends inside it."""
    c = _Cursor(data)
    if c.take(4) != b"GGUF":
        raise MeshError("GGUF_NOT_GGUF", "the file does not start with the magic bytes 'GGUF'")
    version = c.unpack("<I")
    if version not in (2, 3):
        raise MeshError("GGUF_BAD_VERSION", f"GGUF version {version} is not 2 or 3 (or the file is big-endian)")
    n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise MeshError("GGUF_MALFORMED_HEADER", f"{n_tensors} tensors / {n_kv} metadata keys exceed the limits")
    metadata: dict = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.unpack("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise MeshError("GGUF_MALFORMED_HEADER", f"tensor '{name}' has {n_dims} dimensions")
        shape = tuple(c.unpack("<Q") for _ in range(n_dims))
        infos.append((name, shape, c.unpack("<I"), c.unpack("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    if alignment <= 0 or alignment & (alignment - 1):
        raise MeshError("GGUF_MALFORMED_HEADER", f"general.alignment {alignment} is not a power of two")
    data_offset = -(-c.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, type_id, rel in infos:
        if type_id not in GGML_TYPES:
            raise MeshError("GGUF_UNKNOWN_TYPE", f"tensor '{name}' has ggml type id {type_id}, which this peer does not know")
        _, block, size = GGML_TYPES[type_id]
        if shape[0] % block:
            raise MeshError("GGUF_BAD_TENSOR", f"tensor '{name}': {shape[0]} elements per row is not a whole number of {block}-element blocks")
        n = 1
        for d in shape:
            n *= d
        tensors[name] = TensorInfo(name, type_id, shape, data_offset + rel, n // block * size)
    return GgufHeader(version, metadata, tensors, data_offset)


def read_header(read: Callable[[int, int], bytes], file_size: int, first: int = 1 << 20) -> GgufHeader:
    """The header of a file read by `read(offset, length)`, fetching more until it parses."""
    n = min(first, file_size)
    while True:
        try:
            return parse_header(read(0, n))
        except NeedMore:
            if n >= file_size:
                raise MeshError("GGUF_TRUNCATED_HEADER", f"the file ends ({file_size} bytes) before its header does") from None
            n = min(n * 4, file_size)

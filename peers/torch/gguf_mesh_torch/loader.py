"""Reading a shard's tensors from the room's model hosting: the GGUF header(s) by Range
requests (parsed by gguf.py, checked against the manifest), then each tensor's bytes —
nearby tensors in one request — hashed with sha256 against the manifest; a mismatch is
fetched once more, then refused with TENSOR_HASH_MISMATCH. Verified tensors may be kept in a
cache keyed by the artifact's sha256 and re-hashed whenever they are read from it."""

from __future__ import annotations

import hashlib
import os
import re
import time
import urllib.error
import urllib.request
from typing import Callable
from urllib.parse import urlsplit

from .errors import MeshError
from .gguf import GgufHeader, NeedMore, parse_header, read_header
from .shard import shard_group_names, shard_manifest_tensors

GAP = 64 * 1024  # tensors closer than this are read in one request
MAX_READ = 64 * 1024 * 1024


def part_url(model_url: str, index: int, count: int) -> str:
    """File `index` of a split artifact, named as its first part is (name-0000k-of-0000n.gguf)."""
    if count == 1:
        return model_url
    return re.sub(r"-\d{5}-of-\d{5}\.gguf$", f"-{index + 1:05d}-of-{count:05d}.gguf", model_url)


class RangeReader:
    """Byte ranges of one URL, with the room's headers; counts the bytes fetched."""

    def __init__(self, url: str, headers: dict[str, str]):
        self.url, self.headers, self.fetched = url, headers, 0

    def __call__(self, offset: int, length: int) -> bytes:
        req = urllib.request.Request(self.url, headers={**self.headers, "Range": f"bytes={offset}-{offset + length - 1}"})
        try:
            with urllib.request.urlopen(req, timeout=120) as res:
                if res.status != 206:
                    raise MeshError("RANGE_NOT_SUPPORTED", f"{self.url} answered a Range request with HTTP {res.status}, not 206")
                data = res.read()
        except urllib.error.HTTPError as e:
            code = "AUTH_FAILED" if e.code == 401 else "HTTP_ERROR"
            raise MeshError(code, f"GET {self.url} bytes {offset}-{offset + length - 1}: HTTP {e.code}") from None
        except OSError as e:
            raise MeshError("HTTP_ERROR", f"GET {self.url} failed: {e}") from None
        if len(data) != length:
            raise MeshError("SHORT_READ", f"{self.url}: asked for {length} bytes at {offset}, got {len(data)}")
        self.fetched += len(data)
        return data


class ShardCache:
    """Verified tensor bytes kept across runs: <dir>/torch/<artifact sha256>/<sha256 of the tensor>."""

    def __init__(self, root: str | None, artifact: str):
        self.dir = os.path.join(root, "torch", artifact) if root else None

    def get(self, sha: str) -> bytes | None:
        if not self.dir:
            return None
        try:
            with open(os.path.join(self.dir, sha), "rb") as f:
                data = f.read()
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == sha else None

    def put(self, sha: str, data: bytes) -> None:
        if self.dir:
            self._write(sha, data)

    def get_header(self) -> bytes | None:
        if not self.dir:
            return None
        try:
            with open(os.path.join(self.dir, "header-0"), "rb") as f:
                return f.read()
        except OSError:
            return None

    def put_header(self, data: bytes) -> None:
        if self.dir:
            self._write("header-0", data)

    def _write(self, name: str, data: bytes) -> None:
        os.makedirs(self.dir, exist_ok=True)
        tmp = os.path.join(self.dir, f".{name}.{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(self.dir, name))

    def units(self, manifest: dict) -> list[str]:
        """Groups whose every tensor is held (the hello's `units`)."""
        if not self.dir or not os.path.isdir(self.dir):
            return []
        held = set(os.listdir(self.dir))
        sha = {t["name"]: t["sha256"] for t in manifest["tensors"]}
        return [g["name"] for g in manifest["groups"] if all(sha.get(n) in held for n in g["tensors"] + g.get("uses", []))]


def _runs(entries: list[dict]) -> list[list[dict]]:
    """Entries of one file, sorted by offset, cut into runs read by one request each."""
    runs: list[list[dict]] = []
    for e in sorted(entries, key=lambda t: t["offset"]):
        if runs:
            first, last = runs[-1][0], runs[-1][-1]
            if e["offset"] - (last["offset"] + last["byte_length"]) < GAP and e["offset"] + e["byte_length"] - first["offset"] <= MAX_READ:
                runs[-1].append(e)
                continue
        runs.append([e])
    return runs


def _check_entry(e: dict, header: GgufHeader) -> None:
    t = header.tensors.get(e["name"])
    if t is None or t.offset != e["offset"] or t.byte_length != e["byte_length"] or t.type_id != e["type_id"] or list(t.shape) != list(e["shape"]):
        raise MeshError("BAD_MANIFEST", f"the manifest's entry for '{e['name']}' disagrees with the GGUF header ({t})")


def _first_header(read: RangeReader, size: int, cache: ShardCache) -> GgufHeader:
    """File 0's header, from the cache when it holds it (checked like a fetched one after)."""
    held = cache.get_header()
    if held is not None:
        try:
            return parse_header(held)
        except (NeedMore, MeshError):
            pass
    got: list[bytes] = []

    def recording(offset: int, length: int) -> bytes:
        got.append(read(offset, length))
        return got[-1]

    header = read_header(recording, size, 64 * 1024)
    cache.put_header(got[-1])
    return header


def _check_hyper_parameters(header: GgufHeader, manifest: dict) -> None:
    """The header's own numbers must be the manifest's: both come from the server."""
    md, hp = header.metadata, manifest.get("hyper_parameters", {})
    arch = md.get("general.architecture")
    pairs = {"n_layer": "block_count", "n_embd": "embedding_length", "n_head": "attention.head_count", "n_ff": "feed_forward_length"}
    for k, key in pairs.items():
        if k in hp and hp[k] is not None and md.get(f"{arch}.{key}") is not None and int(md[f"{arch}.{key}"]) != int(hp[k]):
            raise MeshError("BAD_MANIFEST", f"the manifest's {k} {hp[k]} disagrees with the GGUF header's {arch}.{key} {md[f'{arch}.{key}']}")


def load_shard(model_url: str, server_base: str, secret: str, peer_id: str, manifest: dict, start: int, end: int,
               cache_dir: str | None, progress: Callable[[int, int], None]) -> tuple[dict, dict[str, tuple[dict, bytes]], int]:
    """(metadata of file 0, {name: (manifest entry, verified bytes)}, bytes fetched)."""
    # the secret and peer id go only to the server's own hosting, never to a third-party URL
    same_origin = urlsplit(model_url)[:2] == urlsplit(server_base)[:2]
    headers = {"Authorization": f"Bearer {secret}", "x-mesh-peer": peer_id} if same_origin else {}
    files = manifest["artifact"]["files"]
    readers = [RangeReader(part_url(model_url, i, len(files)), headers) for i in range(len(files))]
    cache = ShardCache(cache_dir, manifest["artifact"]["sha256"])
    entries = shard_manifest_tensors(manifest, start, end)
    shard_group_names(manifest, start, end)  # BAD_SHARD for a range outside the model
    total = sum(e["byte_length"] for e in entries)
    done = 0
    progress(0, total)
    headers_by_file: dict[int, GgufHeader] = {0: _first_header(readers[0], files[0]["size"], cache)}
    _check_hyper_parameters(headers_by_file[0], manifest)
    for e in entries:
        if e["file"] == 0:
            _check_entry(e, headers_by_file[0])
    out: dict[str, tuple[dict, bytes]] = {}
    need: list[dict] = []
    for e in entries:
        data = cache.get(e["sha256"])
        if data is None:
            need.append(e)
        else:
            out[e["name"]] = (e, data)
            done += len(data)
    for fi in sorted({e["file"] for e in need}):
        if fi not in headers_by_file:
            headers_by_file[fi] = read_header(readers[fi], files[fi]["size"], 64 * 1024)
        for run in _runs([e for e in need if e["file"] == fi]):
            base = run[0]["offset"]
            blob = readers[fi](base, run[-1]["offset"] + run[-1]["byte_length"] - base)
            for e in run:
                _check_entry(e, headers_by_file[fi])
                data = blob[e["offset"] - base : e["offset"] - base + e["byte_length"]]
                got = hashlib.sha256(data).hexdigest()
                if got != e["sha256"]:
                    data = readers[fi](e["offset"], e["byte_length"])  # one re-fetch
                    got = hashlib.sha256(data).hexdigest()
                    if got != e["sha256"]:
                        raise MeshError("TENSOR_HASH_MISMATCH", f"tensor '{e['name']}': sha256 {got} does not match the manifest's {e['sha256']} (after one re-fetch)",
                                        {"tensor": e["name"], "expected": e["sha256"], "got": got})
                cache.put(e["sha256"], data)
                out[e["name"]] = (e, data)
                done += len(data)
                progress(done, total)
    progress(total, total)
    return headers_by_file[0].metadata, out, sum(r.fetched for r in readers)


class ProgressGate:
    """At most one report per `ms`, and always the last one (done = total)."""

    def __init__(self, send: Callable[[int, int], None], ms: float = 100):
        self.send, self.ms, self.last = send, ms / 1000, -1e9
        self.final_sent = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total:
            if self.final_sent:
                return
            self.final_sent = True
        elif now - self.last < self.ms:
            return
        self.last = now
        self.send(done, total)

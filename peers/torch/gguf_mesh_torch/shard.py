"""Which tensors a stage serving layers [start, end) of an n-layer model needs: the manifest's
groups (docs/protocol.md, "Joining, step by step") or, with no manifest, the GGUF names."""

from __future__ import annotations

import re
from typing import Iterable

from .errors import MeshError

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def shard_group_names(manifest: dict, start: int, end: int) -> list[str]:
    n_layer = int(manifest["hyper_parameters"]["n_layer"])
    if not (0 <= start < end <= n_layer):
        raise MeshError("BAD_SHARD", f"shard [{start}, {end}) is not a layer range of a {n_layer}-layer model")
    names = (["embed"] if start == 0 else []) + [f"layer.{i}" for i in range(start, end)] + (["head"] if end == n_layer else [])
    if any(g["name"] == "global" for g in manifest["groups"]):
        names.append("global")
    return names


def shard_manifest_tensors(manifest: dict, start: int, end: int) -> list[dict]:
    """The manifest entries of every tensor the shard reads (a group's `tensors` and `uses`)."""
    wanted: set[str] = set()
    groups = {g["name"]: g for g in manifest["groups"]}
    for name in shard_group_names(manifest, start, end):
        g = groups.get(name)
        if g:
            wanted.update(g["tensors"])
            wanted.update(g.get("uses", []))
    return [t for t in manifest["tensors"] if t["name"] in wanted]


def shard_tensor_names(names: Iterable[str], start: int, end: int, n_layer: int) -> list[str]:
    """Without a manifest: blocks in range, token_embd (first stage, or a tied last stage),
    output_norm/output (last stage), and tensors of no block (rope_freqs)."""
    names = list(names)
    has_output = "output.weight" in names
    out = []
    for name in names:
        m = _BLOCK.match(name)
        if m:
            if start <= int(m.group(1)) < end:
                out.append(name)
        elif name == "token_embd.weight":
            if start == 0 or (end == n_layer and not has_output):
                out.append(name)
        elif name.startswith("output"):
            if end == n_layer:
                out.append(name)
        else:
            out.append(name)
    return out

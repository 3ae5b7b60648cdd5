"""Offline use of the engine on a local GGUF file (no room, no network): greedy generation and
a shard's hidden states, for checking the layers against other engines."""

from __future__ import annotations

import numpy as np
import torch

from .engine import TensorStore, TorchStage
from .gguf import read_header
from .shard import shard_tensor_names


def load_local(path: str, start: int | None, end: int | None, device: torch.device) -> TorchStage:
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()

        def read(off: int, n: int) -> bytes:
            f.seek(off)
            return f.read(n)

        header = read_header(read, size)
        n_layer = int(header.metadata[f"{header.metadata['general.architecture']}.block_count"])
        start, end = start or 0, n_layer if end is None else end
        store = TensorStore(device)
        for name in shard_tensor_names(header.tensors.keys(), start, end, n_layer):
            t = header.tensors[name]
            store.add(name, t.type_id, t.shape, read(t.offset, t.byte_length))
    embd = header.tensors.get("token_embd.weight")
    return TorchStage(header.metadata, start, end, store, embd.shape[1] if embd else None)


def greedy(stage: TorchStage, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after `prompt`, and the logits after the prompt."""
    stage.open_session("local", len(prompt) + n)
    _, logits, _ = stage.forward("local", 0, tokens=np.asarray(prompt))
    first = logits
    out: list[int] = []
    while True:
        out.append(int(np.argmax(logits)))
        if len(out) == n:
            break
        _, logits, _ = stage.forward("local", len(prompt) + len(out) - 1, tokens=np.asarray(out[-1:]))
    stage.release_session("local")
    return out, first

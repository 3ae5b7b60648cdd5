"""python3 -m gguf_mesh_torch: join a room (`join`), or use the engine offline (`generate`,
`hidden`, `dequant`, `sample`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from .errors import MeshError


def _device(name: str):
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise MeshError("TORCH_UNAVAILABLE", "--device cuda: torch sees no CUDA device here (Debian's python3-torch is CPU-only); use --device cpu")
    return torch.device(name)


def _exit_with_parent() -> None:
    """Spawned by `gguf-mesh node --backend torch` (which sets GGUF_MESH_PARENT_PID): die with
    that process, so a killed node never leaves its PyTorch peer serving (Linux prctl)."""
    parent = os.environ.get("GGUF_MESH_PARENT_PID")
    if not parent:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != int(parent):  # the parent was gone before prctl took effect
        sys.exit(1)


def _layers(text: str | None):
    if not text:
        return None, None
    a, b = text.split("-")
    return int(a), int(b)


def _sample(req: dict) -> dict:
    """Each step's token (and log-probabilities when `logprobs` is a number) from one sampler, as the last stage samples a session."""
    import numpy as np

    from .sampler import Sampler, token_logprob

    sampler = Sampler(req.get("settings"), int(req.get("draws", 0)))
    tokens, logprobs = [], []
    for step in req["steps"]:
        logits = np.asarray(step["logits"], dtype=np.float32)
        t = sampler(logits, step.get("history", []))
        tokens.append(t)
        if req.get("logprobs") is not None:
            lp, top = token_logprob(logits, t, int(req["logprobs"]))
            logprobs.append({"logprob": lp, "top": top})
    return {"tokens": tokens, "logprobs": logprobs, "draws": sampler.draws}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m gguf_mesh_torch", description="gguf-mesh's PyTorch peer")
    sub = ap.add_subparsers(dest="cmd", required=True)
    j = sub.add_parser("join", help="join a room as a native peer and serve the assigned layers")
    j.add_argument("--join", required=True, help="room URL printed by `gguf-mesh serve` (#secret=… read too)")
    j.add_argument("--secret")
    j.add_argument("--memory", default="4GiB")
    j.add_argument("--layers", help="serve exactly layers [a, b) (a-b)")
    j.add_argument("--listen", default="127.0.0.1:0")
    j.add_argument("--advertise")
    j.add_argument("--name")
    j.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    j.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    j.add_argument("--carrier", default="ws", choices=["ws", "http"], help="hidden states to the next stage over ws or http")
    j.add_argument("--cache-dir", help="keep verified shards here (default: $GGUF_MESH_CACHE/shards, else ~/.cache/gguf-mesh/shards)")
    j.add_argument("--no-cache", action="store_true", help="keep no shard cache (every load fetches)")
    g = sub.add_parser("generate", help="greedy tokens from local GGUFs (one JSON line per --model)")
    g.add_argument("--model", required=True, action="append")
    g.add_argument("--logits", action="store_true", help="also print the logits after the prompt")
    g.add_argument("--tokens", required=True, help="prompt token ids, comma-separated")
    g.add_argument("--n", type=int, default=16)
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    h = sub.add_parser("hidden", help="hidden states after layers [0, k) of a local GGUF (f32 to stdout)")
    h.add_argument("--model", required=True)
    h.add_argument("--tokens", required=True)
    h.add_argument("--layers", required=True, help="0-k")
    d = sub.add_parser("dequant", help="dequantise stdin (ggml type id, element count) to f32 on stdout")
    d.add_argument("--type", type=int, required=True)
    d.add_argument("--n", type=int, required=True)
    sub.add_parser("sample", help="the sampler chain offline: JSON {settings, draws, steps: [{logits, history}], logprobs} on stdin, JSON {tokens, logprobs} out")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "dequant":
            from .dequant import dequantize

            sys.stdout.buffer.write(dequantize(sys.stdin.buffer.read(), args.type, args.n).astype("<f4").tobytes())
            return 0
        if args.cmd == "sample":
            print(json.dumps(_sample(json.load(sys.stdin))))
            return 0
        if args.cmd in ("generate", "hidden"):
            import torch

            from .local import greedy, load_local

            torch.set_num_threads(1)
            tokens = [int(t) for t in args.tokens.split(",")]
            if args.cmd == "generate":
                for path in args.model:
                    stage = load_local(path, None, None, _device(args.device))
                    out, logits = greedy(stage, tokens, args.n)
                    print(json.dumps({"model": path, "tokens": out, **({"logits": logits.tolist()} if args.logits else {})}), flush=True)
            else:
                a, b = _layers(args.layers)
                stage = load_local(args.model, a, b, torch.device("cpu"))
                stage.open_session("h", len(tokens))
                _, hidden, _ = stage.forward("h", 0, tokens=tokens)
                sys.stdout.buffer.write(hidden.astype("<f4").tobytes())
            return 0
        _exit_with_parent()
        from .peer import run_peer

        return run_peer(args, _device(args.device))
    except MeshError as e:
        print(f"{e.code}: {e.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

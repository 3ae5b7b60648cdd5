"""Which connections may feed this stage hidden states: only its current previous stage
(the same rule as a native node's, src/peer/upstream-fence.ts; docs/protocol.md, "Carriers").

A peer declared lost can come back and still send what it held in its sockets; after a repair
those frames must not be computed here. An upstream names itself (`x-mesh-peer`) when it opens
the frames socket or sends a frame over HTTP; this stage learns its upstream from the
assignment and every rewire and refuses the rest with NOT_UPSTREAM. A connection naming no
peer (the server's entry link, an older peer) may send hidden states while the upstream is the
one the assignment named. Frames from the control socket are not fenced."""

from __future__ import annotations

from . import frames as fr
from .errors import MeshError
from .frames import Frame


class UpstreamFence:
    def __init__(self, log=lambda line: None):
        self.log = log
        self.upstream: str | None = None
        self.rewired = False
        self.refused = 0
        self.last_refused: dict | None = None

    def assigned(self, peer_id: str | None) -> None:
        self.upstream, self.rewired = peer_id, False

    def moved(self, peer_id: str | None) -> None:
        if peer_id != self.upstream:
            self.rewired = True
        self.upstream = peer_id

    def admit(self, f: Frame, declared: str | None) -> None:
        """Raises NOT_UPSTREAM when `f` came over a connection that is not the current upstream's."""
        if declared is None and (f.type != fr.HIDDEN or not self.rewired):
            return
        if declared is not None and declared == self.upstream:
            return
        self.refused += 1
        kind = fr.TYPE_NAMES.get(f.type, str(f.type))
        self.last_refused = {"from": declared, "expected": self.upstream, "type": kind, "position": f.position, "sessionId": f.session_id}
        sender = "a connection that named no peer" if declared is None else f"peer {declared}"
        upstream = self.upstream or "none (it takes tokens from the server)"
        why = f"{kind} frame (session {f.session_id[:8]}…, position {f.position}) from {sender} refused: this stage's upstream is {upstream}{' since a repair' if self.rewired else ''}"
        self.log(why)
        raise MeshError("NOT_UPSTREAM", why, {"from": declared, "expected": self.upstream})

    def status(self) -> dict:
        return {"upstream": self.upstream, "rewired": self.rewired, "refused": self.refused, "lastRefused": self.last_refused}

"""One stage as a frame handler, as docs/protocol.md "A stage" specifies: sessions open and
close here, stage 0 takes token ids, later stages hidden states; hidden states go to the next
stage, the last stage samples (or answers logits), and each reply passes back up the chain
with this stage's timing record added when asked — or, on the one-way token path (the
ReturnDirect flag), the last stage sends the token to the server itself (`return_to`, the
control socket) and the stages answer each other with a Status off the token's path, their
timing records travelling forward on the Hidden frames.

For repairs the stage keeps, per session, the hidden states it sent and a hash of each row it
received (replay_log.py), and answers Rewind (forget positions from p on, restart the sampler
after n draws, with a new turn's sampler settings, logprobs and penalty tokens where the
body has them), Resend (send logged hidden states to the next stage again as Replay frames) and
Replay-flagged input (compute and log, send nothing on, sample nothing); Verify frames
(speculative decoding) in verify.py."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import frames as fr
from .engine import TorchStage
from .errors import MeshError
from .frames import Frame
from .links import unwrap
from .replay_log import Logged, ReplayLog, row_hashes
from .sampler import Sampler, token_logprob
from .serve import error_reply
from .verify import NONE_TENTATIVE, rejected_from, verifies, verify_answer


@dataclass
class _Session:
    sample: Sampler | None
    hidden_dtype: int
    settings: dict | None
    # the session's token ids by position, as far as this stage knows them (the open frame's
    # `tokens`, then what it sampled): the penalties' history
    history: list[int] = field(default_factory=list)
    # top alternatives to report with each sampled token's log-probability; None: none
    logprobs: int | None = None
    # hidden states sent downstream, hashes of rows received (for repairs)
    log: ReplayLog = field(default_factory=ReplayLog)
    pipeline_error: MeshError | None = None
    # positions from here on were written as drafts by the last Verify frame (inf: none)
    tentative: float = NONE_TENTATIVE
    # bumped by every Rewind: a one-way failure of a frame passed on before it is not this session's
    epoch: int = 0
    # totals over the session's steps (ms, bytes)
    timing: dict = field(default_factory=lambda: {"steps": 0, "computeMs": 0.0, "downstreamMs": 0.0, "handleMs": 0.0, "bytesIn": 0, "bytesOut": 0})


class StageService:
    def __init__(self, engine: TorchStage, stage: int, downstream, compute: ThreadPoolExecutor, return_to=None):
        self.engine, self.stage, self.downstream = engine, stage, downstream
        self.compute = compute  # one thread: torch runs one forward at a time
        # the one-way way to the session's owner (a Token or Error frame); None: answers climb back
        self.return_to = return_to
        self.sessions: dict[str, _Session] = {}
        # tokens this (last) stage sent one-way to the session's owner
        self.tokens_returned = 0

    @property
    def shard(self) -> dict:
        return {"start": self.engine.start, "end": self.engine.end}

    async def handle(self, f: Frame) -> Frame:
        try:
            return await self._dispatch(f)
        except MeshError as e:
            raise e.with_stage(self.stage) from None
        except Exception as e:  # noqa: BLE001 - a bug must still answer the frame
            raise MeshError("INTERNAL", f"stage {self.stage}: {e.__class__.__name__}: {e}", {"stage": self.stage}) from None

    async def _dispatch(self, f: Frame) -> Frame:
        if f.type == fr.SESSION_OPEN:
            return await self._open(f)
        if f.type == fr.SESSION_CLOSE:
            if self.sessions.pop(f.session_id, None) is None:
                raise MeshError("SESSION_UNKNOWN", f"frame session id: session {f.session_id} is not open on stage {self.stage}", {"field": "session id"})
            await self._run(self.engine.release_session, f.session_id)
            return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "state": "closed"})
        if f.type == fr.STATUS:
            query = fr.decode_json(f) if f.dtype == fr.JSON else {}
            body = self.status() if f.session_id == fr.NIL_SESSION else self.session_status(f.session_id, query if isinstance(query, dict) else {})
            return fr.json_frame(fr.STATUS, f, body)
        if f.type == fr.REWIND:
            return await self._rewind(f)
        if f.type == fr.RESEND:
            return await self._resend(f)
        if f.type in (fr.PREFILL, fr.DECODE):
            if not self.engine.is_first:
                raise MeshError("STAGE_INPUT_KIND", f"stage {self.stage} takes hidden states, not token ids")
            return await self._compute(f, tokens=fr.decode_i32(f))
        if f.type == fr.HIDDEN:
            if self.engine.is_first:
                raise MeshError("STAGE_INPUT_KIND", "stage 0 takes token ids, not hidden states")
            # on the one-way path the stages before send their timing records forward in a trailer
            carried = fr.timings_of(f)
            h = fr.without_timings(f)
            return await self._compute(h, hidden=fr.decode_rows(h), carried=carried)
        raise MeshError("FRAME_BAD_TYPE", f"frame type: a stage does not accept {fr.TYPE_NAMES.get(f.type, f.type)} frames", {"field": "type"})

    async def _run(self, fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(self.compute, lambda: fn(*args, **kw))

    async def _open(self, f: Frame) -> Frame:
        body = fr.decode_json(f)
        ctx = body.get("contextLength") if isinstance(body, dict) else None
        if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 1:
            raise MeshError("BAD_REQUEST", f"session open: contextLength must be a positive integer, got {ctx!r}", {"field": "contextLength"})
        if f.session_id in self.sessions:
            raise MeshError("SESSION_EXISTS", f"session {f.session_id} is already open")
        draws = _count(_or(body.get("draws"), 0), "session open: draws")
        settings = body.get("sampler")
        sample = self._sampler(settings, draws)  # bad settings are refused before the engine holds the session
        history = _tokens(body.get("tokens"), "session open: tokens")
        await self._run(self.engine.open_session, f.session_id, ctx)
        self.sessions[f.session_id] = _Session(
            sample=sample,
            hidden_dtype=fr.F32 if body.get("hiddenDtype") == "f32" else fr.F16,
            settings=settings,
            history=history,
            logprobs=_logprobs(body.get("logprobs")),
        )
        return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "state": "open", "position": 0})

    def _sampler(self, settings: dict | None, draws: int) -> Sampler | None:
        """The last stage's sampler, after the session's `draws` random draws; None elsewhere."""
        return Sampler(settings, draws) if self.engine.is_last else None

    def _session(self, sid: str) -> _Session:
        s = self.sessions.get(sid)
        if s is None:
            raise MeshError("SESSION_UNKNOWN", f"frame session id: session {sid} is not open on stage {self.stage}", {"field": "session id"})
        return s

    async def _rewind(self, f: Frame) -> Frame:
        """Positions from f.position on are forgotten (KV cache, log); the sampler restarts after
        `draws` draws, with the body's sampler settings and logprobs where it has them; the
        penalty history is cut there and takes the body's tokens from `from` on."""
        s = self._session(f.session_id)
        body = fr.decode_json(f)
        if not isinstance(body, dict):
            body = {}
        draws = _count(_or(body.get("draws"), 0), "rewind: draws")
        settings = body["sampler"] if isinstance(body.get("sampler"), dict) else s.settings
        sample = self._sampler(settings, draws)  # bad settings refuse the rewind before it changes anything
        tokens = _tokens(body.get("tokens"), "rewind: tokens") if body.get("tokens") is not None else None
        start = _count(_or(body.get("from"), f.position), "rewind: from")
        await self._run(self.engine.truncate_session, f.session_id, f.position)
        s.log.truncate(f.position)
        s.pipeline_error = None
        s.tentative = NONE_TENTATIVE
        s.epoch += 1
        s.settings, s.sample = settings, sample
        if "logprobs" in body:
            s.logprobs = _logprobs(body["logprobs"])
        del s.history[f.position :]
        if tokens is not None and start <= len(s.history):
            s.history[start:] = tokens
        return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "position": f.position})

    async def _resend(self, f: Frame) -> Frame:
        """The logged hidden states of [f.position, end) go to the next stage again as Replay frames, in order."""
        s = self._session(f.session_id)
        body = fr.decode_json(f)
        if not isinstance(body, dict):
            body = {}
        end = _count(body.get("end"), "resend: end")
        max_tokens = max(1, _count(body.get("maxTokens", 1), "resend: maxTokens"))
        nxt = self.downstream
        if nxt is None:
            raise MeshError("STAGE_UNREACHABLE", f"stage {self.stage} has no next stage to resend to", {"stage": self.stage + 1})
        if end > s.log.end:
            raise MeshError("POSITION_MISMATCH", f"stage {self.stage} logged hidden states up to {s.log.end}, asked to resend up to {end}", {"expected": s.log.end, "got": end})
        frames = sent = 0
        for part in s.log.slice(f.position, end, max_tokens):
            out = Frame(type=fr.HIDDEN, flags=fr.REPLAY, route_id=f.route_id, session_id=f.session_id, position=part.position, n_tokens=part.n_tokens, dtype=part.dtype, width=part.width, payload=part.payload)
            try:
                await nxt.request(out)
            except MeshError as e:
                raise self._downstream_error(e, nxt) from None
            frames += 1
            sent += fr.HEADER_BYTES + len(part.payload)
        return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "position": end, "frames": frames, "bytes": sent})

    async def _compute(self, f: Frame, tokens=None, hidden=None, carried=()) -> Frame:
        s = self._session(f.session_id)
        started = time.perf_counter()
        arrived = f.received_at or started
        bytes_in = fr.HEADER_BYTES + len(f.payload) if f.type == fr.HIDDEN else 0
        s.timing["steps"] += 1
        s.timing["bytesIn"] += bytes_in
        step = {"computeMs": 0.0, "downstreamMs": 0.0, "bytesOut": 0}

        def records() -> list[tuple]:
            """The records of the stages before (from the Hidden frame's trailer) and this one's, as of now."""
            us = lambda ms: ms * 1000  # noqa: E731
            own = (self.stage, f.position, us(step["computeMs"]), us(step["downstreamMs"]), (time.perf_counter() - arrived) * 1e6, (started - arrived) * 1e6, bytes_in, step["bytesOut"])
            return [*carried, own]

        step["records"] = records
        try:
            if f.flags & fr.VERIFY:
                await self._drop_rejected(f, s)
            if verifies(f) and self.engine.is_last:
                token = await verify_answer(f, tokens, hidden, lambda row, t, h: self._step(row, s, t, h, step))
                reply = self._answer(f, token, step)
            else:
                reply = await self._step(f, s, tokens, hidden, step)
        finally:
            s.timing["handleMs"] += (time.perf_counter() - started) * 1000
        # on the one-way path the records went forward with the hidden states, not back
        if not f.flags & fr.WANT_TIMINGS or f.flags & fr.RETURN_DIRECT:
            return reply
        return fr.with_timings(reply, *records()[len(carried) :])

    async def _drop_rejected(self, f: Frame, s: _Session) -> None:
        """Before a Verify frame's forward: the rejected drafts at [f.position, held) go (KV,
        replay log, penalty history, as a Rewind cuts them); the frame's own drafts become the tentative positions."""
        at = rejected_from(f, self.engine.session_stats(f.session_id)["position"], s.tentative)
        if at is not None:
            await self._run(self.engine.truncate_session, f.session_id, at)
            s.log.truncate(at)
            del s.history[at:]
        s.tentative = f.position + 1

    async def _step(self, f: Frame, s: _Session, tokens, hidden, step: dict) -> Frame:
        if s.pipeline_error:
            raise s.pipeline_error
        kind, out, compute_ms = await self._run(self.engine.forward, f.session_id, f.position, tokens=tokens, hidden=hidden)
        if hidden is not None:
            s.log.received(f.position, row_hashes(fr.payload_body(f), f.n_tokens))
        s.timing["computeMs"] += compute_ms
        step["computeMs"] += compute_ms
        replay = bool(f.flags & fr.REPLAY)
        sample_now = not replay and (f.type == fr.DECODE or bool(f.flags & fr.SAMPLE))
        end = f.position + f.n_tokens
        if kind == "hidden":
            return await self._forward(f, s, out, sample_now, step)
        if f.flags & fr.WANT_LOGITS and not replay:
            return fr.rows_frame(fr.LOGITS, f, end, out[None, :], fr.F32)
        if not sample_now:
            return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "position": end, **({"replayed": True} if replay else {})})
        token = s.sample(out, s.history[:end] if len(s.history) > end else s.history)
        if len(s.history) == end:
            s.history.append(token)  # it occupies position `end`
        if s.logprobs is None:
            return self._answer(f, fr.tokens_frame(fr.TOKEN, f, end, [token]), step)
        return self._answer(f, fr.sampled_frame(f, end, token, *token_logprob(out, token, s.logprobs)), step)

    def _answer(self, f: Frame, token: Frame, step: dict) -> Frame:
        """The last stage's Token for step `f`: the reply, or — one-way (ReturnDirect) — sent to
        the session's owner, and a Status the reply."""
        if not f.flags & fr.RETURN_DIRECT:
            return token
        timed = fr.with_timings(token, *step["records"]()) if f.flags & fr.WANT_TIMINGS else token
        if self.return_to is None:
            return timed  # no way to the owner here: the token climbs back
        self.return_to(timed.with_(seq=0))
        self.tokens_returned += 1
        return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "position": token.position, "returned": True})

    async def _forward(self, f: Frame, s: _Session, rows, sample_now: bool, step: dict) -> Frame:
        flags = (f.flags & (fr.SAMPLE | fr.WANT_LOGITS | fr.WANT_TIMINGS | fr.RETURN_DIRECT | fr.VERIFY)) | (fr.SAMPLE if sample_now else 0)
        out = fr.rows_frame(fr.HIDDEN, f.with_(seq=0), f.position, rows, s.hidden_dtype, flags)
        s.log.append(Logged(out.position, out.n_tokens, out.dtype, out.width, out.payload))
        if f.flags & fr.REPLAY:
            # a replay fills this stage's KV cache and log; the stage after holds these positions already
            return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "position": f.position + f.n_tokens, "replayed": True})
        nxt = self.downstream
        if nxt is None:
            raise MeshError("STAGE_UNREACHABLE", f"stage {self.stage} has no next stage to send hidden states to", {"stage": self.stage + 1})
        size = fr.HEADER_BYTES + len(out.payload)
        s.timing["bytesOut"] += size
        step["bytesOut"] = size
        one_way = bool(flags & fr.RETURN_DIRECT)
        # one-way: this stage's timing (and the ones before) ride forward to the last stage
        sending = fr.with_timings(out, *step["records"]()) if one_way and flags & fr.WANT_TIMINGS else out
        sent = time.perf_counter()
        try:
            pending = nxt.start(sending)
        except MeshError as e:
            raise self._downstream_error(e, nxt) from None
        end = f.position + f.n_tokens
        if not sample_now and not f.flags & fr.WANT_LOGITS:
            # pipelined: answer now; a failure downstream answers this session's next frame
            pending.add_done_callback(self._on_pipelined(s, nxt))
            return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "position": end, "pipelined": True})
        if one_way and self.return_to is not None:
            # answer at once, so the next step's frame on this connection need not wait for the
            # answers climbing back; a failure downstream goes to the owner one-way too
            pending.add_done_callback(self._on_forwarded(f, s, nxt, end))
            return fr.json_frame(fr.STATUS, f, {"stage": self.stage, "position": end, "forwarded": True})
        try:
            return unwrap(await pending)
        except MeshError as e:
            raise s.pipeline_error or self._downstream_error(e, nxt) from None
        finally:
            step["downstreamMs"] = (time.perf_counter() - sent) * 1000
            s.timing["downstreamMs"] += step["downstreamMs"]

    def _failure_of(self, fut: asyncio.Future) -> BaseException | None:
        """What a frame passed on failed with (an Error answer included), None when it succeeded."""
        if fut.cancelled():
            return MeshError("LINK_CLOSED", "cancelled")
        e = fut.exception()
        if e is None:
            try:
                unwrap(fut.result())
            except MeshError as err:
                e = err
        return e

    def _on_pipelined(self, s: _Session, nxt):
        """A pipelined chunk's answer: a failure downstream answers this session's next frame."""

        def done(fut: asyncio.Future) -> None:
            e = self._failure_of(fut)
            if e is not None and s.pipeline_error is None:
                s.pipeline_error = self._downstream_error(e, nxt)

        return done

    def _on_forwarded(self, f: Frame, s: _Session, nxt, end: int):
        """A one-way step's Hidden frame answered: a failure goes to the owner as an Error at the
        step's end (and answers the session's next frame here) — unless a Rewind came since."""
        epoch = s.epoch

        def done(fut: asyncio.Future) -> None:
            e = self._failure_of(fut)
            if e is None or s.epoch != epoch:
                return
            if s.pipeline_error is None:
                s.pipeline_error = self._downstream_error(e, nxt)
            if self.return_to is not None:
                self.return_to(error_reply(f, s.pipeline_error).with_(position=end, seq=0))

        return done

    def _downstream_error(self, e: BaseException, nxt) -> MeshError:
        if isinstance(e, MeshError) and e.stage is not None:
            return e
        code = e.code if isinstance(e, MeshError) else "STAGE_FAILED"
        if code in ("LINK_CLOSED", "LINK_FAILED"):
            code = "STAGE_UNREACHABLE"
        message = e.message if isinstance(e, MeshError) else str(e)
        return MeshError(code, f"stage {self.stage + 1} ({nxt.remote}): {message}", {"stage": self.stage + 1})

    # ---- status ----

    def session_status(self, sid: str, query: dict | None = None) -> dict:
        if sid not in self.sessions:
            return {"stage": self.stage, "shard": self.shard, "open": False, "position": 0, "kvBytes": 0, "processedTokens": []}
        t = self.sessions[sid].timing
        r3 = lambda x: round(x, 3)  # noqa: E731
        timing = {
            "stage": self.stage,
            "steps": t["steps"],
            "computeMs": r3(t["computeMs"]),
            "downstreamMs": r3(t["downstreamMs"]),
            "overheadMs": r3(max(0.0, t["handleMs"] - t["computeMs"] - t["downstreamMs"])),
            "bytesIn": t["bytesIn"],
            "bytesOut": t["bytesOut"],
        }
        log = self.sessions[sid].log
        hashes = {}
        for key, read in (("sentHashes", log.sent_hashes), ("receivedHashes", log.received_hashes)):
            span = (query or {}).get(key)
            if span is not None:
                a, b = _span(span, key)
                hashes[key] = read(a, b)
        return {"stage": self.stage, "shard": self.shard, "open": True, "backend": self.engine.kind, **self.engine.session_stats(sid), "replayLogBytes": log.bytes, "timing": timing, **hashes}

    def status(self) -> dict:
        return {
            "stage": self.stage,
            "shard": self.shard,
            "backend": self.engine.kind,
            "sessions": [{"sessionId": sid, **self.engine.session_stats(sid)} for sid in self.sessions],
            # this peer runs every step on its own (no batched decode): nothing to count
            "batching": {"batches": 0, "steps": 0, "largest": 0, "fallbacks": 0, "batchMs": 0, "alone": 0, "aloneMs": 0},
        }

    async def release_all(self) -> None:
        for sid in list(self.sessions):
            self.sessions.pop(sid, None)
            await self._run(self.engine.release_session, sid)


def _count(v, what: str, field: str | None = None) -> int:
    """A non-negative integer from a JSON body, else BAD_REQUEST naming the field (details.field, as the TypeScript stage's schemas do)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise MeshError("BAD_REQUEST", f"{what} must be a non-negative integer, got {v!r}", {"field": field or what.rsplit(": ", 1)[-1]})
    return v


def _or(v, default):
    """A JSON field's value, `default` where it is absent or null."""
    return default if v is None else v


def _tokens(v, what: str) -> list[int]:
    """Token ids from a JSON body (absent: none)."""
    if v is None:
        return []
    ok = lambda t: isinstance(t, int) and not isinstance(t, bool) and t >= 0  # noqa: E731
    if not isinstance(v, list) or not all(ok(t) for t in v):
        # the field as the TypeScript stage's schema names it: the list, or its first bad id
        bad = next((i for i, t in enumerate(v) if not ok(t)), None) if isinstance(v, list) else None
        field = what.rsplit(": ", 1)[-1]
        raise MeshError("BAD_REQUEST", f"{what} must be a list of token ids, got {str(v)[:80]}", {"field": field if bad is None else f"{field}.{bad}"})
    return list(v)


def _logprobs(v) -> int | None:
    """A session's logprobs setting: top alternatives to report (0-20), or None for none."""
    if v is None:
        return None
    try:
        return max(0, min(fr.MAX_TOP_LOGPROBS, int(v)))
    except (TypeError, ValueError):
        return 0


def _span(v, what: str) -> tuple[int, int]:
    """[a, b) positions of a Status query."""
    if not isinstance(v, list) or len(v) != 2:
        # the field as the TypeScript stage's tuple schema names it: the first element missing
        raise MeshError("BAD_REQUEST", f"status query: {what} must be [start, end], got {v!r}", {"field": f"{what}.{len(v)}" if isinstance(v, list) and len(v) < 2 else what})
    return _count(v[0], f"status query: {what}[0]", f"{what}.0"), _count(v[1], f"status query: {what}[1]", f"{what}.1")

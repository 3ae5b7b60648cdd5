"""MeshError: a stable code (docs/errors.md) plus a message naming what was wrong."""


class MeshError(Exception):
    def __init__(self, code: str, message: str, details: dict | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = dict(details or {})

    @property
    def stage(self) -> int | None:
        s = self.details.get("stage")
        return s if isinstance(s, int) else None

    def with_stage(self, stage: int) -> "MeshError":
        """The same error as stage `stage` reports it (only when no stage is named yet)."""
        if self.stage is not None:
            return self
        return MeshError(self.code, f"stage {stage}: {self.message}", {**self.details, "stage": stage})

    def to_body(self) -> dict:
        """The JSON body of an Error frame: code, message, stage?, details?."""
        rest = {k: v for k, v in self.details.items() if k != "stage"}
        body: dict = {"code": self.code, "message": self.message}
        if self.stage is not None:
            body["stage"] = self.stage
        if rest:
            body["details"] = rest
        return body

    @staticmethod
    def from_body(body: dict) -> "MeshError":
        details = dict(body.get("details") or {})
        if isinstance(body.get("stage"), int):
            details["stage"] = body["stage"]
        return MeshError(str(body.get("code") or "REMOTE_ERROR"), str(body.get("message") or "remote error"), details)

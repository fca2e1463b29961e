"""How long a served CPU request may wait for its engine before it is failed (issue 44: no request
waits for ever). The bound grows with what the request asks for: ``floor_s`` plus
``per_token_s`` for every token it may generate. A request whose final response has not come
from the engine by then is failed with :func:`stalled_message`, cancelled in the engine, logged
and counted (``specdeploy_requests_stalled_total``); the server keeps serving.

The defaults are generous on purpose: the bound catches a request that is lost (or an engine
that is stuck), not a slow one. A queued request's wait counts, so a deployment that queues many
long requests on a slow model raises them: ``SPECDEPLOY_REQUEST_STALL_FLOOR_S`` and
``SPECDEPLOY_REQUEST_STALL_PER_TOKEN_S`` in the server's environment (docs/operations.md). Pure
Python: the ``tensorrt_llm`` models and the unit tests share it."""

from __future__ import annotations

import os
from dataclasses import dataclass

FLOOR_ENV = "SPECDEPLOY_REQUEST_STALL_FLOOR_S"
PER_TOKEN_ENV = "SPECDEPLOY_REQUEST_STALL_PER_TOKEN_S"


@dataclass(frozen=True)
class StallBound:
    floor_s: float = 120.0  # a model's first request, a long queue, a loaded machine
    per_token_s: float = 2.0  # a CPU decode step of a real model takes well under a second

    @classmethod
    def from_env(cls, env=None) -> "StallBound":
        """The defaults, or the environment's values (a bad value is an error at model load)."""
        env = os.environ if env is None else env
        bound = cls()
        floor = float(env.get(FLOOR_ENV) or bound.floor_s)
        per_token = float(env.get(PER_TOKEN_ENV) or bound.per_token_s)
        if not (floor > 0 and per_token >= 0):
            raise ValueError(f"{FLOOR_ENV} must be > 0 and {PER_TOKEN_ENV} >= 0, got {floor} and {per_token}")
        return cls(floor, per_token)

    def seconds(self, max_new_tokens: int) -> float:
        return self.floor_s + self.per_token_s * max(0, int(max_new_tokens))

    def describe(self, max_new_tokens: int) -> str:
        return f"{self.floor_s:g} s + {max(0, int(max_new_tokens))} tokens x {self.per_token_s:g} s"


def stalled_message(request_id: str, bound: StallBound, max_new_tokens: int) -> str:
    """The error a client gets for a stalled request."""
    return (f"request {request_id!r} stalled: the engine sent no final response within "
            f"{bound.seconds(max_new_tokens):g} s ({bound.describe(max_new_tokens)}); it was cancelled "
            "and the server keeps serving, retry it")

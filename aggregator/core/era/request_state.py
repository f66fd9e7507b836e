"""The ``requestState`` the proxy mints when it asks a modern client for input. Sans-IO.

When a legacy server asks for sampling, elicitation or roots during a modern caller's
call, the caller is answered ``input_required`` and its retry carries back the
``requestState`` the proxy gave it. The client is a stranger (the spec: treat it as
attacker input), so the state is integrity-protected and bound to everything it stands for:

- the parked call it resumes (its id in the proxy's table, never reused in a process);
- the caller's principal (who the front authenticated), so another caller cannot use it;
- an expiry on the router's clock;
- a digest of the server the request goes to and its method and params (without
  ``_meta``, ``inputResponses`` and ``requestState``), so it cannot resume a call with
  other arguments, nor one that names another server's tool or resource of the same name.

Shape: ``aggregator-rs2.<key id>.<replica>.<parked>.<expiry ms>.<digest>.<tag>``; the tag is
HMAC-SHA256 over the visible fields and the principal, under the key the id names: the
request-state keys of ``[cluster] keys`` (the first signs, each verifies; a state whose key
id names no key, as one signed with a key since removed, is refused as a forged one), or a
key made fresh for each proxy process (as ``core.catalogs.cursor``'s). The expiry is in Unix
time (milliseconds) once the router is given a wall clock, as the hub gives it: each
process's own clock means nothing to another replica. ``replica`` names the
replica that holds the parked call: a retry that reaches another one (behind a balancer, or
after a restart) gets -32603 with ``data.retryable`` true, the caller may send the request
again without the state. Every other refusal is -32602 with the reason in words.

A modern server's own ``requestState`` cannot be bound to a caller by that server: behind
the proxy every caller reaches it as the same principal. So a modern caller never sees
it bare: it is **wrapped**, ``aggregator-rw2.<key id>.<expiry ms>.<digest>.<upstream state,
base64url of its UTF-8>.<tag>``, bound as above (without a parked call), and the retry's
wrapped state is verified and unwrapped, byte for byte, before it goes upstream. An
upstream state longer than ``MAX_UPSTREAM_STATE`` bytes is not wrapped (the call fails).
A state with neither prefix is no state of the proxy's and goes through untouched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from typing import Any

import orjson

from aggregator.core.settings import SigningKeys, key_id_of, key_id_text
from aggregator.jsonrpc.codec import JsonNumber, dumps
from aggregator.jsonrpc.errors import INTERNAL_ERROR, INVALID_PARAMS, RemoteProtocolError
from aggregator.mcp.modern import INPUT_RESPONSES, REQUEST_STATE

PREFIX = "aggregator-rs2."
WRAPPED = "aggregator-rw2."  # an upstream's state inside
# The longest upstream requestState wrapped (UTF-8 bytes); a longer one fails the call.
MAX_UPSTREAM_STATE = 16384
_TAG = 16  # bytes of the HMAC kept
_DIGEST = 16  # bytes of the request digest kept
_LONGEST = 300  # a state of ours is shorter (a replica's name: 64 at most); a longer one is refused unread
_LONGEST_WRAPPED = len(WRAPPED) + 90 + (MAX_UPSTREAM_STATE + 2) // 3 * 4
# What the digest leaves out: what changes between the original request and its retry.
_UNBOUND = frozenset(("_meta", INPUT_RESPONSES, REQUEST_STATE))


def is_ours(state: object) -> bool:
    """Whether a ``requestState`` claims to be the proxy's, for a parked call."""
    return type(state) is str and state.startswith(PREFIX)


def is_wrapped(state: object) -> bool:
    """Whether a ``requestState`` claims to be an upstream's, wrapped by the proxy."""
    return type(state) is str and state.startswith(WRAPPED)


def request_digest(method: str, params: dict[str, Any], server: str = "") -> bytes:
    """What a state is bound to: the server the request goes to, its method and params
    (keys sorted, numbers as written)."""
    bound = {key: value for key, value in params.items() if key not in _UNBOUND}
    try:
        text = orjson.dumps([server, method, bound], default=_number_text, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # beyond what orjson writes (huge integers, deep nesting): unsorted, exact
        text = dumps([server, method, bound])
    return hashlib.sha256(text).digest()[:_DIGEST]


def _number_text(value: Any) -> orjson.Fragment:
    if type(value) is JsonNumber:
        return orjson.Fragment(value.text)
    raise TypeError(f"cannot serialize {type(value).__name__}")


class RequestStates:
    """Mints and verifies the proxy's ``requestState`` strings under ``keys`` (bytes: one
    key; None: one made for this process); ``ttl``: how long, in seconds, a parked call waits
    for the retry that carries one; ``replica``: this replica's name, which its parked calls'
    states carry. Times given are on the router's clock; ``to_wall`` turns one into the time
    a state carries, Unix time, which every replica reads alike (None: as they are)."""

    def __init__(
        self,
        ttl: float,
        keys: SigningKeys | bytes | None = None,
        replica: str = "",
        to_wall: Callable[[float], float] | None = None,
    ) -> None:
        self.ttl = ttl
        self._keys = SigningKeys.of(keys)
        self.replica = replica
        self._wall: Callable[[float], float] = to_wall if to_wall is not None else float

    def mint(self, parked: int, principal: Any, expires: float, digest: bytes) -> str:
        """A state for parked call ``parked`` of ``principal``, valid until ``expires``."""
        key_id, key = self._keys.signing
        expiry = int(self._wall(expires) * 1000)
        body = f"{key_id_text(key_id)}.{self.replica}.{parked}.{expiry}.{_b64(digest)}"
        return f"{PREFIX}{body}.{_b64(_tag(key, body, principal))}"

    def verify(self, state: str, principal: Any, now: float, digest: bytes) -> int:
        """The parked call a retry's state names; RemoteProtocolError(-32602) when it was
        altered, is another caller's, has expired or was issued for another request, and
        (-32603, retryable) when another replica holds the call."""
        if len(state) > _LONGEST or not state.isascii():
            raise _invalid("it was not issued by this proxy")
        fields = state[len(PREFIX) :].split(".")
        if len(fields) != 6 or not fields[2].isdigit() or not fields[3].isdigit():
            raise _invalid("it was not issued by this proxy")
        body = ".".join(fields[:5])
        key = self._key(fields[0])
        if key is None or not hmac.compare_digest(fields[5], _b64(_tag(key, body, principal))):
            raise _invalid("it was altered, or issued to another caller")
        if int(fields[3]) < self._wall(now) * 1000:
            raise _invalid("it has expired; send the request again without it")
        if not hmac.compare_digest(fields[4], _b64(digest)):
            raise _invalid("it was issued for another request (the method or params differ)")
        if fields[1] != self.replica:
            raise RemoteProtocolError(
                INTERNAL_ERROR,
                f"The call this requestState continues is held by replica {fields[1]!r}, not this one"
                f" ({self.replica!r}): send the request again without it",
                data={"source": "aggregator", "reason": "unavailable", "retryable": True, "replica": fields[1]},
            )
        return int(fields[2])

    @staticmethod
    def held_by(state: Any) -> str | None:
        """The replica a state of ours names as holding its parked call, read without
        verifying it (where a retry is sent: that replica verifies it); None for anything
        else."""
        if type(state) is not str or len(state) > _LONGEST or not state.startswith(PREFIX):
            return None
        fields = state[len(PREFIX) :].split(".")
        return fields[1] if len(fields) == 6 and fields[1] else None

    def wrap(self, upstream: str, principal: Any, expires: float, digest: bytes) -> str:
        """An upstream's state for ``principal``'s retry, valid until ``expires``; ValueError
        when it is longer than ``MAX_UPSTREAM_STATE``."""
        raw = upstream.encode("utf-8", "surrogatepass")
        if len(raw) > MAX_UPSTREAM_STATE:
            raise ValueError(f"its requestState is {len(raw)} bytes long, over the {MAX_UPSTREAM_STATE} accepted")
        key_id, key = self._keys.signing
        body = f"{key_id_text(key_id)}.{int(self._wall(expires) * 1000)}.{_b64(digest)}.{_b64(raw)}"
        return f"{WRAPPED}{body}.{_b64(_tag(key, WRAPPED + body, principal))}"

    def unwrap(self, state: str, principal: Any, now: float, digest: bytes) -> str:
        """The upstream's state a retry's wrapped state carries, exactly as it came;
        RemoteProtocolError(-32602) as ``verify``."""
        if len(state) > _LONGEST_WRAPPED or not state.isascii():
            raise _invalid("it was not issued by this proxy")
        fields = state[len(WRAPPED) :].split(".")
        if len(fields) != 5 or not fields[1].isdigit():
            raise _invalid("it was not issued by this proxy")
        body = ".".join(fields[:4])
        key = self._key(fields[0])
        if key is None or not hmac.compare_digest(fields[4], _b64(_tag(key, WRAPPED + body, principal))):
            raise _invalid("it was altered, or issued to another caller")
        if int(fields[1]) < self._wall(now) * 1000:
            raise _invalid("it has expired; send the request again without it")
        if not hmac.compare_digest(fields[2], _b64(digest)):
            raise _invalid("it was issued for another request (the method or params differ)")
        return _unb64(fields[3]).decode("utf-8", "surrogatepass")

    def _key(self, key_id: str) -> bytes | None:
        raw = key_id_of(key_id)
        return None if raw is None else self._keys.verifying(raw)


def _tag(key: bytes, body: str, principal: Any) -> bytes:
    message = f"{body}|{principal!r}".encode()
    return hmac.new(key, message, hashlib.sha256).digest()[:_TAG]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _invalid(reason: str) -> RemoteProtocolError:
    return RemoteProtocolError(INVALID_PARAMS, f"Invalid requestState: {reason}")

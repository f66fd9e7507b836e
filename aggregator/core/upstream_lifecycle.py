"""One upstream connection's lifecycle as the proxy sees it, sans-IO: the handshake, the
listing of every kind, re-listing what changed, a per-session connection's own listing.

``UpstreamLifecycle`` is told what happened (``connected``, ``answer``, ``list_changed``,
``expire`` at ``next_deadline``) and returns what to do: messages to send and typed
outcomes. The trio layer (``aggregator.upstream``) only moves bytes, keeps the clock and
hands the outcomes to the router. The rules:

- Handshake: ``initialize`` with the capabilities given and this proxy's instance in its
  ``_meta`` (an aggregator that finds its own there refuses it at once), its result checked
  (``initialize_result_problem``), a result carrying this proxy's own instance in its
  ``_meta`` refused (a config that leads back to the proxy through another), then
  ``notifications/initialized``; all within ``init_timeout``.
- Listing: each kind the server's capabilities name, page by page, at most
  ``MAX_LIST_PAGES`` pages, stopping at a cursor seen before; a resources server that
  answers ``resources/templates/list`` with "method not found" has no templates. A shared
  connection lists every kind within one more ``init_timeout`` before it serves; one that
  fails there fails the connection.
- Re-listing: kinds whose list changed are coalesced and re-listed one job at a time, each
  kind within ``request_timeout``; a kind that fails is logged and the others go on.
- A per-session connection serves right after its handshake and then lists all its kinds
  before giving them to the router at once; if one kind fails its session keeps the shared
  listing until the server next says a list changed.

Its requests are the proxy's own (``OwnRequests``: string ids, one deadline each); an
error answer keeps its JSON-RPC code in ``Failed.code``. The router shares one table per
upstream between a lifecycle and its own requests (``core.upstream_control``): it settles
and expires the table itself and hands the lifecycle its waiters (``settled``,
``expired``); a lifecycle alone (``answer``, ``expire``) does both itself.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

from aggregator import __version__
from aggregator.core.commands import Answer
from aggregator.core.own_requests import OwnRequests, Waiting
from aggregator.jsonrpc.errors import METHOD_NOT_FOUND
from aggregator.mcp.constants import CAPABILITY_OF, INITIALIZE, INITIALIZED, KINDS, LIST_METHOD_OF, TEMPLATES
from aggregator.mcp.initialize import initialize_result_problem
from aggregator.mcp.versions import LATEST

MAX_LIST_PAGES = 100
# The ids of the proxy's own requests to an upstream start with this (clients' are integers).
CONTROL_ID_PREFIX = "aggregator-"
# The ``_meta`` key of our initialize request and result that names this running proxy: an
# initialize that carries our own instance comes from this proxy itself (a config that lists
# its own URL), and so does an upstream that answers with it.
INSTANCE_KEY = "dev.mcp-aggregator/instance"

# --- what to do ------------------------------------------------------------------------


class Send(NamedTuple):
    """Send ``message`` (a request or notification of the proxy's own) to the server."""

    message: dict[str, Any]


class Ready(NamedTuple):
    """The handshake is done; ``result`` is the server's checked initialize result."""

    result: dict[str, Any]


class Items(NamedTuple):
    """Every item of ``kind`` the server lists now (initial listing or re-listing)."""

    kind: str
    items: list[dict[str, Any]]


class Listing(NamedTuple):
    """A per-session connection's items of every kind it has, listed together."""

    listing: dict[str, list[dict[str, Any]]]


class Serving(NamedTuple):
    """The connection serves: a shared one has listed every kind, a per-session one has
    finished its handshake."""


class Failed(NamedTuple):
    """The connection cannot be used: ``reason`` for the log and the status; ``code`` is
    the JSON-RPC error code when the server answered with an error."""

    reason: str
    code: int | None = None


Outcome = Send | Ready | Items | Listing | Serving | Failed | Answer


class _Error(NamedTuple):
    """An own request that did not give a usable result."""

    text: str
    code: int | None = None
    message: str | None = None


class _Caller(NamedTuple):
    """What waits for the answer to a request made with ``request``."""

    caller: object


# --- listing jobs ------------------------------------------------------------------------

INITIAL, RELIST, OWN = "initial", "relist", "own"


class _Job:
    """Listing some kinds, one after another, one page at a time."""

    __slots__ = ("mode", "kinds", "deadline", "items", "seen", "pages", "listing")

    def __init__(self, mode: str, kinds: list[str], deadline: float = 0.0) -> None:
        self.mode = mode
        self.kinds = kinds  # the first is being listed
        self.deadline = deadline  # of the whole job (initial) or of the current kind
        self.items: list[dict[str, Any]] = []
        self.seen: set[str] = set()
        self.pages = 0
        self.listing: dict[str, list[dict[str, Any]]] = {}


class UpstreamLifecycle:
    """The protocol state of one connection to one upstream (a new one per connection)."""

    def __init__(
        self,
        name: str,
        *,
        instance: str,
        target: str,
        init_timeout: float,
        request_timeout: float,
        per_session: bool = False,
        log: logging.Logger | None = None,
        requests: OwnRequests[Any] | None = None,
    ) -> None:
        self.name = name
        self.instance = instance  # this proxy's own, to recognise itself upstream
        self.target = target  # the server's URL or command, to name it in a refusal
        self.init_timeout = init_timeout
        self.request_timeout = request_timeout
        self.per_session = per_session
        self.log = log or logging.getLogger(__name__)
        # Its own table, or one it shares with the router (whose waiters it never touches).
        self.requests: OwnRequests[Any] = requests if requests is not None else OwnRequests(CONTROL_ID_PREFIX)
        self.capabilities: dict[str, Any] = {}
        self.serving = False
        self.failed = False
        self.listed = False  # a per-session connection has given its own listing
        self._job: _Job | None = None
        self._wanted: set[str] = set()  # kinds whose list changed, not re-listed yet

    # --- what happened ----------------------------------------------------------------

    def connected(self, now: float, capabilities: dict[str, Any]) -> list[Outcome]:
        """The connection is up: start the handshake, declaring ``capabilities``."""
        params = {
            "protocolVersion": LATEST,
            "capabilities": capabilities,
            "clientInfo": {"name": "aggregator", "version": __version__},
            # An aggregator that finds its own instance here is asked by itself: it refuses at once.
            "_meta": {INSTANCE_KEY: self.instance},
        }
        return [Send(self.requests.open(INITIALIZE, params, None, now + self.init_timeout))]

    def answer(self, message: dict[str, Any], now: float) -> list[Outcome]:
        """An answer to one of its own requests (an unknown or late one is dropped)."""
        waiting = self.requests.settle(message.get("id"))
        return [] if waiting is None else self.settled(waiting, message, now)

    def settled(self, waiting: Waiting[Any], message: dict[str, Any], now: float) -> list[Outcome]:
        """The answer ``message`` to one of its requests, taken from the table already."""
        if self.failed:
            return []
        outcome = _result_of(waiting.method, message)
        waiter = waiting.waiter
        if waiter is None:
            return self._initialized(outcome, now, message)
        if isinstance(waiter, _Caller):
            return [_answer(waiter, outcome)]
        return self._page(waiter, outcome, now)

    def request(
        self, method: str, params: dict[str, Any] | None, caller: object, now: float, timeout: float = math.inf
    ) -> Send:
        """A request of the proxy's own; its ``Answer`` names ``caller``."""
        return Send(self.requests.open(method, params, _Caller(caller), now + timeout))

    def list_changed(self, kind: str, now: float) -> list[Outcome]:
        """The server said a list changed: re-list it (coalesced with others pending)."""
        self._wanted.add(kind)
        if self.serving and self._job is None:
            return self._next_job(now)
        return []

    def expire(self, now: float) -> list[Outcome]:
        """Time passed: fail what has waited past its deadline."""
        return self.expired(self.requests.expire(now), now)

    def expired(self, late: list[Waiting[Any]], now: float) -> list[Outcome]:
        """Its requests in ``late`` have waited past their deadline (taken from the table)."""
        out: list[Outcome] = []
        for waiting in late:
            if self.failed:
                break
            job = waiting.waiter
            if isinstance(job, _Caller):
                out.append(_answer(job, _Error(f"{waiting.method}: no answer in time")))
            elif job is None or job.mode == INITIAL:  # the handshake, or the listing after it
                out.append(self._fail(f"no answer to {waiting.method} within {self.init_timeout}s"))
            else:
                out += self._kind_failed(job, _Error(f"no answer within {self.request_timeout}s"), now)
        return out

    def next_deadline(self) -> float | None:
        return None if self.failed else self.requests.next_deadline()

    @staticmethod
    def owns(waiter: object) -> bool:
        """Whether ``waiter`` (of a request in a shared table) is a lifecycle's."""
        return waiter is None or type(waiter) is _Job or type(waiter) is _Caller

    # --- the handshake -----------------------------------------------------------------

    def _initialized(self, outcome: dict[str, Any] | _Error, now: float, message: dict[str, Any]) -> list[Outcome]:
        if type(outcome) is _Error:
            error = message.get("error")
            if type(error) is dict and self._is_us(error.get("data")):  # it refused our initialize: it is us
                return [self._itself()]
            return [self._fail(outcome.text, outcome.code)]
        assert type(outcome) is dict
        problem = initialize_result_problem(outcome)
        if problem is not None:
            return [self._fail(f"its initialize result is unusable: {problem}")]
        if self._is_us(outcome.get("_meta")):  # through another proxy that did not know us
            return [self._itself()]
        self.capabilities = outcome["capabilities"]
        out: list[Outcome] = [Send({"jsonrpc": "2.0", "method": INITIALIZED}), Ready(outcome)]
        if self.per_session:
            out += self._serve(now)
        else:
            kinds = [kind for kind in KINDS if CAPABILITY_OF[kind] in self.capabilities]
            out += self._start(_Job(INITIAL, kinds, now + self.init_timeout), now)
        return out

    def _is_us(self, meta: Any) -> bool:
        return type(meta) is dict and meta.get(INSTANCE_KEY) == self.instance

    def _itself(self) -> Failed:
        return self._fail(
            f"it is this aggregator itself ({self.target} leads back"
            " to this proxy); a config must not list the aggregator serving it"
        )

    def _serve(self, now: float) -> list[Outcome]:
        self.serving = True
        out: list[Outcome] = [Serving()]
        if self.per_session:
            out += self._own_listing(now)
        else:
            out += self._next_job(now)
        return out

    def _fail(self, reason: str, code: int | None = None) -> Failed:
        self.failed = True
        self._job = None
        self.requests.drop_if(self.owns)
        return Failed(reason, code)

    # --- listing -----------------------------------------------------------------------

    def _next_job(self, now: float) -> list[Outcome]:
        """Start re-listing what changed meanwhile, if anything did."""
        if not self._wanted:
            return []
        kinds, self._wanted = self._wanted, set()
        if self.per_session and not self.listed:
            return self._own_listing(now)
        return self._start(_Job(RELIST, [kind for kind in KINDS if kind in kinds]), now)

    def _own_listing(self, now: float) -> list[Outcome]:
        kinds = [kind for kind in KINDS if CAPABILITY_OF[kind] in self.capabilities]
        return self._start(_Job(OWN, kinds), now)

    def _start(self, job: _Job, now: float) -> list[Outcome]:
        """List the job's first kind from its first page, or finish the job."""
        if not job.kinds:
            return self._finished(job, now)
        self._job = job
        job.items, job.seen, job.pages = [], set(), 0
        if job.mode != INITIAL:
            job.deadline = now + self.request_timeout
        return [self._ask(job, None)]

    def _ask(self, job: _Job, cursor: str | None) -> Send:
        method = LIST_METHOD_OF[job.kinds[0]]
        params = {"cursor": cursor} if cursor is not None else None
        return Send(self.requests.open(method, params, job, job.deadline))

    def _page(self, job: _Job, outcome: dict[str, Any] | _Error, now: float) -> list[Outcome]:
        kind = job.kinds[0]
        if type(outcome) is _Error:
            if kind == TEMPLATES and outcome.code == METHOD_NOT_FOUND:
                return self._kind_listed(job, now)  # a resources server without templates
            return self._kind_failed(job, outcome, now)
        assert type(outcome) is dict
        page = outcome.get(kind)
        if type(page) is list:
            job.items.extend(page)
        job.pages += 1
        cursor = outcome.get("nextCursor")
        if cursor is None or cursor == "":
            return self._kind_listed(job, now)
        method = LIST_METHOD_OF[kind]
        if type(cursor) is not str or cursor in job.seen:
            self.log.warning("server %s: %s pagination loops; keeping %d items", self.name, method, len(job.items))
            return self._kind_listed(job, now)
        job.seen.add(cursor)
        if job.pages >= MAX_LIST_PAGES:
            self.log.warning(
                "server %s: %s has more than %d pages; keeping %d items",
                self.name,
                method,
                MAX_LIST_PAGES,
                len(job.items),
            )
            return self._kind_listed(job, now)
        return [self._ask(job, cursor)]

    def _kind_listed(self, job: _Job, now: float) -> list[Outcome]:
        kind = job.kinds.pop(0)
        out: list[Outcome] = []
        if job.mode == OWN:
            job.listing[kind] = job.items
        else:
            out.append(Items(kind, job.items))
        return out + self._start(job, now)

    def _kind_failed(self, job: _Job, error: _Error, now: float) -> list[Outcome]:
        kind = job.kinds.pop(0)
        if job.mode == INITIAL:
            return [self._fail(error.text, error.code)]
        self._job = None
        if job.mode == OWN:
            self.log.warning(
                "server %s: listing %s failed: %s; its session sees the shared listing", self.name, kind, error.text
            )
            return self._next_job(now)
        self.log.warning("server %s: re-listing %s failed: %s", self.name, kind, error.text)
        return self._start(job, now)

    def _finished(self, job: _Job, now: float) -> list[Outcome]:
        self._job = None
        if job.mode == INITIAL:
            return self._serve(now)
        out: list[Outcome] = []
        if job.mode == OWN:
            self.listed = True
            out.append(Listing(job.listing))
        return out + self._next_job(now)


def _result_of(method: str, message: dict[str, Any]) -> dict[str, Any] | _Error:
    """The result of an answer, or why there is none (with the error's code)."""
    if "error" in message:
        error = message["error"]
        if type(error) is not dict:
            error = {}
        code, text = error.get("code"), error.get("message")
        return _Error(
            f"{method} failed: {text} (code {code})",
            code if type(code) is int else None,
            text if type(text) is str else None,
        )
    result = message.get("result")
    if type(result) is not dict:
        return _Error(f"{method}: the result is not an object")
    return result


def _answer(waiter: _Caller, outcome: dict[str, Any] | _Error) -> Answer:
    if type(outcome) is _Error:
        return Answer(waiter.caller, None, outcome.text, outcome.code, outcome.message)
    assert type(outcome) is dict
    return Answer(waiter.caller, outcome)

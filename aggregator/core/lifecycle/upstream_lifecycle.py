"""One upstream connection's lifecycle as the proxy sees it, sans-IO: the handshake, the
listing of every kind, re-listing what changed, a per-session connection's own listing.

``UpstreamLifecycle`` is told what happened (``connected``, ``answer``, ``list_changed``,
``expire`` at ``next_deadline``) and returns what to do: messages to send and typed
outcomes. The trio layer (``aggregator.upstream``) only moves bytes, keeps the clock and
hands the outcomes to the router. The rules:

- Era: a legacy ``protocol`` pins ``initialize`` proposing it; a modern one pins
  ``server/discover`` (never ``initialize``); "auto" probes with ``server/discover``
  within ``discover_timeout`` and acts on ``upstream_era.judge``; no answer in time means
  legacy (but "method not found" for ``initialize`` then means a slow modern server: the
  next connection probes for ``init_timeout``). What a connection ``learnt`` is kept by the
  router for the next. A modern connection is ready with the DiscoverResult.
- Handshake: ``initialize`` (or ``server/discover``) with this proxy's instance in its
  ``_meta``: an aggregator that finds its own there refuses it, and a refusal, result or
  DiscoverResult naming it is this proxy itself. The result is checked
  (``initialize_result_problem``), then ``notifications/initialized``; within ``init_timeout``.
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

Its requests are the proxy's own (``OwnRequests``: string ids, one deadline each), in a
table it may share with the router (``core.upstreams.upstream_control``), which then settles and
expires them and hands it its waiters (``settled``, ``expired``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from aggregator import __version__
from aggregator.core.defaults import DISCOVER_TIMEOUT
from aggregator.core.lifecycle import upstream_era as era
from aggregator.core.lifecycle import upstream_outcomes as outcomes
from aggregator.core.lifecycle.own_requests import OwnRequests, Waiting
from aggregator.core.lifecycle.upstream_era import INSTANCE_KEY, LEGACY_ERA, MODERN_ERA, Era, Probe
from aggregator.core.lifecycle.upstream_outcomes import Failed, Items, Listing, Outcome, Ready, Send, Serving
from aggregator.jsonrpc.errors import METHOD_NOT_FOUND
from aggregator.mcp import modern
from aggregator.mcp.constants import CAPABILITY_OF, INITIALIZE, INITIALIZED, KINDS, LIST_METHOD_OF, TEMPLATES
from aggregator.mcp.initialize import initialize_result_problem
from aggregator.mcp.versions import DISCOVER, LATEST, MODERN, MODERN_LATEST, SUPPORTED

MAX_LIST_PAGES = 100
# The ids of the proxy's own requests to an upstream start with this (clients' are integers).
CONTROL_ID_PREFIX = "aggregator-"

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
        protocol: str = "auto",
        discover_timeout: float = DISCOVER_TIMEOUT,
        era: Era | None = None,
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
        self.serving = self.failed = False
        self.listed = False  # a per-session connection has given its own listing
        self._job: _Job | None = None
        self._wanted: set[str] = set()  # kinds whose list changed, not re-listed yet
        self.protocol, self.discover_timeout = protocol, discover_timeout  # "auto", or a pinned revision
        self.era = era  # what an earlier connection learnt, or None
        self.speaks = Era.LEGACY  # the era this connection speaks (modern once its probe says so)
        self.version: str | None = None  # the revision it speaks, once ready
        self.learnt: Era | None = None  # what this connection learnt of the era, for the next
        self.probing = False  # its server/discover is unanswered (a server that exits now is legacy)
        self._probe_late = False  # its server/discover went unanswered within discover_timeout
        self._tried: set[str] = set()  # revisions server/discover named
        self._offered: dict[str, Any] = {}  # the capabilities initialize declares

    # --- what happened ----------------------------------------------------------------

    def connected(self, now: float, capabilities: dict[str, Any]) -> list[Outcome]:
        """The connection is up: find its era or start the handshake of the pinned one,
        declaring ``capabilities`` (to a legacy server, in ``initialize``)."""
        self._offered = capabilities
        if self.protocol in MODERN:
            return [self._discover(self.protocol, now + self.init_timeout)]
        if self.protocol in SUPPORTED or self.era is LEGACY_ERA:
            return [self._initialize(now)]
        timeout = self.init_timeout if self.era is MODERN_ERA else min(self.discover_timeout, self.init_timeout)
        return [self._discover(MODERN_LATEST, now + timeout)]

    def meta(self) -> dict[str, Any]:
        """The ``_meta`` of a request of the proxy's own to a modern server."""
        return era.own_meta(self.version or MODERN_LATEST, self.instance)

    def _discover(self, version: str, deadline: float) -> Send:
        self.probing = True
        self._tried.add(version)
        params = {"_meta": era.own_meta(version, self.instance)}
        return Send(self.requests.open(DISCOVER, params, Probe(version), deadline))

    def _initialize(self, now: float) -> Send:
        self.probing = False
        # It looks like a legacy handshake and nothing else: no _meta (a dual-era server takes a
        # session-less POST with _meta for a modern request). An aggregator that finds its own
        # instance among the experimental capabilities is asked by itself: it refuses at once.
        experimental = self._offered.get("experimental")
        marked = {**(experimental if type(experimental) is dict else {}), INSTANCE_KEY: {"instance": self.instance}}
        params = {
            "protocolVersion": self.protocol if self.protocol in SUPPORTED else LATEST,
            "capabilities": {**self._offered, "experimental": marked},
            "clientInfo": {"name": "aggregator", "version": __version__},
        }
        return Send(self.requests.open(INITIALIZE, params, None, now + self.init_timeout))

    def answer(self, message: dict[str, Any], now: float) -> list[Outcome]:
        """An answer to one of its own requests (an unknown or late one is dropped)."""
        waiting = self.requests.settle(message.get("id"))
        return [] if waiting is None else self.settled(waiting, message, now)

    def settled(self, waiting: Waiting[Any], message: dict[str, Any], now: float) -> list[Outcome]:
        """The answer ``message`` to one of its requests, taken from the table already."""
        if self.failed:
            return []
        outcome = outcomes.result_of(waiting.method, message)
        waiter = waiting.waiter
        if waiter is None:
            return self._initialized(outcome, now, message)
        if type(waiter) is Probe:
            return self._discovered(waiter, message, now)
        if isinstance(waiter, outcomes.Caller):
            return [outcomes.answer_of(waiter, outcome)]
        return self._page(waiter, outcome, now)

    def request(
        self, method: str, params: dict[str, Any] | None, caller: object, now: float, timeout: float = math.inf
    ) -> Send:
        """A request of the proxy's own; its ``Answer`` names ``caller``."""
        if self.speaks is MODERN_ERA:
            params = dict(params or {})
            params["_meta"] = dict(params.get("_meta") or {}, **self.meta())
        return Send(self.requests.open(method, params, outcomes.Caller(caller), now + timeout))

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
            if isinstance(job, outcomes.Caller):
                out.append(outcomes.answer_of(job, outcomes.Error(f"{waiting.method}: no answer in time")))
            elif type(job) is Probe:
                out += self._probe_unanswered(job, now)
            elif job is None or job.mode == INITIAL:  # the handshake, or the listing after it
                out.append(self._fail(f"no answer to {waiting.method} within {self.init_timeout}s"))
            else:
                out += self._kind_failed(job, outcomes.Error(f"no answer within {self.request_timeout}s"), now)
        return out

    def next_deadline(self) -> float | None:
        return None if self.failed else self.requests.next_deadline()

    @staticmethod
    def owns(waiter: object) -> bool:
        """Whether ``waiter`` (of a request in a shared table) is a lifecycle's."""
        return waiter is None or type(waiter) is _Job or type(waiter) is outcomes.Caller or type(waiter) is Probe

    # --- the era ------------------------------------------------------------------------

    def _discovered(self, probe: Probe, message: dict[str, Any], now: float) -> list[Outcome]:
        self.probing = False
        error = message.get("error")
        if type(error) is dict and self._is_us(error.get("data")):  # it refused our probe: it is us
            return [self._itself()]
        if self.per_session and type(error) is dict and _credential_refusal(error):
            return [self._refused_credential(error)]
        verdict = era.judge(probe, message, pinned=self.protocol in MODERN, tried=self._tried)
        if type(verdict) is era.Legacy:
            self.learnt = Era.LEGACY
            self.log.info("server %s: %s; taking it for a legacy server (initialize)", self.name, verdict.why)
            return [self._initialize(now)]
        self.learnt = Era.MODERN
        if type(verdict) is era.Retry:
            return [self._discover(verdict.version, now + self.init_timeout)]
        if type(verdict) is era.Refused:
            return [self._fail(verdict.reason, verdict.code)]
        assert type(verdict) is era.Modern
        if self._is_us(verdict.result.get("_meta")):
            return [self._itself()]
        self.speaks, self.version = Era.MODERN, verdict.version
        return self._ready(verdict.result, now, [])

    def _probe_unanswered(self, probe: Probe, now: float) -> list[Outcome]:
        if self.protocol in MODERN or self.era is MODERN_ERA:
            self.probing = False
            return [self._fail(f"no answer to server/discover within {self.init_timeout}s")]
        self._probe_late = True
        said = "server %s: no answer to server/discover within %ss; taking it for a legacy server (initialize)"
        self.log.info(said, self.name, self.discover_timeout)
        return [self._initialize(now)]

    # --- the handshake -----------------------------------------------------------------

    def _initialized(
        self, outcome: dict[str, Any] | outcomes.Error, now: float, message: dict[str, Any]
    ) -> list[Outcome]:
        if type(outcome) is outcomes.Error:
            error = message.get("error")
            if type(error) is dict and self._is_us(error.get("data")):  # it refused our initialize: it is us
                return [self._itself()]
            late = outcome.code == METHOD_NOT_FOUND and self._probe_late  # modern, slower than the probe
            if outcome.code in modern.MODERN_ERRORS or late:  # a modern server after all: probe it next time
                self.learnt = Era.MODERN
                why = era.slow_probe(self.name, self.discover_timeout, self.init_timeout) if late else era.NEXT
                return [self._fail(f"{outcome.text}: {why}", outcome.code)]
            if self.per_session and type(error) is dict and _credential_refusal(error):
                return [self._refused_credential(error)]
            return [self._fail(outcome.text, outcome.code)]
        assert type(outcome) is dict
        problem = initialize_result_problem(outcome)
        if problem is not None:
            return [self._fail(f"its initialize result is unusable: {problem}")]
        if self._is_us(outcome.get("_meta")):  # through another proxy that did not know us
            return [self._itself()]
        self.version, self.learnt = outcome["protocolVersion"], Era.LEGACY  # (a slow probe is not repeated)
        return self._ready(outcome, now, [Send({"jsonrpc": "2.0", "method": INITIALIZED})])

    def _ready(self, outcome: dict[str, Any], now: float, out: list[Outcome]) -> list[Outcome]:
        """The handshake (or discovery) is done: serve, after listing for a shared connection."""
        self.capabilities = outcome["capabilities"]
        out.append(Ready(outcome))
        if self.per_session:
            out += self._serve(now)
        else:
            kinds = [kind for kind in KINDS if CAPABILITY_OF[kind] in self.capabilities]
            out += self._start(_Job(INITIAL, kinds, now + self.init_timeout), now)
        return out

    def _refused_credential(self, error: dict[str, Any]) -> Failed:
        """No credential of its user's could be sent (the proxy answered its first request,
        ``server/discover`` or ``initialize``, for it): the requests waiting for this
        connection get that answer, which says why or what to do (the URL to open); the log
        gets no URL (its state is the user's alone)."""
        code = error.get("code")
        failed = self._fail("no credential of its user's could be sent to it", code if type(code) is int else None)
        return failed._replace(refusal=error)

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
        self.probing = False
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
        params: dict[str, Any] | None = {"cursor": cursor} if cursor is not None else None
        if self.speaks is MODERN_ERA:
            params = dict(params or {}, _meta=self.meta())
        return Send(self.requests.open(method, params, job, job.deadline))

    def _page(self, job: _Job, outcome: dict[str, Any] | outcomes.Error, now: float) -> list[Outcome]:
        kind = job.kinds[0]
        if type(outcome) is outcomes.Error:
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
            said = "server %s: %s has more than %d pages; keeping %d items"
            self.log.warning(said, self.name, method, MAX_LIST_PAGES, len(job.items))
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

    def _kind_failed(self, job: _Job, error: outcomes.Error, now: float) -> list[Outcome]:
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


def _credential_refusal(error: dict[str, Any]) -> bool:
    """Whether an error is the proxy's own answer for a connection that could send no
    credential of its user's (``upstreams.streamable_http_upstream.unauthorized_error``)."""
    data = error.get("data")
    return type(data) is dict and data.get("source") == "aggregator" and data.get("reason") == "unauthorized"

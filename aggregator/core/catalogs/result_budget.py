"""Result budgets: a tool result larger than its profile's ``max_result_tokens`` is cut, and
the rest kept for the caller to page through. Sans-IO.

What counts is the text a model reads in the result's ``content``: its text items and
embedded text resources (estimated as ``core.catalogs.tokens`` does). Past the budget the client
gets, in order, the text up to the budget (the item where it runs out is cut, the text
items after it are taken out; images, audio, blobs and links stay where they are), then a
text note of what was left out and a ``resource_link`` to it
(``aggregator://results/<token>``; the note alone for clients older than 2025-06-18,
which know no resource links). ``structuredContent`` passes whole: it cannot be cut and
stay valid against the tool's output schema, which the official SDKs check (a client
that drops it would fail the call).

The rest is kept by the proxy for ``keep_results_for`` seconds, readable only by its
owner: the bearer token (principal) that made the call, or without one the session.
``resources/read`` of its URI gives the first page of ``max_result_tokens``;
``?page=N`` the others, each ending with where the next is. A URI that is unknown,
expired or another caller's gets the same "Unknown resource" (no oracle). Memory is
bounded (``core.catalogs.kept_results``).

Shared (``[cluster]`` keys and store, ``shared``): a rest whose owner every replica can
name (``shared_owner``: a token's principal, a stateless caller without one, a session
with a sealed id) is also written to the store as it is cut (``ShareKept``, which carries
the answer: it is sent once the store has the rest, so the caller cannot ask another
replica for it sooner), at most ``SHARED_KEPT_BYTES`` of it (the
rest kept here is cut to the same, so that every replica serves the same pages). A read
this replica cannot serve becomes ``FetchKept``; the trio layer answers with the event
``KeptFetched``, and ``fetched`` answers the read: the page, or the same "Unknown resource"
(the store down, too). What was fetched is kept here for the rest of its time, so its
other pages cost no second read. The core never waits: the read's caller does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from aggregator.core.catalogs.kept_results import Kept, KeptResults, cut_utf8, page_of
from aggregator.core.catalogs.tokens import BYTES_PER_TOKEN, tokens_of, tokens_of_bytes
from aggregator.core.commands import Command, FetchKept, ShareKept, ToClient
from aggregator.core.events import KeptFetched
from aggregator.core.records.clients import ClientState
from aggregator.core.settings import Discovery, discovery_of
from aggregator.jsonrpc.errors import INVALID_PARAMS, RemoteProtocolError

RESULTS = "aggregator://results/"
RESULTS_SCHEME = "aggregator:"
NOTE_TOKENS = 120  # what the note and the link take of the budget
_LINKS_FROM = "2025-06-18"  # the first revision with resource_link content
# A rest in the shared store, at most (about two million tokens; a Redis reply of the store
# client stays under its 16 MiB bound).
SHARED_KEPT_BYTES = 8 * 1024 * 1024
NO_ANSWER = ToClient(0, None)  # the answer a ShareKept carries until the caller's is put in
_TOKEN = re.compile(r"[A-Za-z0-9_-]{24}\Z")  # what ``KeptResults.keep`` mints: nothing else is looked up


def _text_of(item: Any) -> str | None:
    """The text a content item carries for a model (text, an embedded text resource)."""
    if type(item) is not dict:
        return None
    if item.get("type") == "text" and type(item.get("text")) is str:
        return str(item["text"])
    resource = item.get("resource")
    if item.get("type") == "resource" and type(resource) is dict and type(resource.get("text")) is str:
        return str(resource["text"])
    return None


def _with_text(item: dict[str, Any], text: str) -> dict[str, Any]:
    if item.get("type") == "text":
        return {**item, "text": text}
    return {**item, "resource": {**item["resource"], "text": text}}


def over_budget(result: dict[str, Any], budget: int) -> bool:
    """Whether the text a model reads of ``result`` is over ``budget`` tokens. A character is
    at most four UTF-8 bytes, one token: text of no more characters than the budget fits
    without being encoded (the common case costs a ``len`` per item)."""
    content = result.get("content")
    texts = [text for item in (content if type(content) is list else ()) if (text := _text_of(item)) is not None]
    if sum(len(text) for text in texts) <= budget:
        return False
    return sum(tokens_of(text) for text in texts) > budget


def cut_result(result: dict[str, Any], budget: int) -> tuple[str, int, int]:
    """Cut ``result`` in place to ``budget`` tokens (less the note's share); return the rest
    (UTF-8 text), and the tokens shown and in all. The caller adds the note and the link."""
    room = max(1, budget - NOTE_TOKENS) * BYTES_PER_TOKEN
    given = result.get("content")
    content: list[Any] = given if type(given) is list else []
    shown: list[Any] = []
    rest: list[str] = []
    total = shown_tokens = 0
    for item in content:
        text = _text_of(item)
        if text is None:
            shown.append(item)
            continue
        total += tokens_of(text)
        if rest or room <= 0:
            rest.append(text)
            continue
        head, tail = cut_utf8(text, room)
        room -= len(head.encode("utf-8", "surrogatepass"))
        shown_tokens += tokens_of(head)
        if not tail:
            shown.append(item)  # whole (an empty one too)
        elif head:
            shown.append(_with_text(item, head))
        if tail:
            rest.append(tail)
    result["content"] = shown
    return "\n\n".join(rest), shown_tokens, total


def note_and_link(
    uri: str, kept: Kept, shown: int, total: int, ttl: float, version: str | None
) -> list[dict[str, Any]]:
    """What is added to a cut result's content: a note a model reads, and a link to the rest."""
    rest_tokens = tokens_of_bytes(kept.size)
    pages = "one page" if len(kept.pages) == 1 else f"{len(kept.pages)} pages, each naming the next"
    text = (
        f"[aggregator: this result was cut to fit the context: about {shown:,} of {total:,} tokens are shown. "
        f"The rest (about {rest_tokens:,} tokens, {pages}) is at {uri}; read it with resources/read. "
        f"It is kept for {ttl:g} seconds.]"
    )
    added: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if version is not None and version >= _LINKS_FROM:
        description = f"The rest of a tool result the aggregator cut ({rest_tokens:,} tokens)"
        link = {"type": "resource_link", "uri": uri, "name": "rest-of-result", "description": description}
        added.append({**link, "mimeType": "text/plain", "size": kept.size})
    return added


def owner_of(client: ClientState) -> Any:
    """Who may read what a client's calls left: its bearer token's principal; without one,
    its session (a stateless 2026-07-28 HTTP caller without a token has none: anyone
    without a token who holds the link)."""
    if client.principal is not None:
        return ("principal", client.principal)
    if client.stateless:
        return ("anonymous",)
    return ("session", client.key)


def shared_owner(client: ClientState) -> str | None:
    """Who may read what a client's calls left, as every replica names it (``owner_of``
    across replicas): a static token's index, an access token's issuer and subject, a
    stateless caller without a token, or a session by its name on every replica. None: a
    session known to this replica alone (no sealed id): nothing of it is shared."""
    principal = client.principal
    if principal is not None:
        if type(principal) is int:
            return f"token:{principal}"
        issuer, subject = getattr(principal, "issuer", None), getattr(principal, "subject", None)
        if type(issuer) is str and type(subject) is str:
            return f"principal:{len(issuer)}:{issuer}{subject}"
        return None
    if client.stateless:
        return "anonymous"
    return None if client.shared_name is None else f"session:{client.shared_name}"


def _unknown(uri: str, id: Any = None) -> RemoteProtocolError:
    error = RemoteProtocolError(
        INVALID_PARAMS,
        f"Unknown resource: {uri[:200]} (the rest of a cut result is kept for a while, "
        "and only its caller may read it)",
    )
    error.id = id
    return error


class ResultBudgets:
    """Cutting tool results to their profile's budget, and reading back the rest (kept in
    ``kept`` until then)."""

    def __init__(self, clock: Callable[[], float], discovery: dict[str, Discovery], *, shared: bool = False) -> None:
        self.clock = clock
        self.kept = KeptResults()
        self.shared = shared  # rests written to the shared store and read back from it
        self.renew(discovery)

    def renew(self, discovery: dict[str, Discovery]) -> None:
        """Each profile's settings (``discovery``: profile -> them), new or renewed."""
        self.discovery = discovery
        self.on = any(d.max_result_tokens for d in discovery.values())  # whether any profile cuts

    def cut(self, client: ClientState, result: dict[str, Any]) -> ShareKept | None:
        """Cut ``client``'s tool result to its profile's budget in place, keeping the rest;
        what to write to the shared store, when it is shared."""
        discovery = discovery_of(self.discovery, client.profile)
        budget = discovery.max_result_tokens
        if not budget or not over_budget(result, budget):
            return None
        now = self.clock()
        rest, shown, total = cut_result(result, budget)
        owner = owner_of(client)
        shared = shared_owner(client) if self.shared else None
        if shared is not None:
            rest, _ = cut_utf8(rest, SHARED_KEPT_BYTES)
        ttl = discovery.keep_results_for
        page_bytes = budget * BYTES_PER_TOKEN
        token, kept = self.kept.keep(owner, rest, page_bytes, now + ttl, now)
        added = note_and_link(RESULTS + token, kept, shown, total, ttl, client.protocol_version)
        result["content"] = [*result["content"], *added]
        return None if shared is None else ShareKept(token, shared, rest, page_bytes, ttl, NO_ANSWER)

    def forget(self, key: int) -> None:
        """Client session ``key`` went away: what its calls left for it alone goes."""
        if self.kept.items:
            self.kept.drop_owner(("session", key))

    def read(self, client: ClientState, message: dict[str, Any], uri: str) -> list[Command]:
        """``resources/read`` of a kept rest: the page asked for, if it is this caller's."""
        token, _, query = uri[len(RESULTS) :].partition("?") if uri.startswith(RESULTS) else ("", "", "")
        digits = query[5:] if query.startswith("page=") else ""
        page = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 9 else (0 if query else 1)
        kept = self.kept.get(owner_of(client), token, self.clock())
        if kept is None and page >= 1 and self.shared and _TOKEN.match(token):
            shared = shared_owner(client)
            if shared is not None:  # kept by another replica, perhaps: the store is asked
                return [FetchKept(client.key, message["id"], token, shared, uri, page)]
        if kept is None or not 1 <= page <= len(kept.pages):
            raise _unknown(uri)
        result = page_of(kept, uri, page)
        return [ToClient(client.key, {"jsonrpc": "2.0", "id": message["id"], "result": result})]

    def fetched(self, client: ClientState, event: KeptFetched) -> dict[str, Any]:
        """The answer to a read that asked the shared store (``FetchKept``), now that it has
        answered (``event``): the page, kept here for the rest of its time, or "Unknown
        resource" when it had none of it for this caller."""
        fetch = event.fetch
        kept = None
        if event.text is not None and event.ttl > 0 and event.page_bytes > 0 and fetch.owner == shared_owner(client):
            now = self.clock()
            owner = owner_of(client)
            _, kept = self.kept.keep(owner, event.text, event.page_bytes, now + event.ttl, now, token=fetch.token)
        if kept is None or not 1 <= fetch.page <= len(kept.pages):
            return _unknown(fetch.uri, fetch.id).to_response()
        return {"jsonrpc": "2.0", "id": fetch.id, "result": page_of(kept, fetch.uri, fetch.page)}

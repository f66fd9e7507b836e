"""``aggregator status``: ask a running proxy's admin endpoint (``/status.json``) how it is
and print it: its servers, sessions, recent warnings and errors, and what each profile
hides. Exit 0 when it is ready, 1 when it is not or cannot be reached.

The endpoint is ``--admin`` (a URL or HOST:PORT), else the config's ``http.admin_listen``,
else its ``http.listen``. The token is ``--token``, else ``AGGREGATOR_ADMIN_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aggregator.cli.common import DEFAULT_CONFIG
from aggregator.cli.terminal import admin_base, bearer, printable
from aggregator.config import load_config
from aggregator.errors import AggregatorError

TOKEN_VARIABLE = "AGGREGATOR_ADMIN_TOKEN"
TIMEOUT = 10.0  # seconds


def run_status(args: argparse.Namespace) -> int:
    base = admin_url(args)
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    data = fetch_status(base, token)
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        try:
            lines = status_text(data)
        except (LookupError, TypeError, AttributeError, ValueError, OverflowError, OSError) as exc:
            # A field missing or of another type: something else answers there, or another version.
            raise AggregatorError(
                f"{base}/status.json: not a status answer this version can read ({type(exc).__name__}: {exc})"
            ) from None
        # What servers and clients wrote (stderr, errors, names) reaches the terminal as text.
        print("\n".join(printable(line) for line in lines))
    return 0 if data.get("ready") else 1


def admin_url(args: argparse.Namespace) -> str:
    """The admin endpoint's base URL from ``--admin`` (``args.admin``) or the config
    (``args.config``); AggregatorError when there is none."""
    address: str | None = args.admin
    if address is None:
        path = Path(args.config or DEFAULT_CONFIG)
        if args.config is None and not path.exists():
            raise AggregatorError(f"no {DEFAULT_CONFIG} here; pass --admin URL (or --config PATH)")
        http = load_config(path).http
        address = http.admin_listen or http.listen
        if address is None:
            raise AggregatorError(f"{path} sets neither http.admin_listen nor http.listen; pass --admin URL")
        return admin_base(address, "http.admin_listen" if http.admin_listen else "http.listen")
    return admin_base(address)


def fetch_status(base: str, token: str | None) -> dict[str, Any]:
    """``base``/status.json as JSON; AggregatorError (one line) when it cannot be had."""
    request = urllib.request.Request(f"{base}/status.json", headers={"accept": "application/json"})
    if token:
        request.add_header("authorization", bearer(token, f"--token or {TOKEN_VARIABLE}"))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:  # noqa: S310 - http(s) only, checked above
            data = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        hint = f" (give --token or set {TOKEN_VARIABLE})" if exc.code == 401 else ""
        raise AggregatorError(f"{base}/status.json answered {exc.code} {exc.reason}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise AggregatorError(f"cannot reach the admin endpoint at {base}: {reason}") from None
    except ValueError:
        raise AggregatorError(
            f"{base}/status.json did not answer JSON; is it an aggregator's admin endpoint?"
        ) from None
    if not isinstance(data, dict) or "servers" not in data:
        raise AggregatorError(f"{base}/status.json did not answer a status; is it an aggregator's admin endpoint?")
    return data


def status_text(data: dict[str, Any]) -> list[str]:
    """The status as a person reads it at a terminal."""
    readiness = data.get("readiness", {})
    state = "draining" if data.get("draining") else ("ready" if data.get("ready") else "not ready")
    lines = [
        f"aggregator {data.get('version', '?')}: {state}, {readiness.get('ready', '?')} of"
        f" {readiness.get('configured', '?')} servers ready ({readiness.get('needed', '?')} needed),"
        f" up for {duration(data.get('uptime'))}",
    ]
    store = data.get("store")
    if isinstance(store, dict) and store.get("kind") != "memory":  # a shared store is configured
        trip = store.get("round_trip_ms")
        said = f"up, round trip {trip} ms" if store.get("up") else f"down: {store.get('last_error') or 'not connected'}"
        lines.append(f"shared store {store.get('address')}: {said}")
    lines += ["", "SERVERS"]
    for server in data.get("servers", []):
        era = f"{server['era']} {server['protocol']}" if server.get("era") else ""
        up = f"up {duration(server['uptime'])}" if server.get("uptime") is not None else ""
        restarts = f"{server['restarts']} restarts" if server.get("restarts") else ""
        sessions = f"{server['sessions']} sessions as their users" if server.get("sessions") is not None else ""
        started = f"started in {server['last_start']:.2f}s" if server.get("last_start") is not None else ""
        details = "  ".join(part for part in (up, restarts, started, era, sessions) if part)
        lines.append(f"  {server['name']:<20} {server['state']:<9} {details}".rstrip())
        if server.get("last_error"):
            at = server.get("last_error_at")
            when = f"at {time.strftime('%H:%M:%S', time.localtime(at))}: " if isinstance(at, (int, float)) else ""
            lines.append(f"  {'':<20} {when}{server['last_error']}")
        if server.get("state") not in ("ready", "lazy", "idle-stopped") or server.get("last_error"):
            lines += [f"  {'':<20} [stderr] {line}" for line in server.get("stderr", [])]
    sessions = data.get("sessions", [])
    lines += ["", f"SESSIONS ({len(sessions)})"]
    for session in sessions:
        lines.append(
            f"  {session['transport']:<28} {session.get('profile') or '':<12} {session.get('protocol') or '':<11}"
            f" {session.get('in_flight', 0):>3} in flight  {duration(session['age'])}"
        )
    errors = data.get("errors", [])
    if errors:
        lines += ["", f"RECENT WARNINGS AND ERRORS ({len(errors)}, newest first)"]
        for error in errors[:10]:
            when = time.strftime("%H:%M:%S", time.localtime(error["time"]))
            repeats = f" ({error['count']} times)" if error.get("count", 1) > 1 else ""
            lines.append(f"  {when} {error['level']:<8} {error['message']}{repeats}")
    for profile, view in data.get("catalog", {}).items():
        shown = sum(len(items) for items in view.get("exposed", {}).values())
        hidden = [(kind, item) for kind, items in view.get("hidden", {}).items() for item in items]
        lines += ["", f"PROFILE {profile}: {shown} shown, {len(hidden)} hidden"]
        lines += [f"  {item['server']}:{item['original']}  hidden by {item['rule']}" for _, item in hidden]
    return lines


def duration(seconds: float | None) -> str:
    """12 -> "12s", 125 -> "2m 5s", 7300 -> "2h 1m", 90000 -> "1d 1h"."""
    if seconds is None:
        return "?"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"

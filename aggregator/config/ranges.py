"""The range of every number in the configuration, checked at load with its key path."""

from __future__ import annotations

import math
from typing import Any

import attrs

from aggregator.config.model import AuthConfig, ClusterConfig, HttpConfig, ProxyConfig, ServerConfig
from aggregator.config.upstream_auth import CredentialsConfig
from aggregator.jsonrpc.codec import MAX_DEPTH_LIMIT

# --- value ranges -------------------------------------------------------------------------
#
# Every number in the configuration has a range, checked at load with its key path. A
# float is always finite (TOML allows nan and inf, and a nan deadline either never fires
# or breaks the timer); zero is allowed only where it means something ("do not wait");
# the upper bounds are far beyond any sensible value and catch unit mistakes
# (milliseconds written as seconds, a size in bits) before they disable a limit.

_DAY = 86_400.0
_GIB = 1 << 30


@attrs.frozen
class Range:
    """The valid values of one numeric key: ``low <= value <= high``."""

    low: int | float  # an int low makes an integer key; a float, a number of ``unit``
    high: int | float
    unit: str = ""  # "seconds", "bytes", ... for the message

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range (None if it is fine)."""
        finite = not isinstance(value, float) or math.isfinite(value)
        if finite and self.low <= value <= self.high:
            return None
        what = f"a finite number of {self.unit}" if isinstance(self.low, float) else "an integer"
        if not isinstance(self.low, float) and self.unit:
            what += f" ({self.unit})"
        return f"must be {what} from {number_text(self.low)} to {number_text(self.high)}, got {value!r}"


def number_text(value: float) -> str:
    """1073741824 rather than 1.07374e+09; 0.001 rather than 0.0010."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


_MS = 0.001  # the shortest deadline accepted where zero makes no sense
RANGES: dict[type, dict[str, Range]] = {
    ProxyConfig: {
        "startup_timeout": Range(0.0, _DAY, "seconds"),  # 0: do not wait for slow servers
        "idle_stop_after": Range(0.0, 30 * _DAY, "seconds"),  # 0: never
        "page_size": Range(1, 100_000, "items"),
        "min_ready": Range(0, 1_000_000, "servers"),
        "max_message_bytes": Range(1024, _GIB, "bytes"),
        "restart_backoff_initial": Range(_MS, 3600.0, "seconds"),
        "restart_backoff_max": Range(_MS, _DAY, "seconds"),
        "list_changed_debounce": Range(0.0, 60.0, "seconds"),  # 0: announce at once
        "max_in_flight_per_session": Range(1, 1_000_000, "requests"),
        "input_required_timeout": Range(_MS, _DAY, "seconds"),
        "max_parked_calls": Range(1, 1_000_000, "calls"),
        "max_parked_per_principal": Range(1, 1_000_000, "calls"),
        "drain_timeout": Range(0.0, _DAY, "seconds"),  # 0: stop at once
        "max_name_length": Range(16, 128, "characters"),
        "max_json_depth": Range(16, MAX_DEPTH_LIMIT, "levels"),
        "client_buffer_bytes": Range(1024, _GIB, "bytes"),
        "total_client_buffer_bytes": Range(1024, _GIB, "bytes"),
        "client_write_timeout": Range(_MS, _DAY, "seconds"),
        "server_buffer_bytes": Range(1024, _GIB, "bytes"),
        "server_write_timeout": Range(_MS, _DAY, "seconds"),
    },
    HttpConfig: {
        "max_body_bytes": Range(1024, _GIB, "bytes"),
        "max_header_bytes": Range(1024, 1 << 20, "bytes"),
        "header_timeout": Range(_MS, _DAY, "seconds"),
        "body_timeout": Range(_MS, _DAY, "seconds"),
        "keepalive_timeout": Range(_MS, _DAY, "seconds"),
        "max_connections": Range(1, 1_000_000, "connections"),
        "max_sessions": Range(1, 1_000_000, "sessions"),
        "max_stateless_requests": Range(1, 1_000_000, "requests"),
        "max_stateless_per_principal": Range(1, 1_000_000, "requests"),
        "session_idle_timeout": Range(_MS, 30 * _DAY, "seconds"),
        "stream_drop_grace": Range(0.0, _DAY, "seconds"),  # 0: cancel at once
        "max_stream_buffer_bytes": Range(1024, _GIB, "bytes"),
        "write_timeout": Range(_MS, _DAY, "seconds"),
    },
    AuthConfig: {
        "leeway": Range(0.0, 3600.0, "seconds"),
        "jwks_cache_seconds": Range(1.0, _DAY, "seconds"),
        "jwks_refresh_interval": Range(0.0, _DAY, "seconds"),  # 0: on every unknown key id
        "fetch_timeout": Range(_MS, 120.0, "seconds"),
        "introspection_cache_seconds": Range(0.0, _DAY, "seconds"),  # 0: ask every time
    },
    ServerConfig: {
        "init_timeout": Range(_MS, _DAY, "seconds"),
        "idle_stop_after": Range(0.0, 30 * _DAY, "seconds"),  # 0: never
        "discover_timeout": Range(_MS, _DAY, "seconds"),
        "request_timeout": Range(_MS, 7 * _DAY, "seconds"),
        "max_request_timeout": Range(_MS, 7 * _DAY, "seconds"),
    },
    ClusterConfig: {
        "session_lifetime": Range(60.0, 366 * _DAY, "seconds"),
    },
    CredentialsConfig: {
        "fetch_timeout": Range(0.1, 600.0, "seconds"),
        "max_response_bytes": Range(1024, 16 << 20, "bytes"),
        "consent_timeout": Range(10.0, _DAY, "seconds"),
        "refresh_margin": Range(0.0, 3600.0, "seconds"),
    },
}


def in_range(value: Any, *keys: str) -> bool:
    """Whether these keys are all in range (a check that compares them is meaningful)."""
    ranges = RANGES[type(value)]
    return all(ranges[key].problem(getattr(value, key)) is None for key in keys)


def check_ranges(value: Any, path: str) -> list[str]:
    """Problems with the numbers of one structured table (``proxy``, ``http``, a server).

    Keys listed in RANGES get their range; any other float must still be finite, so that a
    key added without a range cannot take nan or inf.
    """
    ranges = RANGES.get(type(value), {})
    problems = []
    for field in attrs.fields(type(value)):
        number = getattr(value, field.name)
        if isinstance(number, bool) or not isinstance(number, int | float):
            continue
        if field.name in ranges:
            problem = ranges[field.name].problem(number)
        elif isinstance(number, float) and not math.isfinite(number):
            problem = f"must be a finite number, got {number!r}"
        else:
            problem = None
        if problem:
            problems.append(f"{path}.{field.name}: {problem}")
    return problems

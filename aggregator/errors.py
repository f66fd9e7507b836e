"""The aggregator's own exceptions. Protocol errors from peers live in jsonrpc.errors."""


class AggregatorError(Exception):
    """Base class for errors the aggregator reports to its user."""


class ConfigError(AggregatorError):
    """The configuration cannot be used; the message names each key path at fault."""

    def __init__(self, problems: list[str] | str, *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"invalid configuration in {source}" if source else "invalid configuration"
        super().__init__(head + ":\n" + "\n".join(f"  {p}" for p in self.problems))


class UpstreamError(AggregatorError):
    """An upstream server could not be started, initialized or listed.

    When the server answered a request of the proxy's own with a JSON-RPC error, ``code``
    and ``message`` are that error's (``code`` only if it is an integer, as JSON-RPC
    requires); otherwise both are None.
    """

    def __init__(self, text: str, *, code: int | None = None, message: str | None = None) -> None:
        super().__init__(text)
        self.code = code
        self.message = message


class StoreError(AggregatorError):
    """The shared store refused a command (the server answered with an error) or its reply
    was over the size bound; ``StoreUnavailable`` is the kind a later retry may cure."""


class StoreUnavailable(StoreError):
    """The shared store cannot be reached now: not connected, the connection dropped, or
    no answer within the deadline. Calls that need the store fail at once while it is down."""

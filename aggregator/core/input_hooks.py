"""What the input bridge (``input_bridge``) offers the router's other groups, declared for
the type checker only. Sans-IO; imports nothing of the router's state (which imports
this), so its records are typed ``Any`` here and precisely where defined."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aggregator.core.commands import Command


class InputHooks:
    """A base of ``RouterState``: at run time nothing; to the type checker, the methods
    ``InputBridge`` defines and ``ServerMessages``, ``ClientEvents`` and ``InFlight`` call."""

    __slots__ = ()

    if TYPE_CHECKING:

        def _bridges_input(self, link: Any, pending: Any, result: Any) -> bool: ...
        def _bridge_input(self, link: Any, pending: Any, result: dict[str, Any]) -> list[Command]: ...
        def _input_answered(self, client: Any, reverse: Any, message: dict[str, Any]) -> list[Command]: ...
        def _input_refused(self, reverse: Any, why: str, reason: str) -> list[Command]: ...
        def _input_closed(self, waiting: Any, why: str) -> list[Command]: ...
        def _input_timed_out(self, waiting: Any) -> list[Command]: ...
        def _inputs_lost(self, link: Any, message: str, reason: str) -> list[Command]: ...
        def _inputs_abandoned(self) -> list[Command]: ...

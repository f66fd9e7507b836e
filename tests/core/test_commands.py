"""The commands the core returns (``aggregator.core.commands``): one typed union, and every
router method that returns them says so (never ``list[Any]``)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import attrs
import pytest

from aggregator.core import commands
from aggregator.core.commands import (
    Answer,
    Command,
    DropUpstream,
    FetchKept,
    RequestEnded,
    ShareKept,
    StartUpstream,
    StopIdle,
    StopUpstream,
    ToClient,
    ToServer,
    UpstreamServing,
    WaitForStartup,
    WakeUpstream,
)
from aggregator.core.events import ClientMessage
from tests.core.helpers import msg

CORE = Path(__file__).parents[2] / "aggregator" / "core"

FIELDS = [
    (ToClient, ("session", "message", "related")),
    (ToServer, ("server", "message")),
    (UpstreamServing, ("server",)),
    (DropUpstream, ("server", "reason")),
    (Answer, ("caller", "result", "error", "code", "message")),
    (StartUpstream, ("server", "name", "session", "capabilities")),
    (StopUpstream, ("name",)),
    (WakeUpstream, ("server",)),
    (StopIdle, ("server",)),
    (WaitForStartup, ("session",)),
    (RequestEnded, ("session", "id")),
    (ShareKept, ("token", "owner", "text", "page_bytes", "ttl", "answer")),
    (FetchKept, ("session", "id", "token", "owner", "uri", "page")),
]


@pytest.mark.parametrize(("command", "fields"), FIELDS, ids=lambda c: getattr(c, "__name__", ""))
def test_each_command_is_an_attrs_record_with_its_fields(command, fields):
    assert tuple(field.name for field in attrs.fields(command)) == fields
    assert command in typing.get_args(Command)


def test_the_union_names_every_command_and_nothing_else():
    defined = {obj for obj in vars(commands).values() if isinstance(obj, type) and obj.__module__ == commands.__name__}
    assert set(typing.get_args(Command)) == defined == {command for command, _ in FIELDS}


def _list_any_returns(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.name}:{node.lineno} {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.returns is not None and ast.unparse(node.returns) == "list[Any]"
    ]


# The modules that make commands: the router's groups.
MAKERS = sorted(p for p in CORE.rglob("*.py") if "aggregator.core.commands import" in p.read_text())


def test_the_groups_make_commands():
    assert len(MAKERS) >= 12 and any(p.name == "router.py" for p in MAKERS)


@pytest.mark.parametrize("path", MAKERS, ids=lambda p: p.name)
def test_no_router_method_returns_a_list_of_any(path):
    assert _list_any_returns(path) == []


def test_the_return_check_sees_a_list_of_any(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import Any\ndef f() -> list[Any]:\n    return []\n")
    assert _list_any_returns(sample) == ["sample.py:2 f"]


def test_what_the_router_returns_is_of_the_union(router):
    out = router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"})))
    out += router.handle(ClientMessage(1, msg(id=2, method="ping")))
    assert [type(c) for c in out] == [ToServer, ToClient]
    assert all(isinstance(c, typing.get_args(Command)) for c in out)

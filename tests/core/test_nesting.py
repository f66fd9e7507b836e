"""The loop guard's rules: reading the chain of configs, and who may start below it."""

import pytest

from aggregator.config import structure_config
from aggregator.core.catalogs.nesting import CHAIN_VARIABLE, MAX_DEPTH, NestingRefused, chain_value, enter, parse_chain
from aggregator.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "chain"),
    [
        (None, ()),
        ("[]", ()),
        ('["/a.toml"]', ("/a.toml",)),
        ('["/a.toml", "/b/claude_desktop_config.json"]', ("/a.toml", "/b/claude_desktop_config.json")),
        ('["/with space/and:colon.toml", "/\\u00e9.toml"]', ("/with space/and:colon.toml", "/\u00e9.toml")),
    ],
)
def test_parse(value, chain):
    assert parse_chain(value) == chain


@pytest.mark.parametrize(
    "value", ["", "/a.toml", "/a.toml:/b.toml", "{}", '"/a.toml"', "[1]", '[""]', '["/a", null]', "[", "x" * 500]
)
def test_a_chain_no_aggregator_wrote_is_refused(value):
    with pytest.raises(NestingRefused) as info:
        parse_chain(value)
    message = str(info.value)
    assert CHAIN_VARIABLE in message and "unset it" in message
    assert "\n" not in message and len(message) < 250


@pytest.mark.parametrize(
    ("chain", "config", "after"),
    [
        ((), "/a.toml", ("/a.toml",)),
        (("/a.toml",), "/b.toml", ("/a.toml", "/b.toml")),
        (("/a.toml", "/b.json"), "/c.toml", ("/a.toml", "/b.json", "/c.toml")),
        (
            tuple(f"/c{i}.toml" for i in range(MAX_DEPTH - 1)),
            "/last.toml",
            (*(f"/c{i}.toml" for i in range(MAX_DEPTH - 1)), "/last.toml"),
        ),
    ],
)
def test_enter_admits(chain, config, after):
    assert enter(chain, config) == after
    assert parse_chain(chain_value(after)) == after


@pytest.mark.parametrize(
    ("chain", "config", "shown"),
    [
        (("/a/b.toml",), "/a/b.toml", "/a/b.toml -> /a/b.toml"),
        (("/a.toml", "/b.toml"), "/a.toml", "/a.toml -> /b.toml -> /a.toml"),
        (("/x.toml", "/c.json", "/d.toml"), "/c.json", "/x.toml -> /c.json -> /d.toml -> /c.json"),
    ],
)
def test_a_config_already_in_the_chain_is_refused(chain, config, shown):
    with pytest.raises(NestingRefused) as info:
        enter(chain, config)
    assert str(info.value) == (
        f"config {config} is already being served by a parent aggregator, and a config"
        f" must not list the aggregator serving it (chain: {shown})"
    )


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 3])
def test_a_chain_too_deep_is_refused_whatever_the_configs(depth):
    chain = tuple(f"/copy{i}.toml" for i in range(depth))
    with pytest.raises(NestingRefused) as info:
        enter(chain, "/new.toml")
    assert str(info.value).startswith(
        f"{depth} aggregators are already running one inside the other, and a config"
        " must not list, directly or through other configs, the aggregator serving it"
        " (chain: /copy0.toml -> /copy1.toml -> "
    )
    assert str(info.value).endswith(f"/copy{depth - 1}.toml -> /new.toml)")
    assert enter(chain, "/new.toml", max_depth=depth + 1)[-1] == "/new.toml"


def test_a_server_env_cannot_set_the_chain():
    with pytest.raises(ConfigError) as info:
        structure_config({"servers": {"a": {"command": "x", "env": {CHAIN_VARIABLE: "[]", "OTHER": "1"}}}})
    assert info.value.problems == [
        f"servers.a.env.{CHAIN_VARIABLE}: set by the aggregator itself for every server it starts"
        " (its guard against serving itself); a config cannot set it"
    ]
    structure_config({"servers": {"a": {"command": "x", "env": {"OTHER": "1"}}}})

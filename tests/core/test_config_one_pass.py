"""Every problem of a config in one run: its tables', its [proxy]'s, its profiles' and its
plugins', each by key path."""

import pytest

from aggregator.config import load_config, structure_config
from aggregator.errors import ConfigError
from aggregator.plugins.resolve import plugin_problems


def test_plugin_proxy_profile_and_server_problems_come_together(tmp_path):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "fine_plugin.py").write_text(
        "class P:\n    def __init__(self, level: int = 1, **rest: object) -> None:\n        pass\n"
    )
    path = tmp_path / "a.toml"
    path.write_text(
        '[proxy]\nseparator = ""\n'
        '[servers.t]\ncommand = "srv"\nargs = ["${FOO"]\n'
        '[servers."bad name"]\ncommand = "srv"\n'
        "[profiles.p]\nservers = { nosuch = {} }\n"
        '[[plugins]]\nuse = "broken_plugin.py:P"\n'
        '[[plugins]]\nuse = "rate-limit"\noptions = { nonsense = 1 }\n'
        '[[plugins]]\nuse = "nosuch"\n'
        '[[plugins]]\nuse = "json:nothing"\n'
        '[[plugins]]\nuse = "fine_plugin.py:P"\noptions = { anything = 1 }\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, plugin_check=plugin_problems)
    found = info.value.problems
    expected = [
        "servers.t.args[0]: an unclosed ${",
        "plugins[0].use: cannot load 'broken_plugin.py:P': RuntimeError: boom at import",
        "plugins[1].options.nonsense: unknown option (rate-limit takes: rate, burst, per, sync_every, clock)",
        "plugins[1].options.rate: required by rate-limit",
        "plugins[2].use: cannot load 'nosuch': no plugin named 'nosuch' (installed: ",
        "plugins[3].use: cannot load 'json:nothing': json has no 'nothing'",
        "proxy.separator: must be one or more of A-Z a-z 0-9 _ . -",
        "servers.bad name: a server key may only contain A-Z a-z 0-9 _ . -",
        "profiles.p.servers.nosuch: no such server",
    ]
    for start in expected:
        assert sum(problem.startswith(start) for problem in found) == 1, (start, found)
    assert not any(problem.startswith("plugins[4]") for problem in found)  # **rest takes any option


def test_plugins_are_checked_without_being_built(tmp_path):
    marker = tmp_path / "built"
    (tmp_path / "p.py").write_text(
        f"class P:\n    def __init__(self, path: str) -> None:\n        open({str(marker)!r}, 'w').close()\n"
    )
    path = tmp_path / "a.toml"
    path.write_text('[servers.s]\ncommand = "srv"\n[[plugins]]\nuse = "p.py:P"\noptions = { path = "x" }\n')
    config = load_config(path, plugin_check=plugin_problems)
    assert config.plugins[0].options == {"path": str(tmp_path / "x")} and not marker.exists()


def test_a_rule_table_of_the_wrong_type_is_said_so_not_as_a_python_error():
    raw = {
        "policy": {"tools": []},
        "servers": {"a": {"command": "x", "tools": 5, "resources": {"rename": {"r": 4}}}},
        "profiles": {"q": {"servers": {"a": {"prompts": "x"}}}},
    }
    with pytest.raises(ConfigError) as info:
        structure_config(raw, environ={})
    assert info.value.problems == [
        "policy.tools: expected a table, got a list",
        "profiles.q.servers.a.prompts: expected a table, got the string 'x'",
        "servers.a.tools: expected a table, got a number (5)",
        "servers.a.resources.rename.r: expected a table, got a number (4)",
    ]


def test_plugin_option_types_are_checked_from_the_annotations(tmp_path):
    (tmp_path / "typed.py").write_text(
        "from typing import Callable\n"
        "class P:\n"
        "    def __init__(self, name: str, count: int = 1, rate: float = 1.0, on: bool = False,\n"
        "                 words: list[str] | None = None, table: dict[str, int] | None = None,\n"
        "                 hook: Callable[[], None] | None = None, free=None) -> None:\n"
        "        pass\n"
    )
    path = tmp_path / "a.toml"
    path.write_text(
        '[[plugins]]\nuse = "typed.py:P"\n'
        'options = { name = 3, count = true, rate = 2, on = "yes", words = ["a", 2], table = [], hook = 1, free = 1 }\n'
        '[[plugins]]\nuse = "audit-log"\noptions = { path = 3 }\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, plugin_check=plugin_problems)
    assert info.value.problems == [
        "plugins[0].options.name: expected a string, got a number (3)",
        "plugins[0].options.count: expected an integer, got a boolean",
        "plugins[0].options.on: expected true or false, got the string 'yes'",
        "plugins[0].options.words[1]: expected a string, got a number (2)",
        "plugins[0].options.table: expected a table or nothing, got a list",
        "plugins[1].options.path: expected a string, got a number (3)",
    ]


def test_every_problem_of_the_discovery_tables_at_once(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text(
        '[proxy.discovery]\nmode = "bogus"\nbudget_tokens = -1\n'
        '[profiles.agent.discovery]\nmode = "everything"\nkeep_results_for = 0\nmax_result_tokens = 100\nextra = 1\n'
        "[profiles.d.discovery]\nbudget_tokens = 1e400\nkeep_results_for = nan\nmax_result_tokens = -5\n"
        '[servers.t]\ncommand = "srv"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    found = "\n".join(info.value.problems)
    for expected in (
        "proxy.discovery.mode: expected one of all, search, auto, got 'bogus'",
        "proxy.discovery.budget_tokens: must be an integer (tokens) from 100 to 100000000, got -1",
        "profiles.agent.discovery.extra: unknown key",
        "profiles.agent.discovery.mode: expected one of all, search, auto, got 'everything'",
        "profiles.agent.discovery.keep_results_for: must be a finite number of seconds from 1 to 86400",
        "profiles.agent.discovery.max_result_tokens: must be 0 (never cut) or at least 500",
        "profiles.d.discovery.budget_tokens: expected an integer",
        "profiles.d.discovery.keep_results_for: must be a finite number",
        "profiles.d.discovery.max_result_tokens: must be 0 (never cut) or at least 500",
    ):
        assert expected in found, (expected, found)

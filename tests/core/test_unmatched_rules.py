"""Rules that match nothing a server listed are warned about, never refused: only the
servers' lists can tell, and a server may add the item later."""

import tomllib

from aggregator.config import structure_config
from aggregator.core.catalogs.policy import unmatched_rules

CONFIG = structure_config(
    tomllib.loads("""
[policy.tools]
deny = ["delete_*", "get_curent_time"]
[policy.resources]
deny = ["FILE:///etc/*", "secret://*"]
[servers.time]
command = "t"
[servers.time.tools]
allow = ["*time*", "nothing_here"]
rename = { get_current_time = { name = "now" }, nosuch = { name = "x" } }
[servers.time.templates]
allow = ["file:///logs/{name}", "file:///other/{x}"]
[servers.files]
command = "f"
[profiles.p.tools]
deny = ["zzz*", "delete_file"]
[profiles.p.servers.files.prompts]
deny = ["summarise"]
"""),
    environ={},
)

ITEMS = {
    ("time", "tools"): [{"name": "get_current_time"}, {"name": "convert_time"}],
    ("time", "resourceTemplates"): [{"uriTemplate": "file:///logs/{name}"}],
    ("files", "tools"): [{"name": "delete_file"}, {"name": "read_file"}],
    ("files", "resources"): [{"uri": "file:///etc/hosts"}, {"uri": "not a uri"}],
    ("files", "prompts"): [{"name": "summarize"}],
}


def items_of(server, kind):
    return ITEMS.get((server, kind), [])


def test_each_rule_that_matches_nothing_is_named_by_its_key_path():
    assert unmatched_rules(CONFIG, items_of, ["time", "files"]) == [
        "policy.tools.deny: 'get_curent_time' matches no tool of any server",
        "policy.resources.deny: 'secret://*' matches no resource of any server",
        "profiles.p.tools.deny: 'zzz*' matches no tool of any server",
        "servers.time.tools.allow: 'nothing_here' matches no tool of server time",
        "servers.time.tools.rename.nosuch: the server lists no tool 'nosuch'",
        "servers.time.templates.allow: 'file:///other/{x}' matches no resource template of server time",
        "profiles.p.servers.files.prompts.deny: 'summarise' matches no prompt of server files",
    ]


def test_rules_for_every_server_wait_for_every_server():
    """With files not listed yet, only time's own rules can be judged."""
    assert unmatched_rules(CONFIG, items_of, ["time"]) == [
        "servers.time.tools.allow: 'nothing_here' matches no tool of server time",
        "servers.time.tools.rename.nosuch: the server lists no tool 'nosuch'",
        "servers.time.templates.allow: 'file:///other/{x}' matches no resource template of server time",
    ]
    assert unmatched_rules(CONFIG, items_of, []) == []

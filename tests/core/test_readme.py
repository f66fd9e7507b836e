"""The README's and the documentation pages' promises that a test can hold them to."""

import re
import tomllib
from pathlib import Path

from aggregator.config import structure_config

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
PAGES = sorted((ROOT / "docs").glob("*.md"))
# Everything a reader is shown: the README, then every page of the documentation site.
DOCUMENTS = README + "".join(page.read_text() for page in PAGES)


def sh_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", README, re.S)


def test_opens_with_the_two_commands_and_ci_runs_the_second():
    serve, test = sh_blocks()[:2]
    assert "aggregator serve" in serve and "aggregator.toml" in serve
    assert "pytest" in test and "mkdocs build --strict" in test
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, "`.ci/run` must run the README's test command exactly"


def test_the_sites_front_page_is_the_readme():
    """docs/index.md is the README with its links made relative to docs/ (no drift)."""
    expected = README.replace("](docs/", "](")
    expected = re.sub(r"\[([^\]]+)\]\(LICENSE\)", r"\1 (the `LICENSE` file)", expected)
    assert (ROOT / "docs" / "index.md").read_text() == expected


def test_the_sites_architecture_page_is_the_codemap():
    """docs/architecture.md is ARCHITECTURE.md with its links made relative to docs/."""
    expected = (ROOT / "ARCHITECTURE.md").read_text().replace("](docs/", "](")
    assert (ROOT / "docs" / "architecture.md").read_text() == expected


def test_every_path_the_codemap_names_exists():
    """A module or package ARCHITECTURE.md names by its path in backticks
    (``core/router.py``, ``fronts/http/``; a bare file name belongs to its section) is
    there: under ``aggregator/``, or from the root for tests and docs."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    names = set(re.findall(r"`([a-z_]+/(?:[a-z_]+/)*(?:[a-z_]+\.py)?)`", text))
    assert len(names) > 30
    missing = [
        name for name in sorted(names) if not (ROOT / "aggregator" / name).exists() and not (ROOT / name).exists()
    ]
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_page_is_in_the_sites_navigation_and_linked_from_the_readme():
    config = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert f": {page.name}\n" in config, page.name
        assert page.name == "index.md" or f"](docs/{page.name})" in README, page.name


def test_configuration_examples_load():
    blocks = re.findall(r"```toml\n(.*?)\n```", DOCUMENTS, re.S)
    assert len(blocks) >= 3
    environ = {
        "HOME": "/home/u",
        "AGGREGATOR_TOKEN": "t" * 32,
        "REMOTE_TOKEN": "r",
        "READER_TOKEN": "q" * 32,
        "AGGREGATOR_ADMIN_TOKEN": "a" * 32,
        "DOCS_TOKEN": "d",
        "AGGREGATOR_VAULT_KEY": "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleS0=",
        "EXCHANGE_SECRET": "e",
        "AUTH_CLIENT_SECRET": "c",
        "AGGREGATOR_CLUSTER_KEY": "k" * 43,
    }
    configs = [structure_config(tomllib.loads(block), environ=environ) for block in blocks]
    front = configs[0]  # the README's own example
    assert front.servers["git"].tools.deny == ("git_reset", "git_commit")
    full = next(c for c in configs if "git" in c.servers and c.http.auth_tokens)
    assert full.servers["git"].args == ("--repository", "/home/u/src/project")
    assert full.http.auth_tokens == ("t" * 32,)
    network = next(c for c in configs if "remote" in c.servers)
    assert [network.servers[n].effective_transport for n in ("remote", "old", "ws", "notebook")] == [
        "streamable-http",
        "sse",
        "websocket",
        "stdio",
    ]
    assert network.servers["notebook"].isolation == "per-session"
    secured = [c for c in configs if c.auth.enabled]
    signing_in = secured[0]  # the README's "Signing in"; the others are docs/authorization.md's
    oauth = next(c for c in secured if len(c.auth.issuers) == 2)
    keycloak = next(c for c in secured if "staff" in c.profiles and c.auth.resource.startswith("https:"))
    local = next(c for c in secured if c.auth.resource.startswith("http:"))
    assert signing_in.auth.issuers[0].issuer == "https://login.example.com/realms/staff"
    assert signing_in.profiles["admins"].match == {"groups": ("mcp-admins",)}
    assert oauth.auth.resource == "https://mcp.example.com/mcp" and len(oauth.auth.issuers) == 2
    assert oauth.profiles["admins"].match == {"groups": ("mcp-admins",)}
    assert oauth.auth.issuers[1].client_secret == "c"
    assert keycloak.auth.resource == "https://mcp.example.com/mcp" and keycloak.auth.required_scopes == ("mcp",)
    assert list(keycloak.profiles) == ["admins", "staff"] and keycloak.profiles["staff"].tools.read_only
    assert local.auth.resource == "http://127.0.0.1:8000/mcp"  # tests/e2e/test_authorization_walkthrough.py runs it
    assert local.auth.issuers[0].issuer == "http://127.0.0.1:9000" and local.profiles["staff"].tools.read_only
    clusters = [c.cluster for c in configs if c.cluster.enabled]
    assert clusters and all(cluster.keys == ("k" * 43,) for cluster in clusters)
    assert any(cluster.replica == "eu-1" for cluster in clusters)
    policy = next(c for c in configs if "reader" in c.profiles)
    assert policy.profiles["reader"].tools.read_only and policy.servers["everything"].server_requests == ("roots",)


def test_error_example_is_what_the_proxy_says():
    from aggregator.errors import ConfigError

    try:
        structure_config(
            {"servers": {"git": {"command": "g", "args": ["--repository", ".", 3]}, "tiem": {"comand": "x"}}},
            environ={},
        )
    except ConfigError as exc:
        for problem in exc.problems:
            assert f"  {problem}" in DOCUMENTS
    else:
        raise AssertionError("expected a ConfigError")

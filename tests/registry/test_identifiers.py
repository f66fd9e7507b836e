"""What a registry may name, per runner: every accepted form and the refused ones, each
refusal naming the field and the reason."""

from __future__ import annotations

import pytest

from aggregator.registry.identifiers import (
    RegistryError,
    check_package,
    check_remote_url,
    check_word,
    escaped,
    unsafe_reason,
)

GOOD = [
    ("npm", "@modelcontextprotocol/server-memory", "2026.8.31", "@modelcontextprotocol/server-memory@2026.8.31"),
    ("npm", "some-server", "1.0.0-beta.2+build.7", "some-server@1.0.0-beta.2+build.7"),
    ("pypi", "mcp-server-time", "2026.10.19", "mcp-server-time==2026.10.19"),
    ("pypi", "Mcp_Server.x", "1.0rc1", "Mcp_Server.x==1.0rc1"),
    ("pypi", "pkg", "1.2.post1.dev3+local.7", "pkg==1.2.post1.dev3+local.7"),
    ("oci", "ghcr.io/example/tool:0.9.1", None, "ghcr.io/example/tool:0.9.1"),
    ("oci", "docker.io/library/tool", "1.2", "docker.io/library/tool:1.2"),
    ("oci", "localhost:5000/a/b@sha256:" + "a" * 64, None, "localhost:5000/a/b@sha256:" + "a" * 64),
]


@pytest.mark.parametrize(("kind", "identifier", "version", "spec"), GOOD)
def test_a_package_each_runner_accepts(kind, identifier, version, spec):
    assert check_package(kind, identifier, version, "p") == spec


BAD = [
    ("npm", "evil;rm -rf ~", "1.0.0", "p.identifier: 'evil;rm -rf ~' is not an npm package name"),
    ("npm", "-e", "1.0.0", "p.identifier: '-e' is not an npm package name"),
    ("npm", "Upper", "1.0.0", "is not an npm package name"),
    ("npm", "pkg$(id)", "1.0.0", "is not an npm package name"),
    ("npm", "pkg", "^1.2.3", "p.version: '^1.2.3' is not an exact semantic version"),
    ("npm", "pkg", "latest", "p.version: 'latest' is not an exact semantic version"),
    ("npm", "pkg", "1.x", "is not an exact semantic version"),
    ("npm", "pkg", "1.0.0 || 2", "is not an exact semantic version"),
    ("npm", "pkg", None, "p.version: missing: a package is installed at a pinned version"),
    ("pypi", "pkg`id`", "1.0", "is not a PyPI package name"),
    ("pypi", "pkg\n", "1.0", "is not a PyPI package name"),
    ("pypi", "-pkg", "1.0", "is not a PyPI package name"),
    ("pypi", "pkg", ">=1.0", "p.version: '>=1.0' is not an exact PEP 440 version"),
    ("pypi", "pkg", "1.0; os_name", "is not an exact PEP 440 version"),
    ("oci", "Image:tag", None, "is not an OCI image reference"),
    ("oci", "image:tag;id", None, "is not an OCI image reference"),
    ("oci", "--privileged", None, "is not an OCI image reference"),
    ("oci", "image", "bad tag", "p.version: 'bad tag' is not an image tag"),
    ("oci", "ghcr.io/acme/tool:latest", "1.0.0", "'latest' is not a pinned version"),
    ("oci", "ghcr.io/acme/tool", "latest", "p.version: 'latest' is not an image tag"),
    ("nuget", "Some.Package", "1.0.0", "p.registryType: 'nuget' is not a runner this can write"),
]


@pytest.mark.parametrize(("kind", "identifier", "version", "message"), BAD)
def test_a_package_refused_names_the_field_and_why(kind, identifier, version, message):
    with pytest.raises(RegistryError, match="^") as caught:
        check_package(kind, identifier, version, "p")
    assert message in str(caught.value)


WORDS = [
    ("/data/files", None),
    ("stdio", None),
    ("key=value,other:1@x+y%z", None),
    ("", "it is empty"),
    ("a b", "whitespace or a control character"),
    ("a\tb", "whitespace or a control character"),
    ("a\x1b[31m", "whitespace or a control character"),
    ("a\u2028b", "whitespace or a control character"),
    ("a\u3000b", "whitespace or a control character"),
    ("a\u2003b", "whitespace or a control character"),
    ("abc\u200b", "whitespace or a control character"),
    ("x\u202ey", "whitespace or a control character"),
    ("\ufeffx", "whitespace or a control character"),
    ("x;rm", "shell metacharacters (;)"),
    ("$(id)", "shell metacharacters ($ ( ))"),
    ("`id`", "shell metacharacters (`)"),
    ("a|b&c", "shell metacharacters (& |)"),
    ("*.txt", "shell metacharacters (*)"),
    ("'quoted'", "shell metacharacters (')"),
    ("-rf", "it starts with '-'"),
    ("--exec=/bin/sh", "it starts with '-'"),
    ("x" * 1025, "longer than 1024"),
]


@pytest.mark.parametrize(("word", "reason"), WORDS)
def test_a_command_line_word(word, reason):
    found = unsafe_reason(word)
    if reason is None:
        assert found is None
        assert check_word(word, "w") == word
    else:
        assert found is not None and reason in found
        with pytest.raises(RegistryError, match="^w: .* is refused: "):
            check_word(word, "w")


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://mcp.example.com/mcp", True),
        ("http://127.0.0.1:8080/mcp", True),
        ("http://mcp.example.com/mcp", False),
        ("http://localhost/mcp", False),
        ("http://10.0.0.1/mcp", False),
        ("ftp://mcp.example.com/", False),
        ("https://user:pw@mcp.example.com/", False),
        ("https://mcp.example.com/a b", False),
        ("https://mcp.example.com/a\u200bb", False),
        ("https:///nohost", False),
    ],
)
def test_remote_urls_are_https_or_local_http(url, ok):
    if ok:
        assert check_remote_url(url, "r") == url
    else:
        with pytest.raises(RegistryError, match=r"^r\.url: "):
            check_remote_url(url, "r")


def test_escaped_shows_what_cannot_be_seen():
    assert escaped("a b\tc\u2028d\u200be\u202ef\u3000g") == "a b\\x09c\\u2028d\\u200be\\u202ef\\u3000g"

"""Asking a registry: the API v0.1 over HTTP (search, paging, updated_since, one version
or the latest) and a directory of server.json files; and every way an answer can be
hostile (too large, too slow, not JSON, too deep, the wrong shape, a redirect, a cursor that
never ends), each ending in one sentence that says what was wrong."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aggregator.registry.identifiers import RegistryError
from aggregator.registry.sources import DirectoryRegistry, HttpRegistry, Limits, open_registry

HERE = Path(__file__).parent
MEMORY = "io.github.modelcontextprotocol/server-memory"
SEVEN = {
    f"io.github.modelcontextprotocol/server-{name}"
    for name in ("everything", "filesystem", "memory", "sequential-thinking", "time", "git", "fetch")
}


def test_search_matches_names_and_lists_the_latest(registry):
    found = open_registry(registry.url).search("server-", 100)
    assert {entry.name for entry in found.entries} == SEVEN
    memory = next(entry for entry in found.entries if entry.name == MEMORY)
    assert (memory.version, memory.status, memory.is_latest) == ("2026.8.31", "active", True)
    assert found.skipped == ()


def test_search_follows_the_cursor_page_by_page(registry):
    asked = len(registry.requests)
    source = open_registry(registry.url)
    import aggregator.registry.sources as sources

    page_size, sources.PAGE_SIZE = sources.PAGE_SIZE, 3
    try:
        found = source.search("", 100)
    finally:
        sources.PAGE_SIZE = page_size
    assert len(found.entries) == 9  # the seven, a remote and an OCI image: each once, the latest
    requests = registry.requests[asked:]
    assert len(requests) == 3 and "cursor=" not in requests[0] and all("cursor=" in r for r in requests[1:])
    assert all("limit=3" in r and "version=latest" in r for r in requests)


def test_search_stops_at_its_limit(registry):
    asked = len(registry.requests)
    found = open_registry(registry.url).search("", 2)
    assert len(found.entries) == 2 and len(registry.requests) == asked + 1


def test_updated_since_asks_for_what_changed(registry):
    found = open_registry(registry.url).search("", 100, updated_since="2026-10-01T00:00:00Z")
    assert {entry.name.rsplit("-", 1)[-1] for entry in found.entries} == {"time", "git", "fetch"}


def test_get_the_latest_or_one_version(registry):
    source = open_registry(registry.url)
    assert source.get(MEMORY, None).version == "2026.8.31"
    older = source.get(MEMORY, "2025.9.25")
    assert (older.version, older.is_latest) == ("2025.9.25", False)


def test_get_what_is_not_there(registry):
    source = open_registry(registry.url)
    with pytest.raises(RegistryError, match=f"^no server io.example/none in registry {registry.url}$"):
        source.get("io.example/none", None)
    with pytest.raises(RegistryError, match=f"^no server {MEMORY} 9.9.9 in registry "):
        source.get(MEMORY, "9.9.9")


HOSTILE_SEARCHES = [
    ("huge", "its answer for a page of servers is larger than 4194304 bytes; refused"),
    ("huge-declared", "its answer for a page of servers is larger than 4194304 bytes; refused"),
    ("malformed", "its answer for a page of servers is not usable JSON: "),
    ("deep", "its answer for a page of servers is not usable JSON: nested deeper than 32 levels"),
    ("redirect", "asked for a page of servers, it answered HTTP 302"),
    ("nowhere", "asked for a page of servers, it answered HTTP 404"),
]


@pytest.mark.parametrize(("mode", "message"), HOSTILE_SEARCHES)
def test_a_hostile_answer_is_one_sentence(registry, mode, message):
    with pytest.raises(RegistryError) as caught:
        open_registry(f"{registry.url}/{mode}").search("x", 10)
    assert str(caught.value).startswith(f"registry {registry.url}/{mode}: ")
    assert message in str(caught.value)


def test_a_slow_answer_meets_the_deadline(registry):
    source = HttpRegistry(f"{registry.url}/slow", Limits(deadline=1.0))
    started = time.monotonic()
    with pytest.raises(RegistryError, match="no whole answer for a page of servers within 1 s; gave up"):
        source.search("x", 10)
    assert time.monotonic() - started < 3.0


def test_the_deadline_covers_headers_sent_a_byte_at_a_time(registry):
    source = HttpRegistry(f"{registry.url}/slow-headers", Limits(deadline=1.0))
    started = time.monotonic()
    with pytest.raises(RegistryError, match="no whole answer for a page of servers within 1 s; gave up"):
        source.search("x", 10)
    assert time.monotonic() - started < 3.0


def test_an_answer_is_asked_for_uncompressed(registry):
    found = open_registry(f"{registry.url}/gzip").search("x", 10)
    assert len(found.entries) == 1


def test_a_compressed_answer_sent_anyway_is_refused(registry):
    with pytest.raises(RegistryError, match="its answer for a page of servers is 'gzip'-encoded"):
        open_registry(f"{registry.url}/gzip-always").search("x", 10)


def test_entries_of_the_wrong_shape_are_skipped_and_named(registry):
    found = open_registry(f"{registry.url}/wrong-schema").search("x", 10)
    assert [entry.name for entry in found.entries] == ["io.github.modelcontextprotocol/server-everything"]
    assert found.skipped == (
        "servers[0].server.name: expected a string, got a number",
        "servers[1].server (io.example/long).description: 101 characters, expected 1 to 100",
        "servers[2].server (io.example/args).packages: expected an array, got an object",
        "servers[3]: expected an object, got a string",
    )
    with pytest.raises(RegistryError, match=r"description: expected a string, got a number"):
        open_registry(f"{registry.url}/wrong-schema").get(MEMORY, None)


def test_a_cursor_that_never_ends_ends(registry):
    asked = len(registry.requests)
    found = open_registry(f"{registry.url}/loop-cursor").search("", 100)
    assert len(found.entries) == 1
    assert len(registry.requests) - asked == 2  # the second page repeats its cursor: no third


def test_a_deleted_entry_is_served_with_its_status(registry):
    source = open_registry(f"{registry.url}/hostile")
    assert source.get("io.example/deleted", None).status == "deleted"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("http://registry.example.com", "a registry is asked over https (plain http only on a loopback address)"),
        ("ftp://registry.example.com", "a registry is asked over https"),
        ("https://user:pw@registry.example.com", "give its base URL alone"),
        ("https://registry.example.com/?x=1", "give its base URL alone"),
    ],
)
def test_registry_urls_are_https_except_on_this_machine(spec, message):
    with pytest.raises(RegistryError) as caught:
        open_registry(spec)
    assert str(caught.value).startswith(f"registry {spec!r}: ") and message in str(caught.value)


def test_loopback_http_and_directories_are_accepted(tmp_path):
    assert isinstance(open_registry("http://127.0.0.1:1"), HttpRegistry)
    assert isinstance(open_registry("http://localhost:1/"), HttpRegistry)
    assert isinstance(open_registry("http://[::1]:1/"), HttpRegistry)
    assert isinstance(open_registry(f"file://{tmp_path}"), DirectoryRegistry)
    assert open_registry("dir", relative_to=tmp_path).label == str(tmp_path / "dir")


def test_a_directory_registry_works_offline():
    source = open_registry(str(HERE / "servers"))
    found = source.search("memory", 10)
    assert [(e.name, e.version) for e in found.entries] == [(MEMORY, "2026.8.31")]
    assert source.get(MEMORY, None).version == "2026.8.31"
    assert source.get(MEMORY, "2025.9.25").version == "2025.9.25"
    with pytest.raises(RegistryError, match=r"no server .* 1.0.0 in registry .* \(it has 2025.9.25, 2026.8.31\)"):
        source.get(MEMORY, "1.0.0")
    with pytest.raises(RegistryError, match="a directory has no update times"):
        source.search("", 10, updated_since="2026-01-01T00:00:00Z")


def test_a_directory_skips_what_it_cannot_read(tmp_path):
    (tmp_path / "good.json").write_text((HERE / "servers" / "time.json").read_text())
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "deep.json").write_text("[" * 100 + "]" * 100)
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "big.json").write_text(" " * 5000 + "{}")
    found = DirectoryRegistry(tmp_path, Limits(max_bytes=4096)).search("", 10)
    assert [e.name for e in found.entries] == ["io.github.modelcontextprotocol/server-time"]
    bad, big, deep, zero = found.skipped  # in the order of their names
    assert bad.startswith(f"{tmp_path / 'bad.json'}: ")
    assert big == f"{tmp_path / 'big.json'}: larger than 4096 bytes"
    assert deep == f"{tmp_path / 'deep.json'}: nested deeper than 32 levels"
    assert zero == f"{tmp_path / 'zero.json'}: not a regular file"
    with pytest.raises(RegistryError, match="not a directory"):
        open_registry(str(tmp_path / "missing")).search("", 10)


def test_a_file_url_with_a_host_or_a_relative_path_is_refused():
    for spec in ("file://tests/x", "file://example.com/srv/registry"):
        with pytest.raises(RegistryError, match="a file URL names an absolute path"):
            open_registry(spec)
    assert open_registry("file://localhost/srv/x").label == "/srv/x"


def test_a_directory_refuses_links_outside_it_and_names_duplicates(tmp_path):
    inside, outside = tmp_path / "registry", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (outside / "time.json").write_text((HERE / "servers" / "time.json").read_text())
    (inside / "link.json").symlink_to(outside / "time.json")
    (inside / "a.json").write_text((HERE / "servers" / "memory.json").read_text())
    (inside / "b.json").write_text((HERE / "servers" / "memory.json").read_text())
    found = DirectoryRegistry(inside, Limits()).search("", 10)
    assert [e.name for e in found.entries] == [MEMORY]
    again, link = found.skipped
    assert again == f"{inside / 'b.json'}: {MEMORY} 2026.8.31 again (the one in {inside / 'a.json'} is read)"
    assert link == f"{inside / 'link.json'}: a link to a file outside the registry's directory; refused"


def test_a_search_cut_at_the_page_bound_says_so(registry):
    import aggregator.registry.sources as sources

    pages, sources.MAX_PAGES = sources.MAX_PAGES, 2
    size, sources.PAGE_SIZE = sources.PAGE_SIZE, 1
    try:
        found = open_registry(registry.url).search("", 100)
    finally:
        sources.MAX_PAGES, sources.PAGE_SIZE = pages, size
    assert len(found.entries) == 2
    assert found.cut == f"stopped after 2 pages of registry {registry.url}; the list may be incomplete"
    assert open_registry(registry.url).search("", 100).cut is None

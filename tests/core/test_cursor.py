import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.cursor import CursorCodec
from aggregator.core.settings import SigningKeys
from aggregator.jsonrpc import INVALID_PARAMS, RemoteProtocolError, loads


def test_round_trip():
    codec = CursorCodec()
    assert codec.decode(codec.encode("tools", 3, 40), "tools", 3) == 40


@pytest.mark.parametrize("bad", ["", "x", "!!!", 5, None, {"a": 1}, "A" * 500])
def test_forged(bad):
    with pytest.raises(RemoteProtocolError) as info:
        CursorCodec().decode(bad, "tools", 0)
    assert info.value.code == INVALID_PARAMS


def test_other_key_kind_or_generation_refused():
    codec = CursorCodec()
    cursor = codec.encode("tools", 1, 5)
    for args in [("prompts", 1), ("tools", 2)]:
        with pytest.raises(RemoteProtocolError):
            codec.decode(cursor, *args)
    with pytest.raises(RemoteProtocolError):
        CursorCodec().decode(cursor, "tools", 1)  # another proxy process
    # A tampered offset is caught by the tag.
    import base64

    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    forged = base64.urlsafe_b64encode(raw[:-1] + b"0").decode().rstrip("=")
    with pytest.raises(RemoteProtocolError):
        codec.decode(forged, "tools", 1)


def test_the_first_key_signs_and_every_key_verifies():
    old, new = (b"old1", b"o" * 32), (b"new1", b"n" * 32)
    cursor = CursorCodec(SigningKeys((old,))).encode("tools", "g", 10)
    assert CursorCodec(SigningKeys((new, old))).decode(cursor, "tools", "g") == 10
    assert CursorCodec(SigningKeys((old,))).decode(cursor, "tools", "g") == 10
    with pytest.raises(RemoteProtocolError) as info:
        CursorCodec(SigningKeys((new,))).decode(cursor, "tools", "g")  # the old key removed
    assert "not made by this proxy" in info.value.message


def test_a_cursor_is_read_by_another_catalog_listing_the_same_items():
    """Two replicas with the same keys: a cursor one made pages through the other's list,
    whatever each one's count of rebuilds; once the lists differ, it is refused."""
    keys = SigningKeys(((b"kid1", b"k" * 32),))
    servers = [ServerConfig(name="a", command="x")]
    one, other = (Catalog(servers, "__", 2, cursors=CursorCodec(keys)) for _ in range(2))
    one.set_items("a", "tools", [{"name": "x"}])  # a rebuild the other never had
    for catalog in (one, other):
        catalog.set_items("a", "tools", [{"name": f"t{i}"} for i in range(5)])
    assert one.generation != other.generation
    cursor = loads(one.page("tools", None))["nextCursor"]
    assert [t["name"] for t in loads(other.page("tools", cursor))["tools"]] == ["a__t2", "a__t3"]
    other.set_items("a", "tools", [{"name": "t0"}, {"name": "t1"}, {"name": "t9"}])
    with pytest.raises(RemoteProtocolError) as info:
        other.page("tools", cursor)
    assert "list changed" in info.value.message


def test_pages_cover_everything_once_in_order():
    catalog = Catalog([ServerConfig(name="a", command="x"), ServerConfig(name="b", command="x")], "__", 4)
    catalog.set_items("b", "tools", [{"name": f"b{i}"} for i in range(5)])
    catalog.set_items("a", "tools", [{"name": f"a{i}"} for i in range(6)])
    names, cursor = [], None
    for _ in range(10):
        page = loads(catalog.page("tools", cursor))
        names += [t["name"] for t in page["tools"]]
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert names == [f"a__a{i}" for i in range(6)] + [f"b__b{i}" for i in range(5)]
    first = loads(catalog.page("tools", None))
    catalog.set_items("a", "tools", [{"name": "new"}])
    with pytest.raises(RemoteProtocolError):
        catalog.page("tools", first["nextCursor"])  # stale after a change

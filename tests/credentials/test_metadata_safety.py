"""What a stranger's metadata cannot make the proxy do: fetch or show a URL that is not
http(s), plain http off loopback, or a private, link-local or metadata address (checked
before any connection: the HTTP client here fails the test if it is called); read an answer
without end, or wait for one for ever; use a document that names another resource or
issuer; follow a redirect."""

from __future__ import annotations

import json
import re
import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
import trio

from aggregator.credentials import CredentialError, UnsafeUrl
from aggregator.credentials.discovery import authorization_server, parse_challenge, protected_resource
from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.urls import url_refusal
from tests.loopback import serve_in_thread, stop_serving

REFUSED = [
    ("javascript:alert(1)", "scheme"),
    ("data:text/html,<script>x</script>", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("--upload-pack=x", "scheme"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("https://169.254.169.254/", "link-local"),
    ("http://[fe80::1]/", "link-local"),
    ("https://10.0.0.1/token", "private"),
    ("https://192.168.1.1/", "private"),
    ("https://[fd00:ec2::254]/", "metadata"),
    ("https://metadata.google.internal/", "metadata"),
    ("http://auth.example.com/authorize", "https is required"),
    ("https://user:pass@auth.example.com/", "user name"),
    ("https://auth.example.com/a b", "whitespace"),
    ("https:///nohost", "no host"),
    ("https://0.0.0.0/", "not a host"),
]
ALLOWED = [
    "https://auth.example.com/authorize?x=1",
    "http://127.0.0.1:9/token",
    "http://localhost:8000/cb",
    "https://[2606:4700:4700::1111]/",
    "https://93.184.215.14/",
]


@pytest.mark.parametrize("url,why", REFUSED)
def test_urls_refused(url, why):
    refusal = url_refusal(url)
    assert refusal is not None and why in refusal, refusal
    assert "passwd" not in refusal and "pass@" not in refusal  # never quoted


@pytest.mark.parametrize("url", ALLOWED)
def test_urls_allowed(url):
    assert url_refusal(url) is None


def test_a_challenge_is_parsed_with_quotes_and_other_schemes():
    header = (
        'Basic realm="x", Bearer error="invalid_token",'
        ' resource_metadata="https://m.example/.well-known/oauth-protected-resource/mcp", scope="a b"'
    )
    assert parse_challenge(header) == {
        "error": "invalid_token",
        "resource_metadata": "https://m.example/.well-known/oauth-protected-resource/mcp",
        "scope": "a b",
    }
    assert parse_challenge('Bearer scope="x", Basic realm="y"') == {"scope": "x"}
    assert parse_challenge("Basic realm=x") == {} and parse_challenge(None) == {}


class Peer:
    """Answers from a table (URL -> JSON document); any other URL fails the test, as a
    connection for a refused URL would."""

    def __init__(self, documents: dict[str, dict]) -> None:
        self.documents = documents
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url not in self.documents:
            raise AssertionError(f"the proxy connected for {url}")
        self.asked.append(url)
        return httpx.Response(200, json=self.documents[url])


def _fetcher(peer: Peer, **options) -> tuple[Fetcher, httpx.AsyncClient]:
    client = httpx.AsyncClient(transport=httpx.MockTransport(peer))
    return Fetcher(
        client, timeout=options.get("timeout", 5), max_bytes=options.get("max_bytes", 65536), resolve=False
    ), client


MCP = "https://mcp.example/mcp"
PRM = "https://mcp.example/.well-known/oauth-protected-resource/mcp"
ISSUER = "https://as.example"
ASM = "https://as.example/.well-known/oauth-authorization-server"


def _as_metadata(**changes):
    document = {
        "issuer": ISSUER,
        "authorization_endpoint": f"{ISSUER}/authorize",
        "token_endpoint": f"{ISSUER}/token",
        "code_challenge_methods_supported": ["S256"],
    }
    document.update(changes)
    return document


@pytest.mark.parametrize("bad", ["javascript:alert(1)", "file:///etc/passwd", "http://10.0.0.1/prm"])
async def test_a_challenges_metadata_url_is_refused_before_connecting(bad):
    peer = Peer({})
    fetcher, client = _fetcher(peer)
    async with client:
        with pytest.raises(UnsafeUrl):
            await protected_resource(fetcher, MCP, parse_challenge(f'Bearer resource_metadata="{bad}"'))
    assert peer.asked == []


@pytest.mark.parametrize("bad", ["http://169.254.169.254/", "javascript:x", "https://10.0.0.1/"])
async def test_an_authorization_server_at_a_bad_address_is_refused(bad):
    peer = Peer({PRM: {"resource": MCP, "authorization_servers": [bad]}})
    fetcher, client = _fetcher(peer)
    async with client:
        with pytest.raises(UnsafeUrl):
            await protected_resource(fetcher, MCP, {})
    assert peer.asked == [PRM]


@pytest.mark.parametrize(
    "key,bad",
    [
        ("authorization_endpoint", "javascript:alert(document.cookie)"),
        ("authorization_endpoint", "--upload-pack=touch /tmp/x"),
        ("token_endpoint", "http://169.254.169.254/latest/meta-data/"),
        ("token_endpoint", "http://10.0.0.1/token"),
        ("registration_endpoint", "file:///etc/passwd"),
        ("revocation_endpoint", "data:,x"),
    ],
)
async def test_bad_urls_in_authorization_server_metadata_are_refused(key, bad):
    peer = Peer({ASM: _as_metadata(**{key: bad})})
    fetcher, client = _fetcher(peer)
    async with client:
        with pytest.raises(UnsafeUrl, match=key):
            await authorization_server(fetcher, ISSUER)
    assert peer.asked == [ASM]


async def test_a_document_for_another_resource_or_issuer_is_not_used():
    peer = Peer(
        {
            PRM: {"resource": "https://other.example/mcp", "authorization_servers": [ISSUER]},
            ASM: _as_metadata(issuer="https://honest.example"),
        }
    )
    fetcher, client = _fetcher(peer)
    async with client:
        with pytest.raises(CredentialError, match="not this server's URL"):
            await protected_resource(fetcher, MCP, {})
        with pytest.raises(CredentialError, match="issuer is not the one asked for"):
            await authorization_server(fetcher, ISSUER)


async def test_a_host_name_that_resolves_to_a_private_address_is_refused():
    class Resolver(trio.abc.HostnameResolver):
        async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
            return [(trio.socket.AF_INET, trio.socket.SOCK_STREAM, 6, "", ("10.1.2.3", 443))]

        async def getnameinfo(self, sockaddr, flags):
            raise NotImplementedError

    peer = Peer({})
    client = httpx.AsyncClient(transport=httpx.MockTransport(peer))
    fetcher = Fetcher(client, timeout=5, max_bytes=65536, resolve=True)
    previous = trio.socket.set_custom_hostname_resolver(Resolver())
    try:
        async with client:
            with pytest.raises(UnsafeUrl, match="resolves to a private address"):
                await fetcher.get_json("https://intranet.example/.well-known/x", "metadata")
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
    assert peer.asked == []


class _Odd(BaseHTTPRequestHandler):
    """A metadata server that misbehaves by path."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the proxy stopped reading, as it should

    def _answer(self):
        if self.path == "/huge":
            body = json.dumps({"resource": "x", "pad": "x" * (2 << 20)}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/huge-unsized":  # no length: the body ends when the connection closes
            self.send_response(200)
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"x" * 65536)
        elif self.path == "/slow":
            time.sleep(1.5)
            self.send_response(200)
            self.end_headers()
        elif self.path == "/drip":
            self.send_response(200)
            self.send_header("content-length", "100")
            self.end_headers()
            for _ in range(20):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("location", "http://169.254.169.254/")
            self.send_header("content-length", "0")
            self.end_headers()


@pytest.fixture
def odd():
    server = serve_in_thread(_Odd)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    stop_serving(server)


@pytest.mark.parametrize(
    "path,said",
    [
        ("/huge", "larger than 65536 bytes"),
        ("/huge-unsized", "larger than 65536 bytes"),
        ("/slow", "no whole answer within 0.5s"),
        ("/drip", "no whole answer within 0.5s"),
        ("/redirect", "redirect (HTTP 302), which is not followed"),
    ],
)
async def test_a_metadata_server_that_misbehaves_is_bounded(odd, path, said):
    async with httpx.AsyncClient() as client:
        fetcher = Fetcher(client, timeout=0.5, max_bytes=65536)
        started = trio.current_time()
        with pytest.raises(CredentialError, match=re.escape(said)):
            await fetcher.get_json(odd + path, "the server's resource metadata")
        assert trio.current_time() - started < 1.5

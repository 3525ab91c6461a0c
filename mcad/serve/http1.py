"""HTTP/1.1 requests and answers as the front door (``mcad.serve.frontdoor``) reads and writes them. No I/O.

Contract:
- ``parse_head(raw, peer, peer_cert)``: the ``Head`` of a request (its line, ``Headers`` looked up
  case-insensitively, who sent it, its Content-Length), or ``BadRequest`` (status and message) when it is not one.
  Stricter than a browser-era parser, because a lenient one is how request smuggling starts: a field line without
  a colon, with whitespace before the colon or continued on the next line, a control character in a value, more
  than ``MAX_HEADER_FIELDS`` fields, a malformed or repeated-and-different Content-Length: 400; a
  Transfer-Encoding (chunked bodies): 501.
- ``Response``: an answer (status, body, content type, extra headers, whether to close the connection after it);
  ``render(response, head_only, close=..., server=...)`` is its bytes on the wire, with ``Connection: close``
  when ``close``.
"""

from __future__ import annotations

import http
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field


class Headers(Mapping[str, str]):
    """Request headers, looked up case-insensitively (the first value of a repeated header)."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._values: dict[str, str] = {}
        self._names: list[str] = []
        for name, value in pairs:
            key = name.lower()
            if key not in self._values:
                self._values[key] = value
                self._names.append(name)
        self.pairs = tuple(pairs)

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def every(self, name: str) -> list[str]:
        return [v for n, v in self.pairs if n.lower() == name.lower()]


@dataclass(frozen=True)
class Head:
    """A request's line and headers, and who sent it."""

    method: str
    target: str
    version: str
    headers: Headers
    peer: str
    peer_cert: bytes | None = None
    content_length: int = 0

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("Connection", "").split(",")}
        if self.version == "HTTP/1.1":
            return "close" not in tokens
        return "keep-alive" in tokens


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)
    close: bool = False


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# RFC 9110 5.1: a field name is a token; 5.5: a value is visible characters, spaces and tabs (and obs-text).
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
# ASCII digits: str.isdigit also takes latin-1 superscripts ("\u00b2"), which int() then refuses.
_DIGITS = re.compile(r"[0-9]{1,19}")
MAX_HEADER_FIELDS = 100


def parse_head(raw: bytes, peer: str, peer_cert: bytes | None = None) -> Head:
    """The head of a request (``raw`` up to and including its blank line); ``BadRequest`` when it is not one.

    Stricter than a browser-era parser, because a lenient one is how request smuggling starts: a field line
    without a colon, with whitespace before the colon (RFC 9112 5.1: must be refused) or continued on the next
    line (obs-fold), a control character in a value, or more than ``MAX_HEADER_FIELDS`` fields is a 400."""
    line, _, rest = raw.lstrip(b"\r\n").partition(b"\r\n")
    try:
        method, target, version = line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError) as err:
        raise BadRequest(400, "malformed request line") from err
    if version not in ("HTTP/1.0", "HTTP/1.1") or not method.isalpha() or not target.startswith("/"):
        raise BadRequest(400, "malformed request line")
    fields: list[tuple[str, str]] = []
    for field_line in rest.split(b"\r\n"):
        if not field_line:
            continue  # the blank line that ends the head
        if len(fields) == MAX_HEADER_FIELDS:
            raise BadRequest(400, f"malformed headers: more than {MAX_HEADER_FIELDS} fields")
        name, colon, value = field_line.partition(b":")
        if not colon or not _FIELD_NAME.fullmatch(name):
            raise BadRequest(400, "malformed headers: a field line is not 'name: value'")
        value = value.strip(b" \t")
        if not _FIELD_VALUE.fullmatch(value):
            raise BadRequest(400, "malformed headers: a control character in a field value")
        fields.append((name.decode("ascii"), value.decode("latin-1")))
    headers = Headers(fields)
    if "Transfer-Encoding" in headers:
        raise BadRequest(501, "chunked request bodies are not supported: send Content-Length")
    lengths = headers.every("Content-Length")
    length = 0
    if lengths:
        if len(set(lengths)) != 1 or not _DIGITS.fullmatch(lengths[0].strip()):
            raise BadRequest(400, "malformed Content-Length")
        length = int(lengths[0])
    return Head(method=method, target=target, version=version, headers=headers, peer=peer, peer_cert=peer_cert,
                content_length=length)


def reason_phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def render(response: Response, head_only: bool, *, close: bool, server: str) -> bytes:
    lines = [f"HTTP/1.1 {response.status} {reason_phrase(response.status)}", f"Server: {server}",
             f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}"]
    lines += [f"{k}: {v}" for k, v in response.headers.items()]
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body

"""HTTP: request() and Client, JSON requests with timeouts; call(): the same
for tools, any failure a KitError; voucher_body()."""

import http.client
import json
import time
import urllib.parse
from collections import namedtuple

from .base import HTTP_TIMEOUT, KitError

Response = namedtuple("Response", "status headers body raw")
Response.__doc__ = """status; headers (names in lower case); body: the parsed JSON
when the answer is JSON, else its text; raw: the bytes."""


def _address(where):
    """(host, port, path prefix) of a port on 127.0.0.1 or a base URL."""
    if isinstance(where, int):
        return "127.0.0.1", where, ""
    u = urllib.parse.urlsplit(where)
    return u.hostname, u.port or 80, u.path.rstrip("/")


def encode_body(body, headers):
    """The bytes of a request body: a dict or list as JSON (and its
    Content-Type in headers), a str as UTF-8, bytes as they are."""
    if body is None:
        return None
    if isinstance(body, (dict, list)):
        headers.setdefault("Content-Type", "application/json")
        return json.dumps(body).encode()
    if isinstance(body, str):
        return body.encode()
    return body


def make_response(status, header_items, raw):
    """A Response from a status, (name, value) header pairs and the body's bytes."""
    headers = {k.lower(): v for k, v in header_items}
    text = raw.decode("utf-8", "replace")
    body = text
    if "json" in headers.get("content-type", "") or text[:1] in ("{", "["):
        try:
            body = json.loads(text)
        except ValueError:
            pass
    return Response(status, headers, body, raw)


def request(where, method, path="", headers=None, body=None, timeout=HTTP_TIMEOUT):
    """One request on a fresh connection to where: a port on 127.0.0.1 or a
    base URL ("http://host:port"); body: a dict or list (sent as JSON), str
    or bytes. Returns a Response. Transport errors (refused, timeout, reset)
    raise OSError or http.client.HTTPException."""
    host, port, prefix = _address(where)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = dict(headers or {})
        data = encode_body(body, headers)
        conn.request(method, prefix + path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return make_response(resp.status, resp.getheaders(), raw)
    finally:
        conn.close()


def call(where, method, path="", body=None, token=None, want=None, timeout=HTTP_TIMEOUT,
         headers=None):
    """request() for the tools: with token, "Authorization: Bearer token";
    a transport error, or a status other than want (when given), is a KitError."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = (f"http://127.0.0.1:{where}" if isinstance(where, int) else where) + path
    try:
        r = request(where, method, path, headers, body, timeout)
    except (OSError, http.client.HTTPException) as e:
        raise KitError(f"{method} {url}: {type(e).__name__}: {e}") from None
    if want is not None and r.status != want:
        raise KitError(f"{method} {url}: HTTP {r.status} {r.body!r} (want {want})")
    return r


def status_of(where, method, path, headers=None, timeout=30):
    """The status of one request (request()), 0 when it got no answer."""
    try:
        return request(where, method, path, headers, None, timeout).status
    except (OSError, http.client.HTTPException):
        return 0


class Client:
    """A keep-alive connection (one per thread). A transport error closes it
    and is raised; the next request connects again."""

    def __init__(self, where, timeout=HTTP_TIMEOUT):
        self.host, self.port, self.prefix = _address(where)
        self.timeout = timeout
        self.conn = None

    def connect(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.connect()
        return self

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, path, headers=None, body=None):
        headers = dict(headers or {})
        data = encode_body(body, headers)
        try:
            self.connect()
            self.conn.request(method, self.prefix + path, body=data, headers=headers)
            resp = self.conn.getresponse()
            raw = resp.read()
        except Exception:
            self.close()
            raise
        if resp.will_close:
            self.close()
        return make_response(resp.status, resp.getheaders(), raw)

    def seckill(self, voucher_id, user_id):
        return self.request("POST", f"/voucher/{voucher_id}/seckill", {"X-User-Id": str(user_id)})


def voucher_body(title, stock, ahead=3600):
    """The body of POST /admin/vouchers for a sale that began a minute ago and
    ends ahead seconds from now."""
    now = int(time.time())

    def iso(t):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    return {"title": title, "stock": stock, "beginTime": iso(now - 60), "endTime": iso(now + ahead)}

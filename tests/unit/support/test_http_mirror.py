"""The test HTTP mirror honours Range, HEAD and 416, and counts the bytes it sends."""

import os
import urllib.error
import urllib.request

import pytest

from tests.support.http_mirror import HttpMirror, parse_range


@pytest.fixture
def served(tmp_path):
    data = os.urandom(70_000)
    (tmp_path / "blob.bin").write_bytes(data)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x y.txt").write_bytes(b"hello")
    with HttpMirror(str(tmp_path)) as mirror:
        yield mirror, data


def _get(url, **headers):
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)


def test_full_get_and_count(served):
    mirror, data = served
    with _get(mirror.url + "/blob.bin") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Length"] == str(len(data))
        assert resp.headers["Accept-Ranges"] == "bytes"
        assert resp.read() == data
    assert mirror.bytes_sent["/blob.bin"] == len(data)


def test_range_requests(served):
    mirror, data = served
    with _get(mirror.url + "/blob.bin", Range="bytes=100-199") as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 100-199/{len(data)}"
        assert resp.read() == data[100:200]
    with _get(mirror.url + "/blob.bin", Range="bytes=-10") as resp:
        assert resp.read() == data[-10:]
    with _get(mirror.url + "/blob.bin", Range="bytes=69990-") as resp:
        assert resp.read() == data[69990:]
    with _get(mirror.url + "/blob.bin", Range="bytes=69990-99999999") as resp:
        assert resp.headers["Content-Range"] == f"bytes 69990-69999/{len(data)}"
        assert resp.read() == data[69990:]
    assert mirror.bytes_sent["/blob.bin"] == 100 + 10 + 10 + 10


def test_unsatisfiable_range_is_416(served):
    mirror, data = served
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(mirror.url + "/blob.bin", Range=f"bytes={len(data)}-")
    assert err.value.code == 416
    assert err.value.headers["Content-Range"] == f"bytes */{len(data)}"


def test_head_sends_no_body(served):
    mirror, data = served
    req = urllib.request.Request(mirror.url + "/blob.bin", method="HEAD")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Length"] == str(len(data))
    assert mirror.bytes_sent["/blob.bin"] == 0


def test_quoted_names_missing_files_and_escapes(served):
    mirror, _unused = served
    with _get(mirror.url_for("sub/x y.txt")) as resp:
        assert resp.read() == b"hello"
    for bad in ("/nope.bin", "/sub", "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(mirror.url + bad)
        assert err.value.code == 404, bad


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-0", (0, 0)),
        ("bytes=5-", (5, 99)),
        ("bytes=-1", (99, 99)),
        ("bytes=-500", (0, 99)),
        ("bytes=9-3", None),
        ("items=0-1", None),
        ("bytes=0-1,5-6", None),
    ],
)
def test_parse_range(header, expected):
    assert parse_range(header, 100) == expected


def test_parse_range_unsatisfiable():
    with pytest.raises(ValueError):
        parse_range("bytes=100-", 100)
    with pytest.raises(ValueError):
        parse_range("bytes=-0", 100)

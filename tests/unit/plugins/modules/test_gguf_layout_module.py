"""llmfleet.cluster.gguf_layout: the thin module over module_utils/gguf_layout.py, run in-process."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.llmfleet.cluster.plugins.modules import gguf_layout

from tests.support.gguf_gen import SHAPES, write_tiny_llama
from tests.support.http_mirror import HttpMirror


def run(capsys: pytest.CaptureFixture, **args: object) -> tuple[int, dict]:
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        gguf_layout.main()
    return int(exc.value.code or 0), json.loads(capsys.readouterr().out)


def test_reads_a_file_and_a_url_in_check_mode(capsys: pytest.CaptureFixture, tmp_path) -> None:
    shape = SHAPES[0]
    path = write_tiny_llama(str(tmp_path / shape.filename), shape)
    code, result = run(capsys, src=path, _ansible_check_mode=True)
    assert code == 0 and result["changed"] is False
    layout = result["layout"]
    assert layout["n_layer"] == shape.n_layer and layout["n_vocab"] == shape.n_vocab
    assert "tensors" not in layout
    with HttpMirror(str(tmp_path)) as mirror:
        code, remote = run(capsys, src=mirror.url_for(shape.filename), tensors=True)
    assert code == 0
    assert remote["layout"]["layer_bytes"] == layout["layer_bytes"]
    assert len(remote["layout"]["tensors"]) == 2 + 9 * shape.n_layer + (0 if shape.tied else 1)


def test_fails_naming_the_source(capsys: pytest.CaptureFixture, tmp_path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    code, result = run(capsys, src=str(bad))
    assert code == 1 and result["failed"] is True
    assert str(bad) in result["msg"] and "not a GGUF file" in result["msg"]

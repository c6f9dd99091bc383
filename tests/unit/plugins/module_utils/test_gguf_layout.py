"""The GGUF layout reader against the gguf package's GGUFReader, over files and HTTP Range."""

import os
import shutil

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import gguf_layout as gl
from gguf import GGUFReader

from tests.support.gguf_gen import SHAPES, expected_tensors, write_sparse_model, write_tiny_llama
from tests.support.http_mirror import HttpMirror

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
GEMMA = os.path.join(
    os.environ.get("CACHE", os.path.join(ROOT, ".cache")), "models", "gemma-3-270m-Q4_K_M.gguf"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("models")
    return {s.name: (s, write_tiny_llama(str(out / s.filename), s)) for s in SHAPES}


@pytest.mark.parametrize("name", [s.name for s in SHAPES])
def test_tensors_match_ggufreader(models, name):
    shape, path = models[name]
    layout = gl.read_layout(path)
    reader = GGUFReader(path)
    ours = {t.name: t for t in layout.tensors}
    assert set(ours) == {t.name for t in reader.tensors} == set(expected_tensors(shape))
    for t in reader.tensors:
        mine = ours[t.name]
        assert mine.nbytes == int(t.n_bytes), t.name
        assert layout.data_offset + mine.offset == int(t.data_offset), t.name
        assert mine.dims == tuple(int(d) for d in t.shape), t.name
        assert mine.ggml_type == int(t.tensor_type), t.name
    assert layout.data_offset == reader.data_offset


@pytest.mark.parametrize("name", [s.name for s in SHAPES])
def test_hyperparameters_and_groups(models, name):
    shape, path = models[name]
    layout = gl.read_layout(path)
    assert layout.architecture == "llama"
    assert layout.n_layer == shape.n_layer
    assert layout.n_embd == shape.n_embd
    assert layout.n_ff == shape.n_ff
    assert layout.n_head == [shape.n_head] * shape.n_layer
    assert layout.n_head_kv == [shape.n_head_kv] * shape.n_layer
    assert layout.head_dim_k == layout.head_dim_v == shape.head_dim
    assert layout.n_vocab == shape.n_vocab
    assert layout.n_ctx_train == shape.n_ctx_train
    assert layout.tied_output is shape.tied
    assert layout.sliding_window == 0 and not any(layout.swa_layers)
    reader = GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    for il in range(shape.n_layer):
        mine = [v for k, v in sizes.items() if k.startswith(f"blk.{il}.")]
        assert layout.layer_bytes[il] == sum(mine)
        assert layout.layer_largest_tensor[il] == max(mine)
    assert layout.token_embd_bytes == sizes["token_embd.weight"]
    assert layout.output_bytes == sizes.get("output.weight", sizes["token_embd.weight"])
    assert layout.output_norm_bytes == sizes["output_norm.weight"]
    assert layout.weights_bytes == sum(sizes.values())
    assert layout.file_bytes == os.path.getsize(path)


def test_url_reads_the_same_layout_with_few_bytes(models, tmp_path):
    _shape, path = models["tiny-llama-bigvocab-4L"]
    shutil.copy(path, tmp_path / "m.gguf")
    with HttpMirror(str(tmp_path)) as mirror:
        remote = gl.read_layout(mirror.url + "/m.gguf")
        sent = mirror.bytes_sent["/m.gguf"]
        ranged = all(r[2] for r in mirror.requests)
    local = gl.read_layout(path)
    assert remote.to_dict(tensors=True) | {"source": None} == local.to_dict(tensors=True) | {"source": None}
    assert ranged
    assert sent < os.path.getsize(path) / 4
    assert sent >= local.data_offset


def test_twenty_gb_model_over_http_reads_under_10_mb(tmp_path):
    path = tmp_path / "big.gguf"
    size = write_sparse_model(str(path))
    assert size > 19 * 1000**3
    with HttpMirror(str(tmp_path)) as mirror:
        layout = gl.read_layout(mirror.url + "/big.gguf")
        sent = mirror.total_bytes_sent()
    assert layout.n_layer == 40
    assert layout.file_bytes == size
    assert layout.weights_bytes > 19 * 1000**3
    assert sent < 10 * 1000**2, sent


@pytest.mark.skipif(not os.path.exists(GEMMA), reason="make test-artifacts writes the Gemma model")
def test_gemma3_270m():
    layout = gl.read_layout(GEMMA)
    assert (layout.architecture, layout.n_layer, layout.n_embd, layout.n_vocab) == ("gemma3", 18, 640, 262144)
    assert layout.tied_output
    assert layout.head_dim_k == 256 and layout.n_head_kv == [1] * 18
    assert layout.sliding_window == 512
    # gemma3: every 6th layer is dense, the others use the sliding window
    assert [il for il, swa in enumerate(layout.swa_layers) if not swa] == [5, 11, 17]
    # llama.cpp's report (facts): the head's CPU_Mapped buffer is the 170 MiB token embedding
    assert round(layout.token_embd_bytes / 2**20, 2) == 170.0
    assert layout.output_bytes == layout.token_embd_bytes
    # every byte after the header is a tensor, up to the 32-byte alignment padding of each
    data = layout.file_bytes - layout.data_offset
    assert data - 32 * len(layout.tensors) <= layout.weights_bytes <= data
    assert len(layout.tensors) == 236


def test_type_table_matches_gguf_package():
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for type_id, (name, block, size) in gl.GGML_TYPES.items():
        qt = GGMLQuantizationType(type_id)
        assert qt.name == name
        assert GGML_QUANT_SIZES[qt] == (block, size), name


def test_errors_name_the_source(tmp_path, models):
    with pytest.raises(gl.GgufError, match="no such file"):
        gl.read_layout(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" + b"\0" * 100)
    with pytest.raises(gl.GgufError, match=r"bad\.gguf: not a GGUF file"):
        gl.read_layout(str(bad))
    _shape, path = models["tiny-llama-8L"]
    with open(path, "rb") as handle:
        data = handle.read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:5000])
    with pytest.raises(gl.GgufError, match="truncated"):
        gl.read_layout(str(cut))
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: len(data) - 1000])
    with pytest.raises(gl.GgufError, match="past the end of the file"):
        gl.read_layout(str(short))
    with HttpMirror(str(tmp_path)) as mirror, pytest.raises(gl.GgufError, match="HTTP 404"):
        gl.read_layout(mirror.url + "/nope.gguf")


def test_any_truncation_or_corruption_is_a_gguf_error(models, tmp_path):
    """Cut or corrupt the header anywhere: the reader raises GgufError (naming the file), never
    an IndexError, struct.error or UnicodeDecodeError."""
    _shape, path = models["tiny-llama-tied-6L"]
    with open(path, "rb") as handle:
        data = handle.read()
    header_end = gl.read_layout(path).data_offset
    target = tmp_path / "broken.gguf"
    for cut in range(0, header_end, max(1, header_end // 97)):
        target.write_bytes(data[:cut])
        with pytest.raises(gl.GgufError, match=r"broken\.gguf"):
            gl.read_layout(str(target))
    for offset in range(8, header_end, max(1, header_end // 53)):
        corrupt = bytearray(data)
        corrupt[offset : offset + 8] = b"\xff" * 8
        target.write_bytes(bytes(corrupt))
        try:
            gl.read_layout(str(target))
        except gl.GgufError as err:
            assert "broken.gguf" in str(err)

"""Every reader: damaged, binary or absurd input gets one clear error naming the file."""

import gzip
import os

import pytest

from graphkern.io import FileFormatError, read_matrix_market, read_sdf, read_smiles, read_tudataset
from graphkern.io._text import source_name

MM = "%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n2 1 1.0\n3 2 2.0\n"
SDF = "water\n  test\n\n  3  2  0  0  0  0  0  0  0  0999 V2000\n" \
      "    0.0000    0.0000    0.0000 O   0  0  0  0  0  0  0  0  0  0  0  0\n" \
      "    1.0000    0.0000    0.0000 H   0  0  0  0  0  0  0  0  0  0  0  0\n" \
      "   -1.0000    0.0000    0.0000 H   0  0  0  0  0  0  0  0  0  0  0  0\n" \
      "  1  2  1  0\n  1  3  1  0\nM  END\n$$$$\n"


READERS = {"mtx": read_matrix_market, "sdf": read_sdf, "smi": read_smiles}


@pytest.mark.parametrize("suffix, good", [("mtx", MM), ("sdf", SDF), ("smi", "CCO ethanol\n")])
@pytest.mark.parametrize("encoding", ["utf-16", "binary"])
def test_undecodable_input_names_the_file(tmp_path, suffix, good, encoding):
    if suffix == "smi":
        pytest.importorskip("rdkit")
    path = tmp_path / f"bad.{suffix}"
    path.write_bytes(good.encode("utf-16") if encoding == "utf-16" else bytes(range(256)) * 4)
    with pytest.raises(FileFormatError, match=f"{path}.*not UTF-8 text"):
        READERS[suffix](path)


@pytest.mark.parametrize("suffix, good", [("mtx", MM), ("sdf", SDF)])
def test_gz_that_is_not_gzip_names_the_file(tmp_path, suffix, good):
    path = tmp_path / f"plain.{suffix}.gz"
    path.write_text(good)
    with pytest.raises(FileFormatError, match=f"{path}.*not gzip-compressed"):
        READERS[suffix](path)
    path.write_bytes(gzip.compress(good.encode())[:-12])  # cut short
    with pytest.raises(FileFormatError, match=f"{path}.*damaged or cut short"):
        READERS[suffix](path)


def test_gzip_round_trip_reads(tmp_path):
    path = tmp_path / "m.mtx.gz"
    path.write_bytes(gzip.compress(MM.encode()))
    assert read_matrix_market(path).n_edges == 2


@pytest.mark.parametrize("size_line, message", [
    ("3000000000 3000000000 1", "at most 2\\*\\*31 - 1"),
    ("3 3 4000000000000", "GiB, more than"),
    ("3 3 -1", "negative count"),
    ("-3 -3 1", "negative count"),
])
def test_matrix_market_size_line_is_checked_before_allocating(tmp_path, size_line, message):
    path = tmp_path / "big.mtx"
    path.write_text(f"%%MatrixMarket matrix coordinate real general\n{size_line}\n1 1 1\n")
    with pytest.raises(FileFormatError, match=f"line 2: .*{message}"):
        read_matrix_market(path)


@pytest.mark.parametrize("line", ["3 1.5 1", "3 1 1 7", "3 x 1"])
def test_lines_the_fast_parser_would_misread_are_named(tmp_path, line):
    path = tmp_path / "m.mtx"
    path.write_text(f"%%MatrixMarket matrix coordinate real general\n3 3 1\n{line}\n")
    with pytest.raises(FileFormatError, match="line 3"):
        read_matrix_market(path)


def test_sdf_negative_count(tmp_path):
    path = tmp_path / "neg.sdf"
    path.write_text(SDF.replace("  3  2  0", " -3  2  0"))
    with pytest.raises(FileFormatError, match="line 4: negative count"):
        read_sdf(path)


def test_tu_indicator_asking_for_millions_of_graphs(tmp_path):
    folder = tmp_path / "DS"
    folder.mkdir()
    (folder / "DS_A.txt").write_text("")
    (folder / "DS_graph_indicator.txt").write_text("20000000\n")
    with pytest.raises(FileFormatError, match="line 1: graph number 20000000, but the file has only 1 nodes"):
        read_tudataset(folder)


def test_pipe_is_named_as_a_descriptor(tmp_path):
    r, w = os.pipe()
    os.write(w, MM.encode())
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert source_name(f) == f"<file descriptor {r}>"
        assert read_matrix_market(f).n_edges == 2


def test_from_smiles_none_is_a_clear_error():
    pytest.importorskip("rdkit")
    from graphkern.io import from_rdkit, from_smiles
    with pytest.raises(TypeError, match="smiles must be a string, got NoneType"):
        from_smiles(None)
    with pytest.raises(TypeError, match="mol must be an RDKit Mol, got NoneType"):
        from_rdkit(None)

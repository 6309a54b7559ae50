"""The TU Dortmund reader on a hand-made folder, a write/read round trip, and each error."""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from graphkern.generators import random_labeled
from graphkern.io import FileFormatError, read_tudataset, write_tudataset

TOY = Path(__file__).parent / "data" / "tu" / "TOY"


def labels_by_edge(graph, column="label"):
    edges, positions = graph.edge_list()
    return {tuple(e): graph.edge_labels[column][k].tolist() for e, k in zip(edges.tolist(), positions)}


def test_reads_the_known_dataset():
    graphs, targets = read_tudataset(TOY)
    assert targets.dtype == np.int64 and targets.tolist() == [1, -1, 1]
    triangle, path, lone = graphs
    assert [g.name for g in graphs] == ["TOY/1", "TOY/2", "TOY/3"]
    assert triangle.node_labels["label"].tolist() == [0, 1, 1]
    assert labels_by_edge(triangle) == {(0, 1): 1, (1, 2): 2, (0, 2): 3}
    np.testing.assert_array_equal(triangle.node_labels["attributes"], [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0]])
    assert path.node_labels["label"].tolist() == [2, 0, 0, 2]
    assert labels_by_edge(path) == {(0, 1): 1, (1, 2): 2, (2, 3): 1}
    assert lone.n_nodes == 1 and lone.n_edges == 0
    assert lone.node_labels["attributes"].tolist() == [[-1.0, 4.0]]
    assert lone.edge_labels["label"].shape == (0,)


def test_optional_files_may_be_absent(tmp_path):
    folder = tmp_path / "TOY"
    folder.mkdir()
    for part in ("A", "graph_indicator"):
        shutil.copy(TOY / f"TOY_{part}.txt", folder)
    graphs, targets = read_tudataset(folder)
    assert targets is None
    assert [g.n_edges for g in graphs] == [3, 3, 0]
    assert graphs[0].node_labels == {} and graphs[0].edge_labels == {}


def write(folder, part, text, name="DS"):
    folder.mkdir(exist_ok=True)
    (folder / f"{name}_{part}.txt").write_text(text)


def test_scattered_nodes_one_direction_and_several_label_columns(tmp_path):
    folder = tmp_path / "DS"
    # nodes of the two graphs interleave; each edge is listed in one direction only
    write(folder, "graph_indicator", "1\n2\n1\n2\n1\n")
    write(folder, "A", "1, 3\n5, 3\n2, 4\n")
    write(folder, "node_labels", "10, 0\n20, 1\n30, 0\n40, 1\n50, 0\n")
    write(folder, "graph_attributes", "0.25\n-1.5\n")
    (first, second), targets = read_tudataset(folder)
    assert targets.dtype == np.float64 and targets.tolist() == [0.25, -1.5]
    # graph 1 holds nodes 1, 3, 5 (local 0, 1, 2): edges 1-3 and 3-5
    assert first.edge_list()[0].tolist() == [[0, 1], [1, 2]]
    assert first.node_labels["label_0"].tolist() == [10, 30, 50]
    assert second.node_labels["label_0"].tolist() == [20, 40]
    assert second.node_labels["label_1"].tolist() == [1, 1]
    assert second.edge_list()[0].tolist() == [[0, 1]]


def test_round_trip(tmp_path):
    graphs = [random_labeled(n, m=m, n_node_labels=3, n_edge_labels=2, continuous=2, seed=k)
              for k, (n, m) in enumerate([(5, 4), (1, 0), (8, 12), (6, 15)])]
    write_tudataset(tmp_path / "RT", "RT", graphs, targets=np.array([0, 1, 1, 0]))
    back, targets = read_tudataset(tmp_path / "RT")
    assert targets.tolist() == [0, 1, 1, 0]
    assert back == graphs  # structure and every label column, attributes bit for bit


def test_writer_refuses_what_the_format_cannot_hold(tmp_path):
    weighted = random_labeled(4, m=3, weighted=True, seed=0)
    with pytest.raises(ValueError, match="weighted; the TU Dortmund format has no edge weights"):
        write_tudataset(tmp_path, "W", [weighted])
    from graphkern.graph import Graph
    odd = Graph.from_edges([(0, 1)], 2, node_labels={"colour": [1, 2]})
    with pytest.raises(ValueError, match="node label 'colour' has no place in the TU Dortmund format"):
        write_tudataset(tmp_path, "W", [odd])


def toy_copy(tmp_path):
    folder = tmp_path / "TOY"
    shutil.copytree(TOY, folder)
    return folder


def edit(folder, part, old, new):
    path = folder / f"TOY_{part}.txt"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return path


ERRORS = {
    "edge-between-graphs": ("A", "6, 7\n", "6, 8\n", 11, "edge (6, 8) joins node 6 of graph 2 and node 8 of graph 3"),
    "node-out-of-range": ("A", "4, 5\n", "4, 9\n", 7, "node 9 does not exist: TOY_graph_indicator.txt has 8 nodes"),
    "non-numeric": ("A", "2, 3\n", "2, x\n", 3, "field 2 ('x') is not an integer"),
    "float-node-number": ("A", "2, 3\n", "2, 3.0\n", 3, "field 2 ('3.0') is not an integer"),
    "too-many-fields": ("A", "2, 3\n", "2, 3, 4\n", 3, "expected 2 fields, found 3"),
    "repeated-edge": ("A", "1, 3\n", "1, 2\n", 5, "edge (1, 2) is listed twice"),
    "graph-number-zero": ("graph_indicator", "2\n2\n2\n2\n3\n", "2\n2\n2\n0\n3\n", 7,
                          "graph number 0 (graphs are numbered from 1)"),
    "node-labels-short": ("node_labels", "0\n2\n1\n", "0\n2\n", 7,
                          "the file ends after 7 rows, but TOY_graph_indicator.txt has 8 nodes"),
    "edge-labels-long": ("edge_labels", "1\n1\n2\n2\n3\n3\n", "1\n1\n2\n2\n3\n3\n1\n", 13,
                         "one row too many: TOY_A.txt has 12 entries"),
    "graph-labels-long": ("graph_labels", "1\n-1\n1\n", "1\n-1\n1\n1\n", 4,
                          "one row too many: TOY_graph_indicator.txt numbers graphs up to 3"),
    "attribute-fields": ("node_attributes", "1.5, 2.0\n", "1.5\n", 2, "expected 2 fields, found 1"),
    "attribute-nan": ("node_attributes", "1.5, 2.0\n", "1.5, nan\n", 2, "value is NaN or infinite"),
}


@pytest.mark.parametrize("part, old, new, line, message", ERRORS.values(), ids=ERRORS.keys())
def test_errors_name_file_line_and_reason(tmp_path, part, old, new, line, message):
    folder = toy_copy(tmp_path)
    path = edit(folder, part, old, new)
    with pytest.raises(FileFormatError) as info:
        read_tudataset(folder)
    assert str(info.value) == f"{path}, line {line}: {message}"


def test_blank_lines_do_not_shift_line_numbers(tmp_path):
    folder = toy_copy(tmp_path)
    edit(folder, "A", "1, 2\n", "1, 2\n\n")
    edit(folder, "A", "6, 7\n", "6, 8\n")
    with pytest.raises(FileFormatError, match=r"line 12: edge \(6, 8\)"):
        read_tudataset(folder)


def test_blank_lines_before_a_malformed_line(tmp_path):
    folder = toy_copy(tmp_path)
    edit(folder, "A", "1, 2\n", "1, 2\n\n")
    path = edit(folder, "A", "2, 3\n", "2, x\n")
    with pytest.raises(FileFormatError, match=rf"^{re.escape(str(path))}, line 4: field 2 \('x'\) is not an integer$"):
        read_tudataset(folder)


def test_missing_required_file(tmp_path):
    folder = toy_copy(tmp_path)
    (folder / "TOY_graph_indicator.txt").unlink()
    with pytest.raises(FileNotFoundError, match="TOY_graph_indicator.txt is missing"):
        read_tudataset(folder)


def test_name_differs_from_folder(tmp_path):
    folder = tmp_path / "somewhere"
    shutil.copytree(TOY, folder)
    graphs, _ = read_tudataset(folder, name="TOY")
    assert len(graphs) == 3

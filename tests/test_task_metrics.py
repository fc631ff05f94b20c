"""Task metrics: the built-ins against hand-worked values and plain reference implementations written
here, the protocol's merge across batches and pickling, and how a metric is named and checked."""

from __future__ import annotations

import pickle
import sys
import textwrap

import numpy as np
import pytest

from pytest_qaccuracy.metrics.binary import BinaryF1
from pytest_qaccuracy.metrics.ctc import CTCGreedy, levenshtein
from pytest_qaccuracy.metrics.detection import YoloDetection, box_iou, decode_yolo, match
from pytest_qaccuracy.metrics.task import TaskContext, TaskSpec, parse_task_specs


def f1_score(truth: np.ndarray, predicted: np.ndarray) -> float:
    """Binary F1 from its definition: 2 tp / (2 tp + fp + fn)."""
    truth, predicted = np.asarray(truth, bool), np.asarray(predicted, bool)
    tp = int(np.sum(truth & predicted))
    fp, fn = int(np.sum(~truth & predicted)), int(np.sum(truth & ~predicted))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def _reference_distance(a: str, b: str) -> int:
    """Wagner-Fischer with a full table, as in a textbook."""
    table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[-1][-1]


def test_levenshtein_matches_the_textbook_table_on_random_strings() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = "".join(rng.choice(list("abcd"), int(rng.integers(0, 9))))
        b = "".join(rng.choice(list("abcd"), int(rng.integers(0, 9))))
        assert levenshtein(a, b) == _reference_distance(a, b), (a, b)
    assert levenshtein("kitten", "sitting") == 3


def _one_hot(paths: list[list[int]], classes: int) -> np.ndarray:
    """Scores (records, steps, classes) whose best class at each step is the path's."""
    return np.eye(classes, dtype=np.float32)[np.asarray(paths)] * 0.9 + 0.01


def test_ctc_greedy_decodes_and_scores_a_hand_worked_batch() -> None:
    # alphabet: blank, c, a, t, u, then the space class PaddleOCR appends
    metric = CTCGreedy(characters=["c", "a", "t", "u"])
    fp32 = {"y": _one_hot([[1, 1, 0, 2, 3, 3], [3, 0, 3, 2, 0, 0]], 6)}  # "cat", "tta"
    quant = {"y": _one_hot([[1, 0, 4, 4, 3, 0], [3, 3, 0, 2, 5, 2]], 6)}  # "cut", "ta a"
    assert metric.decode(fp32) == ["cat", "tta"]
    assert metric.decode(quant) == ["cut", "ta a"]
    metric.update(fp32, quant, ["cat", "tea"])
    values = metric.compute()
    # fp32: cat/cat 0 edits, tta/tea 1 edit -> 1 / 6; quantized: cut/cat 1, "ta a"/tea 2 -> 3 / 6
    assert values["fp32"] == {"cer": pytest.approx(1 / 6), "exact_match": 0.5}
    assert values["quantized"] == {"cer": pytest.approx(3 / 6), "exact_match": 0.0}


def test_ctc_without_targets_scores_the_quantized_text_against_the_fp32_text() -> None:
    metric = CTCGreedy(characters=["c", "a", "t", "u"])
    metric.update({"y": _one_hot([[1, 2, 3, 0]], 6)}, {"y": _one_hot([[1, 4, 3, 0]], 6)}, None)  # "cat" vs "cut"
    assert metric.compute() == {
        "fp32": {"cer": 0.0, "exact_match": 1.0},
        "quantized": {"cer": 1 / 3, "exact_match": 0.0},
    }
    assert metric.state["against"] == "fp32"


def test_ctc_reads_its_characters_from_the_model_metadata_and_checks_the_class_count() -> None:
    metric = CTCGreedy()
    with pytest.raises(ValueError, match="no characters given and the fp32 model has no metadata_props 'character'"):
        metric.begin(TaskContext(("y",), {}, 1))
    metric.begin(TaskContext(("y",), {"character": "c\na\nt\nu"}, 1))
    assert metric.decode({"y": _one_hot([[2, 3]], 6)}) == ["at"]
    with pytest.raises(ValueError, match="output 'y' has 5 classes but the character list gives 6"):
        metric.decode({"y": _one_hot([[2, 3]], 5)})


def _reference_matches(dets: list[tuple], targets: list[tuple], iou: float) -> tuple[int, int, int]:
    """Greedy matching, written plainly: best detection first, best unmatched same-class target."""

    def overlap(a: tuple, b: tuple) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
        return w * h / union if union > 0 else 0.0

    used: set[int] = set()
    tp = 0
    for det in sorted(dets, key=lambda d: -d[4]):
        best, best_iou = None, -1.0
        for j, target in enumerate(targets):
            if j not in used and target[4] == det[5] and overlap(det, target) > best_iou:
                best, best_iou = j, overlap(det, target)
        if best is not None and best_iou >= iou:
            used.add(best)
            tp += 1
    return tp, len(dets) - tp, len(targets) - tp


def test_detection_matching_on_a_hand_worked_record() -> None:
    targets = np.array([[0, 0, 10, 10, 0], [20, 20, 30, 30, 1]], float)
    dets = np.array(
        [
            [0, 0, 10, 12, 0.9, 0],  # IoU 100/120 = 0.83 with target 0: TP
            [1, 1, 10, 10, 0.8, 0],  # target 0 taken: FP
            [20, 20, 30, 30, 0.7, 0],  # right box, wrong class: FP
        ],
        float,
    )
    assert match(dets, targets, 0.5) == (1, 2, 1)
    assert box_iou(dets[:1, :4], targets[:1, :4])[0, 0] == pytest.approx(100 / 120)


def test_detection_matching_agrees_with_a_plain_reference_on_random_records() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        corners = rng.uniform(0, 50, (12, 2))
        sizes = rng.uniform(5, 20, (12, 2))
        boxes = np.column_stack([corners, corners + sizes])
        dets = np.column_stack([boxes[:7] + rng.normal(0, 2, (7, 4)), rng.uniform(0, 1, 7), rng.integers(0, 2, 7)])
        targets = np.column_stack([boxes[5:], rng.integers(0, 2, 7)])
        expected = _reference_matches([tuple(d) for d in dets], [tuple(t) for t in targets], 0.5)
        assert match(dets, targets, 0.5) == expected


def test_yolo_decode_keeps_confident_boxes_and_suppresses_overlaps_per_class() -> None:
    # 4 anchors, 2 classes: two overlapping class-0 boxes (the weaker suppressed), one class-1 box on
    # the same place (kept: another class), one below the confidence threshold
    anchors = np.array(
        [
            [50, 50, 20, 20, 0.9, 0.1],
            [51, 50, 20, 20, 0.8, 0.1],
            [50, 50, 20, 20, 0.1, 0.6],
            [10, 10, 4, 4, 0.2, 0.1],
        ],
        np.float32,
    )
    (found,) = decode_yolo(anchors.T[None], conf=0.25, nms_iou=0.7)
    assert found[:, 4].tolist() == pytest.approx([0.9, 0.6])
    assert found[:, 5].tolist() == [0, 1]
    assert found[0, :4].tolist() == [40, 40, 60, 60]


def test_detection_precision_and_recall_without_targets_take_the_fp32_boxes_as_truth() -> None:
    fp32 = np.array([[50, 50, 20, 20, 0.9], [10, 10, 4, 4, 0.8]], np.float32).T[None]
    quant = np.array([[52, 50, 20, 20, 0.9], [10, 10, 4, 4, 0.1]], np.float32).T[None]  # one box lost
    metric = YoloDetection()
    metric.update({"out": fp32}, {"out": quant}, None)
    values = metric.compute()
    assert values["fp32"] == {"precision": 1.0, "recall": 1.0}
    assert values["quantized"] == {"precision": 1.0, "recall": 0.5}


def test_binary_f1_matches_scikit_learn() -> None:
    rng = np.random.default_rng(2)
    probabilities = rng.uniform(0, 1, (40, 3)).astype(np.float32)
    noisy = np.clip(probabilities + rng.normal(0, 0.2, probabilities.shape), 0, 1).astype(np.float32)
    truth = (rng.uniform(0, 1, (40, 3)) < 0.4).astype(int)
    metric = BinaryF1(threshold=0.3)
    metric.update({"p": probabilities}, {"p": noisy}, list(truth))
    values = metric.compute()
    assert values["fp32"]["f1"] == pytest.approx(f1_score(truth.ravel(), (probabilities >= 0.3).ravel()))
    assert values["quantized"]["f1"] == pytest.approx(f1_score(truth.ravel(), (noisy >= 0.3).ravel()))


def test_f1_and_recall_are_undefined_when_there_is_nothing_to_count() -> None:
    metric = BinaryF1()
    metric.update({"p": np.zeros((3, 1))}, {"p": np.zeros((3, 1))}, [0, 0, 0])
    assert metric.compute() == {"fp32": {"f1": None}, "quantized": {"f1": None}}


@pytest.mark.parametrize(
    ("make", "outputs", "targets"),
    [
        (
            lambda: CTCGreedy(characters=list("abc")),
            lambda rng: rng.uniform(0, 1, (10, 7, 5)).astype(np.float32),
            lambda rng: ["".join(rng.choice(list("abc"), 3)) for _ in range(10)],
        ),
        (
            lambda: BinaryF1(),
            lambda rng: rng.uniform(0, 1, (10, 4)).astype(np.float32),
            lambda rng: list(rng.integers(0, 2, (10, 4))),
        ),
        (
            lambda: YoloDetection(conf=0.5),
            lambda rng: np.concatenate(
                [rng.uniform(10, 60, (10, 4, 30)), rng.uniform(0, 1, (10, 3, 30))], axis=1
            ).astype(np.float32),
            lambda rng: None,
        ),
    ],
    ids=["ctc", "binary_f1", "yolo_detection"],
)
def test_state_merged_across_batches_and_a_pickle_equals_one_pass(make, outputs, targets) -> None:
    rng = np.random.default_rng(3)
    fp32 = outputs(rng)
    quant = fp32 + rng.normal(0, 0.05, fp32.shape).astype(np.float32)
    truth = targets(rng)
    whole = make()
    whole.update({"y": fp32}, {"y": quant}, truth)
    first, second = make(), make()
    first.update({"y": fp32[:4]}, {"y": quant[:4]}, None if truth is None else truth[:4])
    second.update({"y": fp32[4:]}, {"y": quant[4:]}, None if truth is None else truth[4:])
    first.merge(pickle.loads(pickle.dumps(second)))  # as an xdist worker's state would arrive
    assert first.compute() == whole.compute()
    assert first.state == whole.state


def test_task_specs_name_built_ins_import_paths_and_options() -> None:
    spec = TaskSpec.parse({"metric": "binary_f1", "threshold": 0.2})
    assert spec.label == "binary_f1(threshold=0.2)"
    assert spec.create().threshold == 0.2
    assert TaskSpec.parse("pytest_qaccuracy.metrics.ctc:CTCGreedy").resolve() is CTCGreedy
    assert hash(spec) == hash(TaskSpec.parse({"threshold": 0.2, "metric": "binary_f1"}))


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    (tmp_path / "user_metrics.py").write_text(
        textwrap.dedent(
            """
            class NoMerge:
                higher_is_better = {"x": True}
                def update(self, fp32, quantized, targets): pass
                def compute(self): return {}

            class Good(NoMerge):
                def merge(self, other): pass

            class AlsoX(Good):
                pass

            class Broken:
                higher_is_better = {"Bad Name": True}
                update = merge = compute = lambda self, *a: None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_metrics"
    sys.modules.pop("user_metrics", None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "nowhere.metrics:CER",
            "task metric 'nowhere.metrics:CER': cannot import 'nowhere.metrics' (ModuleNotFoundError",
        ),
        ("user_metrics:Missing", "task metric 'user_metrics:Missing': module 'user_metrics' has no 'Missing'"),
        (
            "user_metrics:NoMerge",
            "task metric 'user_metrics:NoMerge' has no method 'merge' (a task metric needs update",
        ),
        ("user_metrics:Broken", "task metric 'user_metrics:Broken': value names must be lower-case identifiers"),
        (
            {"metric": "user_metrics:Good", "colour": 1},
            "task metric 'user_metrics:Good(colour=1)': cannot create it (Type",
        ),
        ("CER", "task metric 'CER': expected 'module:Class', an entry point or a built-in name (ctc, "),
        (["user_metrics:Good", "user_metrics:AlsoX"], "task metrics 'user_metrics:Good' and 'user_metrics:AlsoX' both"),
        ([3], "expected 'module:Class' or a table with 'metric' and options, got 3"),
    ],
)
def test_a_metric_that_cannot_be_used_says_why_in_one_line(user_module, value, message) -> None:
    with pytest.raises(ValueError) as info:
        parse_task_specs(value)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_suffix_names_the_values_of_one_metric_on_two_outputs() -> None:
    from pytest_qaccuracy.analysis.outputs import TaskRun

    specs = parse_task_specs(
        [{"metric": "binary_f1", "output": "a", "suffix": "a"}, {"metric": "binary_f1", "output": "b", "suffix": "b"}]
    )
    run = TaskRun(specs, [[1, 0], [0, 1]])
    run.begin(TaskContext(("a", "b"), {}, 2))
    fp32 = {"a": np.array([[0.9, 0.1], [0.2, 0.8]]), "b": np.array([[0.9, 0.9], [0.9, 0.9]])}
    run.update(fp32, fp32, 0, 2)
    values = run.result()
    assert sorted(values) == ["f1_a", "f1_b"]
    assert values["f1_a"].fp32 == 1.0  # a: 2 TP
    assert values["f1_b"].fp32 == pytest.approx(2 * 2 / (2 * 2 + 2))  # b: 2 TP, 2 FP
    with pytest.raises(ValueError, match="task metrics 'binary_f1' and 'binary_f1' both compute 'f1'"):
        parse_task_specs(["binary_f1", "binary_f1"])
    with pytest.raises(ValueError, match="suffix must be a lower-case identifier, got 'B-2'"):
        parse_task_specs([{"metric": "binary_f1", "suffix": "B-2"}])


def test_an_entry_point_names_a_metric(monkeypatch) -> None:
    import importlib.metadata

    from pytest_qaccuracy.metrics.task import ENTRY_POINTS

    point = importlib.metadata.EntryPoint("cer", "pytest_qaccuracy.metrics.ctc:CTCGreedy", ENTRY_POINTS)
    seen = []

    def entry_points(group=None):
        seen.append(group)
        return [point] if group == ENTRY_POINTS else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert TaskSpec.parse("cer").resolve() is CTCGreedy
    assert seen == [ENTRY_POINTS]
    with pytest.raises(ValueError, match="task metric 'wer': expected 'module:Class', an entry point or a built-in"):
        TaskSpec.parse("wer").resolve()


class _OneExtra(BinaryF1):
    """A user's metric whose decode gives one prediction more than the batch has records."""

    def decode(self, outputs):
        return [*super().decode(outputs), 1]


def test_a_decode_that_gives_the_wrong_number_of_predictions_says_so() -> None:
    """The message said '2 targets for 3 records' before: the batch had 2 records, decode gave 3."""
    from pytest_qaccuracy.analysis.outputs import TaskRun
    from pytest_qaccuracy.errors import CheckError

    metric = _OneExtra()
    metric.begin(TaskContext(("y",), {}, 2))
    scores = {"y": np.array([[0.9, 0.1], [0.2, 0.8]])}
    with pytest.raises(ValueError) as info:
        metric.update(scores, scores, [0, 1])
    assert str(info.value) == "decode gave 3 predictions for 2 targets; expected one per record"
    run = TaskRun([TaskSpec("pytest_qaccuracy.metrics.binary:BinaryF1")], [0, 1])
    run.begin(TaskContext(("y",), {}, 2))
    run.metrics = [metric]
    with pytest.raises(CheckError) as info:
        run.update(scores, scores, 0, 2)
    assert str(info.value) == (
        "task metric 'pytest_qaccuracy.metrics.binary:BinaryF1' on records 0..1: "
        "ValueError: decode gave 3 predictions for 2 targets; expected one per record"
    )


def test_options_that_are_not_plain_values_and_a_list_that_is_not_a_list() -> None:
    with pytest.raises(ValueError) as info:
        TaskSpec.parse({"metric": "binary_f1", "threshold": {0.5}})
    assert str(info.value) == (
        "task metric 'binary_f1': options must be plain values (Object of type set is not JSON serializable)"
    )
    loop: dict = {"metric": "binary_f1"}
    loop["again"] = loop
    with pytest.raises(ValueError) as info:
        TaskSpec.parse(loop)
    assert str(info.value) == "task metric 'binary_f1': options must be plain values (Circular reference detected)"
    with pytest.raises(ValueError) as info:
        parse_task_specs(3)
    assert str(info.value) == "expected a list of task metrics, got 3"


@pytest.mark.parametrize("declared", ["['x']", "{}", None])
def test_a_user_metric_without_a_value_name_mapping_is_refused(tmp_path, declared) -> None:
    line = "" if declared is None else f"    higher_is_better = {declared}\n"
    (tmp_path / "names_metric.py").write_text(
        "class Names:\n" + line + "    update = merge = compute = lambda self, *a: None\n", encoding="utf-8"
    )
    try:
        with pytest.raises(ValueError) as info:
            TaskSpec("names_metric:Names", folder=str(tmp_path)).create()
    finally:
        sys.modules.pop("names_metric", None)
    assert str(info.value) == (
        "task metric 'names_metric:Names': higher_is_better must map each value name to True/False"
    )


def test_a_user_module_that_raises_while_importing_is_not_left_half_imported(tmp_path) -> None:
    (tmp_path / "raising_metric.py").write_text(
        "import sys\nsys.modules[__name__].seen = True\nraise RuntimeError('no GPU here\\nsecond line')\n",
        encoding="utf-8",
    )
    spec = TaskSpec("raising_metric:Metric", folder=str(tmp_path))
    for _ in range(2):  # the second import runs the module again rather than finding a half-made one
        with pytest.raises(ValueError) as info:
            spec.resolve()
        assert str(info.value) == (
            "task metric 'raising_metric:Metric': cannot import 'raising_metric' (RuntimeError: no GPU here)"
        )
        assert "raising_metric" not in sys.modules


def test_ctc_reads_its_characters_from_a_file_path(tmp_path) -> None:
    (tmp_path / "chars.txt").write_text("c\na\nt\nu\n", encoding="utf-8")
    metric = CTCGreedy(characters=str(tmp_path / "chars.txt"))
    assert metric.alphabet == ["", "c", "a", "t", "u", " "]  # blank first, then the lines, then a space
    metric.begin(TaskContext(("y",), {}, 1))  # no metadata needed
    assert metric.decode({"y": _one_hot([[2, 3]], 6)}) == ["at"]
    missing = tmp_path / "none.txt"
    with pytest.raises(ValueError) as info:
        TaskSpec.parse({"metric": "ctc", "characters": str(missing)}).create()
    assert str(info.value) == (
        f"task metric 'ctc(characters={str(missing)!r})': cannot create it "
        f"(FileNotFoundError: [Errno 2] No such file or directory: {str(missing)!r})"
    )


def test_task_outputs_and_targets_of_the_wrong_shape_are_named() -> None:
    with pytest.raises(ValueError) as info:
        BinaryF1().score(np.ones((2, 3), bool), [[1, 0], [0, 1]])
    assert str(info.value) == "targets of shape (2,) per record, predictions (3,)"
    for shape in [(2, 4, 5), (4, 5)]:  # four rows: boxes without a class score; two axes: no record axis
        with pytest.raises(ValueError) as info:
            decode_yolo(np.zeros(shape, np.float32))
        assert str(info.value) == f"expected (records, 4 + classes, anchors), got shape {shape}"
    with pytest.raises(ValueError) as info:
        match(np.zeros((1, 6)), np.zeros((2, 3)), 0.5)
    assert str(info.value) == "a target must be (boxes, 5) rows x1, y1, x2, y2, class (or (boxes, 4)), got (2, 3)"


class _BadTargets(BinaryF1):
    """A user's metric that refuses a target with the library's own DataError."""

    def score(self, predictions, targets):
        from pytest_qaccuracy.errors import DataError

        raise DataError("truth.jsonl: record 1: expected a 0/1 target")


@pytest.mark.parametrize("keep_errors", [False, True])
def test_a_library_error_from_a_task_metric_goes_through_unwrapped(keep_errors: bool) -> None:
    """Our own errors already name what is wrong: not wrapped as 'task metric ... raised', not set aside."""
    from pytest_qaccuracy.analysis.outputs import TaskRun
    from pytest_qaccuracy.errors import DataError

    run = TaskRun([TaskSpec("binary_f1")], [0, 1], keep_errors=keep_errors)
    run.begin(TaskContext(("y",), {}, 2))
    run.metrics = [_BadTargets()]
    scores = {"y": np.array([[0.9], [0.2]])}
    with pytest.raises(DataError) as info:
        run.update(scores, scores, 0, 2)
    assert str(info.value) == "truth.jsonl: record 1: expected a 0/1 target"
    assert run.errors == {}


# -- detection at its boundaries ---------------------------------------------------------------------


def test_matching_takes_the_most_confident_detection_first() -> None:
    """B (0.9) overlaps T1 best and T2 enough; A (0.6) overlaps T1 only. Best first, B takes T1 and A
    finds nothing: 1 TP. (Least confident first, A would take T1 and B T2: 2 TP.)"""
    targets = np.array([[0, 0, 10, 10, 0], [5, 0, 15, 10, 0]], float)
    a = [0, 0, 10, 10, 0.6, 0]  # IoU 1 with T1, 1/3 with T2
    b = [1, 0, 11, 10, 0.9, 0]  # IoU 9/11 with T1, 6/14 with T2
    b_t2 = box_iou(np.array(b[:4]), targets[1, :4])[0, 0]
    assert b_t2 == pytest.approx(60 / 140) and box_iou(np.array(b[:4]), targets[0, :4])[0, 0] == pytest.approx(90 / 110)
    assert match(np.array([a, b]), targets, 0.4) == (1, 1, 1)


def test_an_overlap_of_exactly_the_iou_matches() -> None:
    targets = np.array([[0, 0, 10, 10, 3]], float)
    half = np.array([[0, 0, 10, 5, 0.5, 3]], float)  # IoU 50 / 100
    assert box_iou(half[:, :4], targets[:, :4])[0, 0] == 0.5
    assert match(half, targets, 0.5) == (1, 0, 0)
    assert match(half, targets, 0.51) == (0, 1, 1)


def test_matching_without_targets_with_one_flat_target_and_with_class_free_targets() -> None:
    dets = np.array([[0, 0, 10, 10, 0.9, 1], [20, 20, 30, 30, 0.8, 0]], float)
    assert match(dets, np.zeros((0, 5)), 0.5) == (0, 2, 0)
    assert match(dets, [], 0.5) == (0, 2, 0)
    assert match(dets, np.array([0, 0, 10, 10, 1], float), 0.5) == (1, 1, 0)  # one target, flat
    assert match(dets, np.array([[20, 20, 30, 30]], float), 0.5) == (1, 1, 0)  # (boxes, 4): any class
    with pytest.raises(ValueError, match=r"\(boxes, 5\) rows"):
        match(dets, np.zeros((1, 6)), 0.5)


def test_box_iou_of_fractional_tiny_inverted_and_empty_boxes() -> None:
    a = np.array([[0, 0, 10, 10]], float)
    assert box_iou(a, np.array([[9.5, 0, 19.5, 10]]))[0, 0] == pytest.approx(5 / 195)  # overlap 0.5 wide
    tiny = np.array([[0, 0, 0.5, 0.5]])
    assert box_iou(tiny, tiny)[0, 0] == 1.0  # union 0.25 < 1
    assert box_iou(tiny, np.array([[0, 0, 0.5, 0.25]]))[0, 0] == pytest.approx(0.5)
    inverted = np.array([[10, 10, 0, 0]], float)  # x2 < x1: no area
    assert box_iou(inverted, a)[0, 0] == 0.0 and box_iou(a, inverted)[0, 0] == 0.0
    point = np.array([[3, 3, 3, 3]], float)
    with np.errstate(all="raise"):
        assert box_iou(point, point)[0, 0] == 0.0  # union 0: 0, not NaN


def test_nms_keeps_a_box_suppressed_and_keeps_an_overlap_of_exactly_the_threshold() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 9], [50, 50, 60, 60], [0, 0, 10, 5]], float)
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    from pytest_qaccuracy.metrics.detection import nms

    # box 1 overlaps box 0 by 0.9: suppressed, and stays so after box 2 (far away) is kept
    assert nms(boxes, scores, 0.7).tolist() == [0, 2, 3]  # box 3 overlaps box 0 by exactly 0.5 < 0.7
    assert nms(boxes, scores, 0.5).tolist() == [0, 2, 3]  # exactly the threshold: kept
    assert nms(boxes, scores, 0.49).tolist() == [0, 2]


def _anchors(*rows) -> np.ndarray:
    """(1, 4 + classes, anchors) from rows (cx, cy, w, h, score per class...)."""
    return np.array(rows, np.float32).T[None]


def test_decode_keeps_a_score_of_exactly_conf_and_never_suppresses_across_classes() -> None:
    out = _anchors([50, 50, 100, 100, 0.25, 0.0], [50, 50, 100, 100, 0.0, 0.5], [50, 50, 100, 100, 0.2, 0.1])
    found = decode_yolo(out, conf=0.25, nms_iou=0.1)[0]
    assert found[:, 5].tolist() == [1.0, 0.0]  # both classes kept, best first; 0.2 < conf dropped
    assert found[:, :4].tolist() == [[0, 0, 100, 100]] * 2


def test_nms_breaks_ties_by_the_lower_index_among_many() -> None:
    from pytest_qaccuracy.metrics.detection import nms

    # 64 places, two equal-score boxes on each (one of them 1 wide smaller): a sort that is not stable
    # may put either first; the lower index must be kept
    rng = np.random.default_rng(3)
    places = rng.permutation(64)
    first = np.array([[20 * p, 0, 20 * p + 10, 10] for p in places], float)
    second = first - [0, 0, 1, 0]
    boxes = np.concatenate([second, first])  # the smaller box has the lower index
    scores = np.tile(rng.permutation(64) / 64, 2)  # box i and box 64 + i: one place, one score
    kept = nms(boxes, scores, 0.5)
    assert sorted(kept.tolist()) == list(range(64))


def test_match_takes_tied_detections_in_index_order() -> None:
    """Two detections of one score per place: the first (index) overlaps two targets, the best of
    them the second detection's only one. In index order the first takes that target and the second
    matches nothing; the other way round, both match. 64 such places on four scores, so that a sort
    which does not keep equal scores in order shows."""
    targets, detections = [], []
    for p in range(64):
        x = 100.0 * p
        targets += [[x, 0, x + 10, 10, 0], [x + 4, 0, x + 14, 10, 0]]
        detections.append([x, 0, x + 12, 10, 0.5 + p % 4 / 8, 0])  # IoU 100/120 with the first, 80/140 the second
    detections += [[100.0 * p, 0, 100.0 * p + 10, 10, 0.5 + p % 4 / 8, 0] for p in range(64)]  # IoU 1 and 60/140
    order = np.argsort([p for p in range(64)] * 2, kind="stable")  # each place's two detections side by side
    tp, fp, fn = match(np.array(detections)[order], np.array(targets), 0.5)
    assert (tp, fp, fn) == (64, 64, 64)  # one match per place: the second detection finds its target taken


def test_decode_yolo_defaults_are_ultralytics(monkeypatch) -> None:
    """conf 0.25, IoU 0.7 and at most 300 boxes, as ``ultralytics`` predicts."""
    rows = [[20 * i + 5, 5, 10, 10, 0.5] for i in range(301)]  # 301 boxes apart, one class
    rows += [[5, 5, 10, 10, 0.25], [5, 5, 10, 10, 0.2499]]  # at conf: kept (then suppressed), under: dropped
    out = _anchors(*rows)
    assert len(decode_yolo(out)[0]) == 300
    assert len(decode_yolo(out, max_det=400)[0]) == 301
    pair = _anchors([5, 5, 10, 10, 0.9], [5, 5, 10, 8, 0.8], [5, 5, 10, 7, 0.7])  # IoU 0.8 and 0.7 with the first
    assert decode_yolo(pair)[0][:, 4].tolist() == pytest.approx([0.9, 0.7])
    assert len(decode_yolo(_anchors([5, 5, 10, 10, 0.2500001]))[0]) == 1
    assert len(decode_yolo(_anchors([5, 5, 10, 10, 0.2499]))[0]) == 0


def test_decode_keeps_classes_apart_in_normalized_coordinates() -> None:
    """Boxes in 0..1 (a model exported with normalized outputs): the shift that keeps classes apart in
    one NMS call must still be wider than any box."""
    out = _anchors([0.25, 0.25, 0.5, 0.5, 0.9, 0.0], [0.25, 0.25, 0.5, 0.5, 0.0, 0.8])
    found = decode_yolo(out, conf=0.25, nms_iou=0.5)[0]
    assert found[:, 5].tolist() == [0.0, 1.0]


def test_yolo_metric_passes_its_options_to_decode_and_scores_by_name() -> None:
    out = _anchors([5, 5, 10, 10, 0.35], [5, 5, 10, 8, 0.3], [100, 100, 10, 10, 0.9])
    assert len(YoloDetection(conf=0.3, nms_iou=0.9).decode({"y": out})[0]) == 3  # IoU 0.8 < 0.9: kept
    assert len(YoloDetection(conf=0.3).decode({"y": out})[0]) == 2  # the default 0.7 suppresses it
    assert len(YoloDetection(conf=0.32).decode({"y": out})[0]) == 2  # 0.3 under conf
    assert len(YoloDetection(conf=0.3, max_det=1).decode({"y": out})[0]) == 1
    many = _anchors(*[[20 * i + 5, 5, 10, 10, 0.9] for i in range(301)])
    assert len(YoloDetection().decode({"y": many})[0]) == 300  # max_det's default
    metric = YoloDetection()
    predictions = metric.decode({"y": out})
    targets = metric.as_targets(predictions)
    assert targets[0].tolist() == [[95, 95, 105, 105, 0], [0, 0, 10, 10, 0]]
    assert metric.score(predictions, [np.zeros((0, 5))]) == {"tp": 0, "fp": 2, "fn": 0}
    assert metric.finish({}) == {"precision": None, "recall": None}
    assert metric.finish({"tp": 3, "fp": 1}) == {"precision": 0.75, "recall": 1.0}


def test_finish_counts_a_missing_sum_as_zero_and_nothing_to_divide_by_as_undefined() -> None:
    assert BinaryF1().finish({}) == {"f1": None}
    assert BinaryF1().finish({"tp": 1}) == {"f1": 1.0} and BinaryF1().finish({"fp": 1}) == {"f1": 0.0}
    assert BinaryF1().finish({"tp": 1, "fn": 1}) == {"f1": pytest.approx(2 / 3)}
    detection = YoloDetection()
    assert detection.finish({"tp": 3}) == {"precision": 1.0, "recall": 1.0}
    assert detection.finish({"fn": 2}) == {"precision": None, "recall": 0.0}
    assert detection.finish({"fp": 2}) == {"precision": 0.0, "recall": None}
    ctc = CTCGreedy(characters=["a"])
    assert ctc.finish({}) == {"cer": None, "exact_match": None}
    assert ctc.finish({"characters": 4, "records": 2}) == {"cer": 0.0, "exact_match": 0.0}
    assert ctc.finish({"edits": 1, "characters": 4, "exact": 1, "records": 2}) == {"cer": 0.25, "exact_match": 0.5}


def test_a_binary_decision_at_exactly_the_threshold_is_positive() -> None:
    metric = BinaryF1(threshold=0.5)
    assert metric.decode({"p": np.array([[0.5, 0.49], [0.51, 0.0]])}).tolist() == [[True, False], [True, False]]
    predictions = metric.decode({"p": np.array([[0.7, 0.2]])})
    assert np.array_equal(metric.as_targets(predictions), predictions)


def test_ctc_scores_need_one_text_per_prediction_and_decode_on_another_class_axis() -> None:
    ctc = CTCGreedy(characters=["a", "b"], space=False)
    with pytest.raises(ValueError):
        ctc.score(["a"], ["a", "b"])
    assert ctc.score(["ab", "b"], ["ab", "a"]) == {"edits": 1, "characters": 3, "exact": 1, "records": 2}
    steps = np.array([[1, 1, 0, 2], [0, 0, 1, 0]])  # classes per step: blank, a, b
    scores = np.eye(3)[steps]  # (records, steps, classes)
    assert ctc.decode({"y": scores}) == ["ab", "a"]
    across = CTCGreedy(characters=["a", "b"], space=False, class_axis=1)
    assert across.decode({"y": np.moveaxis(scores, -1, 1)}) == ["ab", "a"]


def test_a_task_metric_counts_records_over_batches_and_says_what_it_scored_against() -> None:
    metric = BinaryF1()
    batch = {"p": np.array([[0.9], [0.1]])}
    metric.update(batch, batch, None)
    metric.update(batch, batch, None)
    assert metric.state["records"] == 4 and metric.state["against"] == "fp32"
    with_targets = BinaryF1()
    with_targets.update(batch, batch, [np.array([1]), np.array([1])])
    assert with_targets.state["against"] == "targets"
    assert with_targets.compute()["quantized"] == {"f1": pytest.approx(2 / 3)}


def test_sums_keep_whole_numbers_as_integers() -> None:
    from pytest_qaccuracy.metrics.task import _add

    sums: dict = {}
    _add(sums, {"n": 2.0, "x": 2.5, "k": 3})
    assert sums == {"n": 2, "x": 2.5, "k": 3}
    assert type(sums["n"]) is int and type(sums["x"]) is float and type(sums["k"]) is int


def test_a_package_beside_the_suite_is_imported_and_a_nested_class_resolved(tmp_path) -> None:
    """``folder`` holds a package ``suite_tasks/`` (not on sys.path): imported as a package, so its
    submodules import too, and ``module:Outer.Inner`` walks the attributes."""
    package = tmp_path / "suite_tasks"
    package.mkdir()
    (package / "__init__.py").write_text("from suite_tasks.kinds import Holder\n")
    (package / "kinds.py").write_text(
        textwrap.dedent(
            """
            from pytest_qaccuracy.metrics.binary import BinaryF1

            class Holder:
                class Inner(BinaryF1):
                    pass
            """
        )
    )
    try:
        spec = TaskSpec("suite_tasks:Holder.Inner", folder=str(tmp_path))
        assert spec.resolve().__qualname__ == "Holder.Inner"
        assert sys.modules["suite_tasks"].__path__ == [str(package)]
        with pytest.raises(ValueError, match=r"module 'suite_tasks' has no 'Holder\.Outer'"):
            TaskSpec("suite_tasks:Holder.Outer", folder=str(tmp_path)).resolve()
    finally:
        for name in ("suite_tasks", "suite_tasks.kinds"):
            sys.modules.pop(name, None)


def test_a_module_missing_beside_the_suite_or_inside_it_is_not_imported_from_there(tmp_path) -> None:
    (tmp_path / "lonely.py").write_text("import not_a_module_anywhere\n")
    inside = r"cannot import 'lonely' \(ModuleNotFoundError: No module named 'not_a_module"
    with pytest.raises(ValueError, match=inside):
        TaskSpec("lonely:X", folder=str(tmp_path)).resolve()
    sys.modules.pop("lonely", None)
    with pytest.raises(ValueError, match=r"cannot import 'absent_here' \(ModuleNotFoundError"):
        TaskSpec("absent_here:X", folder=str(tmp_path)).resolve()
    with pytest.raises(ValueError, match=r"cannot import 'lonely_too' \(ModuleNotFoundError"):
        TaskSpec("lonely_too:X").resolve()  # no folder: sys.path only


def test_a_class_without_the_protocol_is_named_by_its_qualified_name() -> None:
    from pytest_qaccuracy.metrics.task import REQUIRED, check_task_class

    class Half:
        def update(self):
            pass

    with pytest.raises(ValueError) as info:
        check_task_class(Half)
    missing = ", ".join(repr(m) for m in REQUIRED if m != "update")
    assert str(info.value) == (
        f"task metric '{Half.__qualname__}' has no method {missing} (a task metric needs {', '.join(REQUIRED)})"
    )
    check_task_class(BinaryF1)  # the protocol whole: no error


def test_merge_keeps_what_either_side_scored_against_and_options_are_kept_sorted() -> None:
    empty, scored = BinaryF1(), BinaryF1()
    batch = {"p": np.array([[0.9]])}
    scored.update(batch, batch, [np.array([1])])
    empty.merge(scored)
    assert empty.state["against"] == "targets" and empty.state["records"] == 1
    assert TaskSpec.parse({"metric": "ctc", "space": False, "blank": 0}).options == '{"blank": 0, "space": false}'
    with pytest.raises(ValueError, match="expected 'module:Class' or a table"):
        TaskSpec.parse({"metric": 5})

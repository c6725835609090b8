"""How many lines a port from PyTorch to jmodule changes, per file pair, and why.

For every ``<model>_torch.py`` / ``<model>_jm.py`` pair in ``tests/models/ports/`` (or
the folder given), ``difflib`` compares the two files line by line. The
module docstrings are left out (each file's describes itself), and so are
blank and comment-only lines. A changed line is counted once, on the PyTorch
side: every original line that a block of the diff replaces or deletes, plus
every line a block purely adds. Each counted line gets one class, the first
that fits:

* ``imports``: an ``import`` / ``from ... import`` line;
* ``namespace``: the port is the same line with ``torch.`` spelled ``jm.``;
* ``indentation``: the same line, indented differently (moved into a closure);
  a line of brackets alone counts so when its whole statement moved unchanged;
* ``backward/optimizer``: ``loss.backward()`` and what goes with it
  (``.grad``, ``p.data.<op>_``, ``zero_grad``, ``no_grad``, ``.step(``), or the
  port's line is the ``jm.backward(closure)`` spelling;
* ``tensor method``: a ``torch.Tensor`` method on an activation that a
  ``jax.Array`` lacks or spells differently (``.size(``, ``.view(``,
  ``.transpose(``, ``.permute(``, ``.contiguous(``, ``.float(``, ``.chunk(``,
  ``.sum(dim=...)``, ...);
* ``other``.

The port's line that stands for an original line is the most similar line of
the same diff block (``# port: ...`` comments ignored). A line of a statement
written over several lines is tested with the whole statement's text for the
last two classes.

Run ``python benchmarks/port_lines.py`` for a markdown table, ``--json`` for
the same as JSON, ``--lines`` to list every counted line with its class.
``tests/models/test_ports.py`` checks the counting on a small pair of sources.

For comparison, the table for the first ports, written against plain
``jax.Array`` activations (before ``jm.Tensor`` and ``import jmodule.torch as
torch``: ``torch.X`` spelled ``jm.X``, and ``x.size(0)``, ``x.view(...)``,
``x.transpose(1, 2)``, ``w.new_zeros(...)``, ``x.float()`` rewritten as
NumPy/JAX spells them)::

    | model   | model lines | changed | %    | imp. | ns. | indent. | backward | tensor | other |
    | ------- | ----------- | ------- | ---- | ---- | --- | ------- | -------- | ------ | ----- |
    | lstm_lm | 177         | 27      | 15.3 | 4    | 5   | 1       | 3        | 13     | 1     |
    | unet    | 218         | 48      | 22.0 | 5    | 9   | 7       | 1        | 25     | 1     |
    | vit     | 124         | 13      | 10.5 | 2    | 4   | 0       | 0        | 7      | 0     |

(the classes in order: imports, namespace, indentation, backward/optimizer,
tensor method, other).

The ports in ``tests/models/ports/`` now import ``jmodule.torch`` and compute with
``jm.Tensor`` s; the script prints their table.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORTS = ROOT / "tests" / "models" / "ports"
CLASSES = (
    "imports",
    "namespace",
    "indentation",
    "backward/optimizer",
    "tensor method",
    "other",
)
_PORT_COMMENT = re.compile(r"\s*# port:.*$")
_TORCH_NS = re.compile(r"\btorch\.")
_BACKWARD = re.compile(r"\.backward\(|\.grad\b|\.data\.\w+_\(|\bzero_grad\(|\bno_grad\b|\.step\(")
_JM_BACKWARD = re.compile(r"\bjm\.backward\(|\bnonlocal\b|\bdef closure\(")
_TENSOR_METHODS = (
    "size view view_as reshape_as transpose permute contiguous masked_fill masked_fill_ "
    "float double long int bool half chunk split unsqueeze squeeze repeat expand expand_as t "
    "new_zeros new_ones new_full new_empty new_tensor narrow detach clone to type type_as dim "
    "numel flatten sum mean max min argmax argmin std var norm cuda cpu numpy tolist softmax "
    "log_softmax add_ mul_ sub_ div_ zero_ fill_ copy_ clamp clamp_ masked_scatter index_select"
).split()
_TENSOR = re.compile(r"\.(" + "|".join(_TENSOR_METHODS) + r")\(")
_PUNCTUATION = re.compile(r"[()\[\]{},:]+")  # a line of brackets: the statement's class
_ASSIGNED = re.compile(r"\s*(\w+)\s*[-+*/]?=[^=]")
_BACKWARD_CALL = re.compile(r"^(.*)\.backward\(")


def _code(line: str) -> bool:
    """A line that counts: not blank, not only a comment."""
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _without_docstring(source: str) -> list[str]:
    """The source's lines with the module docstring's lines blanked (numbering kept)."""
    lines = source.splitlines()
    body = ast.parse(source).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            for i in range(body[0].lineno - 1, body[0].end_lineno):
                lines[i] = ""
    return lines


def _statements(source: str) -> dict[int, tuple[int, int]]:
    """0-based line -> the (first, last) 0-based lines of the statement (or header) on it."""
    spans: dict[int, tuple[int, int]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt):
            continue
        first, last = node.lineno - 1, node.end_lineno - 1
        body = getattr(node, "body", None)
        if isinstance(body, list) and body:  # a compound statement: its header only
            last = min(last, body[0].lineno - 2)
            for dec in getattr(node, "decorator_list", []):
                first = min(first, dec.lineno - 1)
        for i in range(first, last + 1):
            old = spans.get(i)
            if old is None or old[1] - old[0] > last - first:  # the innermost
                spans[i] = (first, last)
    return spans


def _partner(line: str, candidates: list[str]) -> str | None:
    """The most similar of ``candidates`` (comment-stripped port lines) to ``line``."""
    best, score = None, -1.0
    for c in candidates:
        r = difflib.SequenceMatcher(None, line.strip(), c.strip()).ratio()
        if r > score:
            best, score = c, r
    return best


def _moved(statement: list[str], ported: list[str]) -> bool:
    """Whether the statement's lines stand, in order and unchanged but for their indentation,
    among ``ported`` (the port's lines of the same diff block)."""
    want, have = [x.strip() for x in statement], [x.strip() for x in ported]
    return any(have[k : k + len(want)] == want for k in range(len(have) - len(want) + 1))


def classify(
    torch_line: str,
    port_line: str | None,
    statement: str | None = None,
    loss_names: frozenset[str] = frozenset(),
    moved: bool = False,
) -> str:
    """The class of one changed line.

    Args:
        torch_line: the original's line (for a line only the port has, pass
            it here and ``port_line=None``).
        port_line: the port's line standing for it, ``# port:`` comment
            removed, or ``None`` when the line was deleted or purely added.
        statement: the whole statement ``torch_line`` belongs to, when it is
            written over several lines (defaults to ``torch_line``).
        loss_names: names that a ``.backward()`` of the same diff block is
            called on (``loss`` for ``loss.backward()``): a line assigning
            one of them moved into the ``jm.backward`` closure.
        moved: the whole statement stands unchanged in the port's block,
            indented differently (see :func:`_moved`): decides a line of
            brackets alone, which has no partner of its own.

    Returns:
        One of :data:`CLASSES`.
    """
    text = statement or torch_line
    stripped = torch_line.strip()
    if stripped.startswith(("import ", "from ")):
        return "imports"
    if port_line is not None and not _PUNCTUATION.fullmatch(stripped):
        if _TORCH_NS.search(torch_line) and _TORCH_NS.sub("jm.", stripped) == port_line.strip():
            return "namespace"
        if stripped == port_line.strip():
            return "indentation"
    elif port_line is not None and moved:
        return "indentation"
    assigned = _ASSIGNED.match(torch_line)
    if assigned and assigned.group(1) in loss_names:
        return "backward/optimizer"
    if _BACKWARD.search(text) or _JM_BACKWARD.search(text):
        return "backward/optimizer"
    if port_line is not None and _JM_BACKWARD.search(port_line):
        return "backward/optimizer"
    if _TENSOR.search(text):
        return "tensor method"
    return "other"


def count_changes(torch_source: str, jm_source: str) -> dict:
    """Count and classify the lines a port changes.

    Args:
        torch_source: the PyTorch file's text.
        jm_source: the jmodule port's text.

    Returns:
        A dict: ``model_lines`` (code lines of the original, module docstring,
        blank and comment-only lines left out), ``changed_lines`` (counted as
        the module docstring says), ``port_lines`` (code lines of the port in
        the changed blocks), ``classes`` (class -> count, every class of
        :data:`CLASSES`) and ``lines`` (``(class, line)`` for each counted
        line, in order; a line only the port has starts with ``"+ "``).
    """
    old, new = _without_docstring(torch_source), _without_docstring(jm_source)
    spans = _statements(torch_source)
    classes = dict.fromkeys(CLASSES, 0)
    counted: list[tuple[str, str]] = []
    port_lines = 0
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        ported = [_PORT_COMMENT.sub("", x) for x in new[j1:j2] if _code(x)]
        port_lines += len(ported)
        if tag == "insert":
            for line in ported:
                kind = classify(line, None)
                classes[kind] += 1
                counted.append((kind, "+ " + line.strip()))
            continue
        loss_names = frozenset(
            name
            for line in old[i1:i2]
            if (call := _BACKWARD_CALL.match(line.strip()))
            for name in re.findall(r"\w+", call.group(1))
        )
        for i in range(i1, i2):
            line = old[i]
            if not _code(line):
                continue
            first, last = spans.get(i, (i, i))
            lines = old[first : last + 1]
            statement = " ".join(x.strip() for x in lines)
            moved = _moved([x for x in lines if _code(x)], ported)
            kind = classify(line, _partner(line, ported), statement, loss_names, moved)
            classes[kind] += 1
            counted.append((kind, line))
    return {
        "model_lines": sum(_code(x) for x in old),
        "changed_lines": len(counted),
        "port_lines": port_lines,
        "classes": classes,
        "lines": counted,
    }


def count_dir(folder: Path = PORTS) -> list[dict]:
    """:func:`count_changes` for every ``<model>_torch.py`` with a ``<model>_jm.py`` beside it.

    Args:
        folder: where the pairs are.

    Returns:
        One dict per pair, sorted by model name: ``model``, ``torch_file``,
        ``jm_file`` and the keys :func:`count_changes` returns.
    """
    rows = []
    for torch_file in sorted(Path(folder).glob("*_torch.py")):
        model = torch_file.name.removesuffix("_torch.py")
        jm_file = torch_file.with_name(f"{model}_jm.py")
        if not jm_file.exists():
            continue
        counts = count_changes(torch_file.read_text(), jm_file.read_text())
        rows.append({"model": model, "torch_file": torch_file.name, "jm_file": jm_file.name})
        rows[-1].update(counts)
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table, with a total row when there are several.

    Args:
        rows: what :func:`count_dir` returns.

    Returns:
        The table's text.
    """
    head = ["model", "model lines", "changed", "%", *CLASSES, "port lines in changes"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    total = {"model": "**total**", "model_lines": 0, "changed_lines": 0, "port_lines": 0}
    total["classes"] = dict.fromkeys(CLASSES, 0)
    for row in [*rows, total] if len(rows) > 1 else rows:
        if row is not total:
            for key in ("model_lines", "changed_lines", "port_lines"):
                total[key] += row[key]
            for kind in CLASSES:
                total["classes"][kind] += row["classes"][kind]
        pct = 100.0 * row["changed_lines"] / max(row["model_lines"], 1)
        cells = [
            row["model"],
            str(row["model_lines"]),
            str(row["changed_lines"]),
            f"{pct:.1f}",
            *(str(row["classes"][k]) for k in CLASSES),
            str(row["port_lines"]),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """The command line: print the table (or JSON) for a folder of pairs.

    Args:
        argv: the arguments (``sys.argv[1:]`` when ``None``).

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(PORTS), help="folder of file pairs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--lines", action="store_true", help="also list each counted line")
    args = parser.parse_args(argv)
    rows = count_dir(Path(args.folder))
    if not rows:
        print(f"no <model>_torch.py / <model>_jm.py pairs in {args.folder}", file=sys.stderr)
        return 1
    if args.json:
        if not args.lines:
            rows = [{k: v for k, v in r.items() if k != "lines"} for r in rows]
        print(json.dumps(rows, indent=2))
        return 0
    print(markdown(rows))
    if args.lines:
        for row in rows:
            print(f"\n{row['torch_file']}:")
            for kind, line in row["lines"]:
                print(f"  [{kind}] {line.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

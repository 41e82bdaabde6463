"""Assembles data/perplexity/eval.txt, the fixed text `minfer perplexity` is measured on.

Run from the repository root with CPython 3.11's standard library at hand:
    python3 data/perplexity/make-eval-text.py /usr/lib/python3.11
The output is committed; this script records where every part came from (README.md).
"""
import ast
import pathlib
import sys

LIB = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/lib/python3.11")
HERE = pathlib.Path(__file__).parent

# Prose: the Python Language Reference and library topics as pydoc ships them.
TOPICS = [
    "assignment", "atom-identifiers", "attribute-access", "augassign", "binary",
    "bitwise", "booleans", "break", "callable-types", "calls", "class", "comparisons",
    "compound", "context-managers", "continue", "conversions", "dynamic-features",
    "exceptions", "execmodel", "import", "naming", "objects", "truth", "typesseq",
]
# Code: small, self-contained standard-library modules.
MODULES = ["bisect.py", "colorsys.py", "heapq.py", "textwrap.py", "fnmatch.py",
           "string.py", "shlex.py", "graphlib.py"]


def topics():
    tree = ast.parse((LIB / "pydoc_data/topics.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "topics":
            return ast.literal_eval(node.value)
    raise SystemExit("no topics dict in pydoc_data/topics.py")


def main():
    parts = [(HERE / "public-domain-prose.txt").read_text(encoding="utf-8")]
    t = topics()
    parts += [t[name] for name in TOPICS]
    parts += [(LIB / m).read_text(encoding="utf-8") for m in MODULES]
    text = "\n\n".join(p.strip("\n") for p in parts) + "\n"
    (HERE / "eval.txt").write_text(text, encoding="utf-8")
    print(f"wrote {HERE / 'eval.txt'}: {len(text)} characters")


main()

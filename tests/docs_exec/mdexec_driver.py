"""Run one page's Python blocks in order in one namespace (started by ``mdexec.run_python``).

``python mdexec_driver.py BLOCKS.json``: the JSON holds the page's path and its blocks
(``line``, ``text``, ``skip``, ``needs``). A block compiles with the page as its file
name and its own line numbers, so a traceback points into the page. Exit status 1 at
the first failing block, after one line naming it.

A warning of rnnkit's or of the page's own code is an error, as in the test suite; one
raised inside another library (torch's exporter, say) is printed, as a user would see
it: the page cannot change it.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import sys
import traceback
import warnings
from typing import Any


def run_block(page: str, line: int, text: str, namespace: dict[str, Any]) -> str | None:
    """Run one block in ``namespace``; returns what went wrong, or None."""
    if text.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(text, namespace, page, page, line - 1)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        report: list[str] = []
        runner.run(test, out=report.append, clear_globs=False)
        namespace.update(test.globs)  # a doctest runs on a copy of the namespace
        return "".join(report) if runner.failures else None
    try:
        code = compile("\n" * (line - 1) + text, page, "exec")
        exec(code, namespace)
    except BaseException:
        return traceback.format_exc()
    return None


def main(spec_path: str) -> int:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    page = spec["page"]
    warnings.filterwarnings("error", module=r"(rnnkit|__main__)(\.|$)")
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for block in spec["blocks"]:
        where = f"{page}:{block['line']}"
        if block["skip"] is not None:
            print(f"{where}: skipped ({block['skip'] or 'marked skip'})")
            continue
        needs = block["needs"]
        if needs and any(importlib.util.find_spec(m) is None for m in needs.split()):
            print(f"{where}: skipped (needs {needs}, not installed)")
            continue
        failure = run_block(page, block["line"], block["text"], namespace)
        if failure is not None:
            print(f"{where}: the block fails\n{failure}", file=sys.stderr)
            return 1
        print(f"{where}: ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

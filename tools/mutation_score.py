"""The mutation score of `make mutants`, per module, from mutmut's records under mutants/.

    python tools/mutation_score.py [--at-least 0.85]

A mutant is caught when a test failed with it in place, or when its tests ran past their CPU-time limit
(mutmut's SIGXCPU at `timeout_multiplier` times their usual CPU time: CPU time, not wall time, so a busy
machine does not cause it; such a mutant loops, and would hang the suite). It survives when every selected
test passed. The score is caught / (caught + survived + no tests): a mutant no test reaches counts against
the score. It lists the survivors by name; `mutmut show <name>` shows one's change. Exit 1 when the score of
all modules, or of the engine's (lib/engine/) alone, is below --at-least.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

KILLED = {1, 3}  # a failing test (3: pytest's internal error, which mutmut counts as a kill)
SURVIVED = {0}
NOT_CHECKED = {None, 2}  # never run, or interrupted
TIMEOUT = {-24, 24, 152, 255, 36}


def status(code) -> str:
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    if code in NOT_CHECKED:
        return "not checked"
    if code in TIMEOUT:
        return "timeout"
    if code in (5, 33):
        return "no tests"
    return "killed" if code in (-11, -9) else "suspicious"  # a crash is a failing test run


def scores(mutants: Path) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        module = meta.relative_to(mutants).as_posix()[: -len(".meta")]
        out[module] = Counter(status(c) for c in codes.values())
        out[module]["survivors"] = 0
        for name, code in sorted(codes.items()):
            if status(code) != "killed" and status(code) != "not checked":
                out[module]["survivors"] += 1
                print(f"  {status(code):9s} {name}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mutants", default="mutants")
    ap.add_argument("--at-least", type=float, default=0.85)
    args = ap.parse_args(argv)
    base = Path(args.mutants)
    if not base.is_dir():
        print(f"no {base}/ here: run `make mutants` (mutmut run) first", file=sys.stderr)
        return 2
    print("mutants that were not caught:")
    per = scores(base)
    total, engine = Counter(), Counter()

    def score(c):
        counted = c["killed"] + c["survived"] + c["timeout"] + c["no tests"] + c["suspicious"]
        return (c["killed"] + c["timeout"]) / counted if counted else float("nan")

    def row(name, c, note=""):
        print(f"{name:34s} {c['killed']:7d} {c['timeout']:8d} {c['survived']:9d} {c['no tests']:9d} "
              f"{score(c):6.1%}{note}")

    print(f"\n{'module':34s} {'killed':>7s} {'timeout':>8s} {'survived':>9s} {'no tests':>9s} {'score':>6s}")
    for module, c in per.items():
        total.update(c)
        if module.startswith("lib/engine/"):
            engine.update(c)
        row(module, c)
    row("the engine (lib/engine/)", engine)
    row("all", total, f"  ({total['not checked']} not checked)")
    ok = score(total) >= args.at_least and (not engine or score(engine) >= args.at_least)
    return 0 if ok and not total["not checked"] else 1


if __name__ == "__main__":
    sys.exit(main())

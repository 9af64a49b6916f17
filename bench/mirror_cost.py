"""What keeping mutable blocks in step costs (wire.ml, `changed_blocks`): shapes of tests that
hold blocks across many calls, each timed beside a baseline with the same calls and no block
held, in one run (each shape's programs built before it is timed). One JSON line per shape.

    python bench/mirror_cost.py            # from a checkout's root; any checkout's grader

Every call compares each block both sides hold with what the peer last saw, on both sides; dead
blocks are collected once comparing them outweighs a collection. These shapes are the costly
ones (a test of the bundled set holds a few small blocks through a few calls).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())

from ocaml_grpo.problems import Problem
from ocaml_grpo.prompting import END_MARKER
from rewards import RewardConfig, RewardScorer

KEEP = ("(** Kept.\n*)\n(* Implement the following interface (k.mli):\nval keep : {t} -> unit\n\n"
        "val get : int -> int\n*)\nlet keep (a : {t}) : unit =")
SUM = "(** Sum. *)\nlet sum (a : int array) : int ="
CALLS = "  for i = 0 to 999 do assert (get i = i) done;\n  assert (get 5 = 5)\n;;"
FRESH = "  for i = 1 to 20000 do assert (sum (Array.make 10 i) = 10 * i) done;\n  assert (sum [| 1 |] = 1)\n;;"
SHAPES = [
    # (name, prompt, tests, answer, baseline tests: the same calls, nothing held)
    ("a 1M-int array held through 1000 calls", KEEP.format(t="int array"),
     "let () =\n  let a = Array.init 1_000_000 (fun i -> i) in\n  keep a;\n" + CALLS,
     "let kept = ref [||]\nlet keep a = kept := a\nlet get i = if Array.length !kept = 1 then i else (!kept).(i)",
     "let () =\n  let a = Array.init 1_000_000 (fun i -> i) in\n  keep [| 0 |];\n  ignore a;\n" + CALLS),
    ("10,000 rows held through 1000 calls", KEEP.format(t="int array array"),
     "let () =\n  let a = Array.init 10000 (fun i -> [| i |]) in\n  keep a;\n" + CALLS,
     "let kept = ref [||]\nlet keep a = kept := a\nlet get i = if Array.length !kept = 1 then i else (!kept).(i).(0)",
     "let () =\n  let a = Array.init 10000 (fun i -> [| i |]) in\n  keep [| [| 0 |] |];\n  ignore a;\n" + CALLS),
    ("20,000 calls on fresh arrays", SUM, "let () =\n" + FRESH, "let sum a = Array.fold_left (+) 0 a",
     "let () =\n" + FRESH.replace("Array.make 10 i", "[||]").replace("= 10 * i", "= 0")),
    ("20,000 calls on fresh arrays, 24 MB held by the tests", SUM,
     "let () =\n  let big = Array.init 3 (fun i -> Array.make 1_000_000 i) in\n" + FRESH,
     "let sum a = Array.fold_left (+) 0 a",
     "let () =\n  let big = Array.init 3 (fun i -> Array.make 1_000_000 i) in\n  ignore big;\n"
     + FRESH.replace("Array.make 10 i", "[||]").replace("= 10 * i", "= 0")),
]


def timed(scorer: RewardScorer, pid: str, prompt: str, tests: str, code: str) -> tuple[float, int, int]:
    t = time.perf_counter()
    b = scorer.score_one(Problem(id=pid, prompt=prompt, tests=tests), f"```ocaml\n{code}\n```\n{END_MARKER}")
    return time.perf_counter() - t, b.tests_passed, b.tests_total


def main() -> None:
    scorer = RewardScorer(RewardConfig(min_lines=0, workers=1))
    try:
        timed(scorer, "warm", SUM, "let () = assert (sum [| 1 |] = 1)\n;;", "let sum a = Array.fold_left (+) 0 a")
        for i, (name, prompt, tests, code, base) in enumerate(SHAPES):
            # each graded twice under two ids: the second is timed, its programs built by the first
            timed(scorer, f"held{i}", prompt, tests, code)
            timed(scorer, f"base{i}", prompt, base, code)
            held_s, passed, total = timed(scorer, f"held{i}b", prompt, tests, code)
            base_s, bpassed, btotal = timed(scorer, f"base{i}b", prompt, base, code)
            print(json.dumps({"shape": name, "held_s": round(held_s, 2), "baseline_s": round(base_s, 2),
                              "ratio": round(held_s / base_s, 1), "passed": f"{passed}/{total}",
                              "baseline_passed": f"{bpassed}/{btotal}"}), flush=True)
    finally:
        scorer.close()


if __name__ == "__main__":
    main()

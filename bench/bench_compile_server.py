"""What a type check costs through each way of running the compiler, side by side in one run.

    python -m bench.bench_compile_server [--n 200]

One request = `c a solution.ml`: type check a typical 12-line solution, check its typed tree
against the allowlist, emit bytecode. Timed three ways, no sandbox (the sandbox's cost is the
same for all three and is measured by bench_rewards):
- server: a request to the compile server, answered by a child forked per request;
- once: the same binary started for the one request (`--once`), as a fresh process;
- ocamlc: `ocamlc -bin-annot -c` then the allowlist check on its .cmt (`--check-cmt`): what the
  OCAML_COMPILER=ocamlc path runs per step.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from ocaml_grpo.grading.diagnostics import parse_reply
from ocaml_grpo.grading.server import build_server
from ocaml_grpo.config.settings import cache_dir

SOLUTION = """let rec fib n = if n < 2 then n else fib (n - 1) + fib (n - 2)
let sum_squares xs = List.fold_left (fun acc x -> acc + x * x) 0 xs
module SM = Map.Make (String)
let count words =
  List.fold_left (fun m w -> SM.update w (function None -> Some 1 | Some n -> Some (n + 1)) m) SM.empty words
let longest words =
  List.fold_left (fun best w -> if String.length w > String.length best then w else best) "" words
let pairs xs = List.concat_map (fun x -> List.map (fun y -> (x, y)) xs) xs
let rev_words s = String.split_on_char ' ' s |> List.rev |> String.concat " "
let () = ignore (fib 10, sum_squares [1; 2], count ["a"], longest ["ab"], pairs [1], rev_words "a b")
"""


def per_request(run, n: int) -> float:
    for _ in range(5):
        run()
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    exe = build_server(cache_dir(os.environ))
    work = Path(tempfile.mkdtemp(prefix="bench-cs-"))
    (work / "solution.ml").write_text(SOLUTION)
    request = "\t".join([str(work), "c", "a", "solution.ml"])

    server = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert server.stdout.readline() == b"ready\n"

    def served() -> None:
        server.stdin.write((request + "\n").encode())
        head = b""
        while not head.endswith(b"\n"):
            head += server.stdout.read(1)
        body = b""
        while len(body) < int(head.split()[1]):
            body += server.stdout.read(int(head.split()[1]) - len(body))
        assert parse_reply(head + body).returncode == 0

    def once() -> None:
        out = subprocess.run([str(exe), "--once", request], capture_output=True, check=True).stdout
        assert parse_reply(out).returncode == 0

    def ocamlc() -> None:
        subprocess.run(["ocamlc", "-w", "-a", "-alert", "-all", "-bin-annot", "-c", "solution.ml"], cwd=work, check=True)
        subprocess.run([str(exe), "--check-cmt", "solution.cmt"], cwd=work, check=True, capture_output=True)

    rows = [("server (fork per request)", per_request(served, args.n)),
            ("once (a fresh process)", per_request(once, args.n)),
            ("ocamlc + --check-cmt", per_request(ocamlc, args.n))]
    server.stdin.close()
    server.wait()
    base = rows[0][1]
    print(f"{'way':28} {'ms/request':>10} {'x server':>9}")
    for name, ms in rows:
        print(f"{name:28} {ms:10.2f} {ms / base:8.1f}x")


if __name__ == "__main__":
    main()

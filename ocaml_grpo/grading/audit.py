"""Dataset audit: keep out of training the problems no completion can ever pass.

GRPO learns nothing from such a problem: every completion in its group gets the same reward.
Each problem's tests are compiled against a stub with the prompt's signature (or the row's own
`stub`); tests that cannot compile with any solution (a syntax error in the tests, a type
contradiction with the signature, an unbound name other than the entry point) exclude it.
Also excluded: duplicate ids, empty tests, prompts without a signature, and prompts longer than
the token limit when one is given. A row whose `entry_point` is not an OCaml value name (say
`Strongest_Extension`, kept from a Python original) is graded through the prompt's signature
instead; its record keeps the reason in `note`.

    python rewards.py audit DATASET [--json] [--workers N] [--output-dir DIR]

Compile results are cached by content hash in $AUDIT_CACHE_DIR (default the project's cache
directory, $XDG_CACHE_HOME/ocaml-grpo),
so a set is audited once and later runs start instantly.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ocaml_grpo.grading import source as src
from ocaml_grpo.grading.completions import assemble_solution, invalid_entry_point_note
from ocaml_grpo.problems import Problem, load_problems
from ocaml_grpo.grading.grader import OcamlGrader
from ocaml_grpo.grading.trusted import grader_code_digest
from ocaml_grpo.jsonl import append, read_jsonl
from ocaml_grpo.grading.sandbox import Sandbox
from ocaml_grpo.config.isolation import SandboxConfig

AUDIT_VERSION = "3"  # bump when the grader's notion of "compiles" or the stub assembly changes
CHUNK = 16  # problems per sandbox call


@dataclass
class AuditRecord:
    id: str
    ok: bool
    reason: str = ""  # "" when ok
    error: str = ""
    note: str = ""  # a problem with the row that was worked around (kept rows too)


@dataclass
class AuditResult:
    kept: list[Problem]
    records: list[AuditRecord]

    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(r.reason or "kept" for r in self.records))


def stub_for(p: Problem) -> tuple[str, list[str]] | None:
    """The stub solution and entry points the tests are compiled against (None: no signature)."""
    if p.stub.strip():
        return assemble_solution(p.stub, p.prompt, p.entry_point)
    if src.parse_signature(p.prompt) is None:  # an entry point alone cannot be stubbed: its type is unknown
        return None
    return assemble_solution('  failwith "audit stub"', p.prompt, p.entry_point)


def _cache_key(p: Problem) -> str:
    # the grader's sources too: a verdict cached before the grader changed is not this grader's
    blob = json.dumps([AUDIT_VERSION, grader_code_digest(), p.prompt, p.tests, p.requires, p.stub, p.entry_point])
    return hashlib.sha256(blob.encode()).hexdigest()


class AuditCache:
    def __init__(self, directory: str | Path):
        directory = Path(directory).expanduser()
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "audit_cache.jsonl"
        # a torn or foreign line (a killed run): that problem is just audited again
        records = read_jsonl(self.path)[0] if self.path.exists() else []
        self.entries: dict[str, dict] = {e["key"]: e for e in records if "key" in e}
        self._lock = threading.Lock()

    def put_many(self, entries: list[dict]) -> None:
        with self._lock:
            for e in entries:
                self.entries[e["key"]] = e
            append(self.path, entries)  # ranks auditing side by side never interleave inside a line


def _classify(err, p: Problem) -> tuple[str, str]:
    msg = err.message
    if "ocamlfind" in msg and "not found" in msg:
        return "missing_package", msg
    if err.kind == "unverifiable":
        return "unverifiable", msg
    if err.file == "solution.ml":
        return "prompt_does_not_compile", msg
    return f"tests_{err.kind}_error", msg


def audit_problems(problems: list[Problem], output_dir: str | Path | None = None, *, cache_dir: str | Path,
                   prompt_tokens: Callable[[Problem], int] | None = None, max_prompt_tokens: int | None = None,
                   workers: int | None = None, grader: OcamlGrader | None = None, verbose: bool = True,
                   sandbox: SandboxConfig | None = None) -> AuditResult:
    """cache_dir: AUDIT_CACHE_DIR as the command resolved it; sandbox: the sandbox's settings for
    a grader of the audit's own (when `grader` is None)."""
    workers = workers or os.cpu_count() or 1
    records: dict[int, AuditRecord] = {}
    seen: set[str] = set()
    to_compile: list[tuple[int, Problem, str, list[str]]] = []
    cache = AuditCache(cache_dir)
    for i, p in enumerate(problems):
        if p.id in seen:
            records[i] = AuditRecord(p.id, False, "duplicate_id", "id already used by an earlier row")
            continue
        seen.add(p.id)
        if not p.tests.strip():
            records[i] = AuditRecord(p.id, False, "empty_tests")
            continue
        if prompt_tokens is not None and max_prompt_tokens:
            n = prompt_tokens(p)
            if n > max_prompt_tokens:
                records[i] = AuditRecord(p.id, False, "prompt_too_long", f"{n} tokens > {max_prompt_tokens}")
                continue
        note = invalid_entry_point_note(p.prompt, p.entry_point)
        stub = stub_for(p)
        if stub is None:
            records[i] = AuditRecord(p.id, False, "no_signature", "no `let name ... =` line in the prompt", note)
            continue
        key = _cache_key(p)
        if key in cache.entries:
            e = cache.entries[key]
            records[i] = AuditRecord(p.id, e["ok"], e["reason"], e["error"], note)
        else:
            to_compile.append((i, p, *stub))

    if to_compile:
        own_grader = grader is None
        grader = grader or OcamlGrader(Sandbox(sandbox), cores=workers)
        by_requires: dict[tuple, list] = collections.defaultdict(list)
        for item in to_compile:
            by_requires[tuple(sorted(item[1].requires))].append(item)
        chunks = [(req, items[k:k + CHUNK]) for req, items in by_requires.items() for k in range(0, len(items), CHUNK)]

        def run_chunk(chunk):
            req, items = chunk
            errors = grader.compile_tests([(stub, p.tests, entries, p.prompt) for _, p, stub, entries in items],
                                          list(req))
            fresh = []
            for (i, p, _, _), err in zip(items, errors):
                reason, msg = _classify(err, p) if err else ("", "")
                records[i] = AuditRecord(p.id, err is None, reason, msg, invalid_entry_point_note(p.prompt, p.entry_point))
                fresh.append({"key": _cache_key(p), "ok": err is None, "reason": reason, "error": msg})
            cache.put_many(fresh)

        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(run_chunk, chunks))
        finally:
            if own_grader:
                grader.close()

    ordered = [records[i] for i in range(len(problems))]
    result = AuditResult([p for p, r in zip(problems, ordered) if r.ok], ordered)
    if output_dir is not None:
        write_records(result, output_dir)
    if verbose:
        print(summary(result))
        for r in ordered:
            if not r.ok and r.reason != "prompt_too_long":
                print(f"  excluded {r.id}: {r.reason}: {r.error[:160]}" + (f" ({r.note})" if r.note else ""))
            elif r.note:
                print(f"  kept {r.id}: {r.note}")
    return result


def write_records(result: AuditResult, output_dir: str | Path) -> None:
    """OUTPUT_DIR/dataset_audit.jsonl: one verdict per problem, in the set's order."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "dataset_audit.jsonl", "w") as f:
        f.write("".join(json.dumps(asdict(r)) + "\n" for r in result.records))


def summary(result: AuditResult) -> str:
    counts = result.counts()
    kept = counts.pop("kept", 0)
    parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
    return f"dataset audit: {kept} kept, {len(result.records) - kept} excluded ({parts})"


def cli(args, cache_dir: str, sandbox: SandboxConfig) -> int:
    """`rewards.py audit`, with the settings its command resolved."""
    problems = load_problems(args.dataset)
    result = audit_problems(problems, output_dir=args.output_dir, workers=args.workers or None,
                            verbose=not args.json, cache_dir=cache_dir, sandbox=sandbox)
    if args.json:
        for r in result.records:
            print(json.dumps({"id": r.id, "ok": r.ok, "reason": r.reason or None, "error": r.error or None,
                              "note": r.note or None}))
    return 0

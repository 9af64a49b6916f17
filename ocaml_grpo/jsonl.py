"""The project's JSONL files, written and read one way.

Writing: whole lines, appended with one write() each, so a crash never tears a line and
processes appending side by side (trainer ranks, an audit beside a trainer) never interleave
inside one. A file whose last line was torn anyway (a full disk) gets that fragment closed before
new lines follow it. Reading: tolerant; a line that is not a JSON object is counted, never fatal.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path


def session_id() -> str:
    """Which training session wrote a record: a resumed run redoes the steps after its checkpoint,
    and analyze.py keeps only the later session's copy of them."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


class JsonlWriter:
    """An open JSONL file, appended to from any thread."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        size = os.path.getsize(path)
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def write_many(self, records: list[dict]) -> None:
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
        if data:
            with self._lock:
                os.write(self._fd, data)

    def close(self) -> None:
        os.close(self._fd)


def append(path: Path, records: list[dict]) -> None:
    """Append records to a JSONL file in one write (for a file written now and then)."""
    writer = JsonlWriter(Path(path))
    try:
        writer.write_many(records)
    finally:
        writer.close()


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """(records, count of lines that are not a JSON object: a half-written one, say)."""
    recs, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(obj, dict):
                    recs.append(obj)
                else:
                    bad += 1
    return recs, bad

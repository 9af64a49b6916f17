"""The one way the project writes and reads JSONL (ocaml_grpo/jsonl.py): whole lines appended, a
torn tail closed before new lines, unreadable lines counted and skipped."""
import json
import threading

from ocaml_grpo.jsonl import JsonlWriter, append, read_jsonl


def test_a_torn_tail_is_closed_and_counted_never_fatal(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\n{"b": 2, "tor')  # a run killed mid-line (a full disk)
    append(path, [{"c": 3}])
    assert read_jsonl(path) == ([{"a": 1}, {"c": 3}], 1)
    assert path.read_text().endswith('{"c": 3}\n')


def test_lines_written_side_by_side_stay_whole(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = JsonlWriter(path)
    big = "x" * 20_000
    threads = [threading.Thread(target=lambda k=k: [writer.write_many([{"k": k, "s": big}] * 3) for _ in range(20)])
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 4 * 20 * 3 and all(json.loads(line)["s"] == big for line in lines)

"""Small file helpers the tests share."""
import json


def write_jsonl(path, rows):
    """`rows` (dicts) as JSON lines in `path` (its folder made if missing); returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path

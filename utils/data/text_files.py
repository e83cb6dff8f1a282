"""Reading the text users hand over (data files, prompts files, standard input) so that what is not UTF-8 text
ends in one `DataError` naming the file and line, before anything tokenizes it:

- UTF-16 and UTF-32 files (what some editors and PowerShell write) are named as such by their byte-order mark; a
  UTF-8 byte-order mark is dropped; other bytes that are not UTF-8 are named by their offset;
- a line longer than MAX_LINE_BYTES (a file that is not line-based text, a 1 GB line) is refused as soon as that
  much has been read, never read whole;
- a named pipe or device is refused before it is opened (reading one could wait or never end);
- a lone surrogate (a JSON `\\ud800` escape of half a UTF-16 pair) is no text any tokenizer takes: `check_text`;
- a file whose name ends in `.gz` (HH-RLHF's `train.jsonl.gz`) is read through gzip (`open_bytes`).
"""
import gzip
import json
import sys
import zlib
from pathlib import Path

from utils.runtime.errors import DataError

MAX_LINE_BYTES = 64 << 20
"""The longest line read (64 MiB): a long-context sample of a million tokens is a few MiB."""
BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
        (b"\xfe\xff", "UTF-16"))
UTF8_BOM = b"\xef\xbb\xbf"


def encoding_problem(start, what):
    """The error for text whose first bytes are `start` if they mark UTF-16 or UTF-32 (None otherwise)."""
    for mark, name in BOMS:
        if start.startswith(mark):
            return DataError(f"{what}: {name} text (it starts with a {name} byte-order mark); save it as UTF-8")
    return None


DEAD_LINK = "a link to nothing (its target is missing, or the link loops)"
"""What a path is that links to no file: regular_file's message, and a data path's."""


def regular_file(path, what=None):
    """`path` as a Path if it is a regular file; DataError naming it otherwise (missing, a folder, a pipe...)."""
    path = Path(path)
    what = what or str(path)
    if not path.exists():
        if path.is_symlink():
            raise DataError(f"{what}: {DEAD_LINK}")
        raise DataError(f"{what}: file not found")
    if path.is_dir():
        raise DataError(f"{what} is a folder, not a file")
    if not path.is_file():
        raise DataError(f"{what}: not a regular file (a named pipe or device cannot be read as data)")
    return path


GZIP_SUFFIX = ".gz"


def open_bytes(path):
    """The bytes of the file `path` as a binary stream: decompressed where its name ends in GZIP_SUFFIX."""
    path = Path(path)
    return gzip.open(path, "rb") if path.suffix.lower() == GZIP_SUFFIX else open(path, "rb")


def data_suffix(path):
    """A data file's format suffix, lower case: `.jsonl` for train.jsonl and train.jsonl.gz."""
    path = Path(path)
    return Path(path.stem).suffix.lower() if path.suffix.lower() == GZIP_SUFFIX else path.suffix.lower()


UNREADABLE = (OSError, EOFError, zlib.error)
"""What reading a damaged or truncated file raises (gzip's BadGzipFile is an OSError)."""


def read_lines(path, what=None):
    """(line number from 1, line without its end) for each line of the UTF-8 text file `path` (lines end at
    "\\n", a "\\r" before it dropped), read a line at a time; DataError naming `what` (default the path) and the
    line for what is not UTF-8 text or a line over MAX_LINE_BYTES."""
    path = regular_file(path, what)
    what = what or str(path)
    try:
        with open_bytes(path) as f:
            yield from decoded_lines(f, what)
    except UNREADABLE as err:
        raise DataError(f"{what}: cannot be read ({getattr(err, 'strerror', None) or err})") from None


def decoded_lines(stream, what, where="line"):
    """The lines of a binary `stream` as in `read_lines`; errors start with `what` and name the `where`."""
    offset = 0
    for number in range(1, 1 << 62):
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if number == 1:
            problem = encoding_problem(line[:4], what)
            if problem:
                raise problem
            if line.startswith(UTF8_BOM):
                line, offset = line[len(UTF8_BOM):], len(UTF8_BOM)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise DataError(f"{what}: {where} {number} is longer than {MAX_LINE_BYTES >> 20} MiB; line-based text "
                            "is expected")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{what}: not UTF-8 text ({where} {number}, byte {offset + err.start})") from None
        offset += len(line)
        yield number, text[:-1].rstrip("\r") if text.endswith("\n") else text.rstrip("\r")


def read_text(path, what=None):
    """The whole UTF-8 text of the file `path` (a UTF-8 byte-order mark dropped); DataError naming `what` (default
    the path) for UTF-16/32 or other bytes that are not UTF-8."""
    path = regular_file(path, what)
    what = what or str(path)
    try:
        with open_bytes(path) as f:
            data = f.read()
    except UNREADABLE as err:
        raise DataError(f"{what}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    problem = encoding_problem(data[:4], what)
    if problem:
        raise problem
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"{what}: not UTF-8 text (byte {err.start})") from None


def lone_surrogate(text):
    """The index of the first lone surrogate in `text` (None if there is none)."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as err:
        return err.start


def check_text(text, where):
    """Refuse (DataError starting with `where`, e.g. "<file>: row 3 (line 4): field 'chosen'") a string holding a
    lone surrogate: a `\\ud800` JSON escape, or bytes that were not UTF-8 read with surrogateescape."""
    index = lone_surrogate(text)
    if index is not None:
        raise DataError(f"{where} is not valid Unicode text: a lone surrogate \\u{ord(text[index]):04x} at "
                        f"character {index} (half of a UTF-16 pair, or bytes that are not UTF-8)")
    return text


def json_value(text, what):
    """json.loads(text) for text the user handed over. Malformed JSON raises json.JSONDecodeError, for the caller to
    say where; JSON nested deeper than Python's parser goes, and a number of more digits than Python converts
    (sys.get_int_max_str_digits: 4,300), are a DataError naming `what`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise DataError(f"{what}: JSON nested too deeply to read") from None
    except ValueError:  # int("1" * 5000): Python's limit on converting long digit strings
        raise DataError(f"{what}: a number of more than {sys.get_int_max_str_digits()} digits") from None


def json_records(path, what=None):
    """(value, where) for each record of a JSON array or JSON-lines file, read as the functions above read text
    (UTF-8 only, a JSON-lines file a line at a time, each line at most MAX_LINE_BYTES); `where` is `row i` in an
    array, `row i (line n)` in JSON lines; DataError naming `what` (default the path) and the line otherwise."""
    path = regular_file(path, what)
    what = what or str(path)
    try:
        with open_bytes(path) as f:
            start = f.read(4096)
    except UNREADABLE as err:
        raise DataError(f"{what}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    start = start.lstrip(UTF8_BOM + b" \t\r\n")  # after a byte-order mark and white space
    if start.startswith(b"["):  # a JSON array, which may be one long line
        return _json_array(read_text(path, what), what)
    records = []
    # JSON lines end at "\n" only (read_lines): str.splitlines would also split at U+2028, U+0085... that JSON
    # strings may hold.
    for number, line in read_lines(path, what):
        if not line.strip():
            continue
        try:
            value = json_value(line, f"{what}: line {number}")
        except json.JSONDecodeError as exc:
            if not records and start.startswith(b"{") and _one_object(path, what):
                raise DataError(f"{what}: one JSON object across several lines; expected a JSON array of rows "
                                "([{...}, {...}]) or JSON lines (one row a line)") from None
            raise DataError(f"{what}: malformed JSON on line {number} (column {exc.colno}): {exc.msg}") from None
        records.append((value, f"row {len(records)} (line {number})"))
    return records


def _one_object(path, what):
    """Whether the whole file is one JSON object (a pretty-printed `{"data": [...]}`, say)."""
    try:
        return isinstance(json.loads(read_text(path, what)), dict)
    except (DataError, ValueError, RecursionError):
        return False


def _json_array(text, what):
    """(value, where) for each record of a JSON array's text."""
    try:
        data = json_value(text, what)
    except json.JSONDecodeError as exc:
        raise DataError(f"{what}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, list):  # e.g. "[1] 2" cannot get here, but be safe
        raise DataError(f"{what}: expected a JSON array of objects or JSON lines")
    return [(value, f"row {i}") for i, value in enumerate(data)]

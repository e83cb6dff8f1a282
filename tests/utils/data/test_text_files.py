"""utils/data/text_files.py: the text users hand over read as UTF-8, a line at a time, each odd encoding, an
overlong line, a pipe or a lone surrogate refused in one DataError naming the file and line."""
import io
import os

import pytest

from utils.data import text_files
from utils.data.text_files import check_text, decoded_lines, read_lines, read_text
from utils.runtime.errors import DataError


def test_lines_end_at_newline_with_crlf_and_a_utf8_byte_order_mark_dropped(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("\ufeffone\r\ntwo\u2028still two\nthree".encode("utf-8"))
    assert list(read_lines(path)) == [(1, "one"), (2, "two\u2028still two"), (3, "three")]
    assert read_text(path) == "one\r\ntwo\u2028still two\nthree"


@pytest.mark.parametrize("encoding, name", [("utf-16", "UTF-16"), ("utf-16-be", None), ("utf-32", "UTF-32")])
def test_utf16_and_utf32_are_named_by_their_byte_order_mark(tmp_path, encoding, name):
    path = tmp_path / "a.jsonl"
    data = '{"prompt": "x"}\n'.encode(encoding)
    path.write_bytes(data if name else b"\xfe\xff" + data)  # utf-16-be writes no mark: give it one
    message = f"{path}: {name or 'UTF-16'} text (it starts with a {name or 'UTF-16'} byte-order mark); save it as UTF-8"
    for read in (lambda: list(read_lines(path)), lambda: read_text(path)):
        with pytest.raises(DataError) as error:
            read()
        assert str(error.value) == message


def test_bytes_that_are_not_utf8_are_named_by_line_and_offset(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"fine\ncaf\xe9\n")
    with pytest.raises(DataError, match=r"a\.txt: not UTF-8 text \(line 2, byte 8\)$"):
        list(read_lines(path))


def test_a_line_over_the_limit_is_refused_when_that_much_is_read(monkeypatch):
    monkeypatch.setattr(text_files, "MAX_LINE_BYTES", 16)
    stream = io.BytesIO(b"short\n" + b"x" * 100 + b"\nnever read\n")
    lines = decoded_lines(stream, "stdin", "line")
    assert next(lines) == (1, "short")
    with pytest.raises(DataError, match="stdin: line 2 is longer than 0 MiB"):
        next(lines)
    assert stream.tell() == 6 + 17  # no more of it read than the limit and one byte
    assert list(decoded_lines(io.BytesIO(b"x" * 16 + b"\n"), "s")) == [(1, "x" * 16)]  # exactly the limit: kept


def test_a_named_pipe_a_folder_and_a_missing_file_are_refused_before_opening(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(DataError, match="pipe: not a regular file"):
        list(read_lines(tmp_path / "pipe"))  # opening it would wait for a writer forever
    with pytest.raises(DataError, match="is a folder, not a file"):
        read_text(tmp_path)
    with pytest.raises(DataError, match="nope: file not found"):
        read_text(tmp_path / "nope")


def test_a_lone_surrogate_is_no_text():
    assert check_text("caf\u00e9 \U0001f600", "x") == "caf\u00e9 \U0001f600"
    with pytest.raises(DataError, match=r"^row 3: field 'chosen' is not valid Unicode text: a lone surrogate \\ud800 "
                                        r"at character 2 "):
        check_text("ab\ud800c", "row 3: field 'chosen'")

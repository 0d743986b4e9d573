"""How an error is written for a reader: an exception on one line, a run's error as an
excerpt (its last line), and a stored error bounded to ``ERROR_MAX_CHARS``. Django-free."""

from __future__ import annotations

__all__ = ["ERROR_EXCERPT_CHARS", "bounded", "error_excerpt", "one_line"]

#: Characters of a run's error kept in a reason or a list column.
ERROR_EXCERPT_CHARS = 160


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def error_excerpt(error: str, limit: int = ERROR_EXCERPT_CHARS) -> str:
    """The last non-empty line of a traceback (the exception), on one line, bounded."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    text = lines[-1] if lines else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def storable(text: str) -> str:
    """``text`` as any database stores it, for a handler's exception message: a NUL (which
    PostgreSQL refuses in text) written ``\\x00``, a lone surrogate (no encoding takes it) ``?``."""
    return text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")


def bounded(text: str, limit: int) -> str:
    """``text`` cut to its last ``limit`` characters, marked with a leading ``…`` when cut:
    a traceback's end says what failed."""
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if limit > 1 else "…"

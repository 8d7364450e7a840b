"""Row filters given as SQL text: a backfill's `--where`, a table's `where` setting.

A filter is pasted into SQL by design (Debezium and PostgreSQL's publications take it
as text), so its shape is checked before anything runs it.
"""

from __future__ import annotations

__all__ = ["filter_problem"]


def filter_problem(where: str) -> str | None:
    """What makes `where` more than one expression, or None.

    A filter is pasted into SQL by design (Debezium takes it as text), so its shape is
    checked first: no `;`, no comment, and no `)` that closes a parenthesis it did not
    open (which would end the WHERE clause it is put in), outside quoted text.
    """
    depth, i, n = 0, 0, len(where)
    while i < n:
        ch = where[i]
        if ch == "'":
            escapes = i > 0 and where[i - 1] in "eE" and (i < 2 or not where[i - 2].isalnum())
            i = _skip_quoted(where, i, "'", backslash=escapes)
        elif ch == '"':
            i = _skip_quoted(where, i, '"', backslash=False)
        elif ch.isalpha() or ch == "_" or ord(ch) > 127:
            # an identifier or keyword, whole: a `$` inside one (`a$q$`) quotes nothing
            i += 1
            while i < n and (where[i].isalnum() or where[i] in "_$" or ord(where[i]) > 127):
                i += 1
        elif ch == "$" and (tag := _dollar_tag(where, i)) is not None:
            end = where.find(tag, i + len(tag))
            i = n if end < 0 else end + len(tag)
        elif ch == ";":
            return "it holds a `;` (one expression only, no statements)"
        elif where.startswith(("--", "/*"), i):
            return "it holds a comment (`--` or `/*`)"
        elif ch == "(":
            depth += 1
            i += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return "it closes a parenthesis it did not open"
            i += 1
        else:
            i += 1
    return "its parentheses do not balance" if depth else None


def _skip_quoted(text: str, start: int, quote: str, backslash: bool) -> int:
    """The index after the quoted text starting at `start` (its end if unterminated)."""
    i = start + 1
    while i < len(text):
        if backslash and text[i] == "\\":
            i += 2
        elif text[i] == quote:
            if text.startswith(quote * 2, i):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return len(text)


def _dollar_tag(text: str, start: int) -> str | None:
    """The dollar-quote opening at `start` (`$$` or `$tag$`), or None (e.g. `$1`)."""
    end = text.find("$", start + 1)
    if end < 0:
        return None
    tag = text[start + 1 : end]
    if tag == "" or (
        (tag[0].isalpha() or tag[0] == "_") and all(c.isalnum() or c == "_" for c in tag)
    ):
        return text[start : end + 1]
    return None

"""What the platform can tell about a pipeline's Spark SQL without starting Spark.

DAG parsing, ``status`` and the planners load pipelines without a JVM, so the
checks here are textual: the DDL types of the schema (normalized to Spark's own
names) and the functions an expression calls. Whether an expression resolves and
what type it yields is Spark's to say (``jobs/streaming/judging.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Spark's names for atomic types (``DataType.simpleString``) and their DDL aliases.
ATOMIC = {
    "string",
    "bigint",
    "int",
    "smallint",
    "tinyint",
    "double",
    "float",
    "boolean",
    "date",
    "timestamp",
    "timestamp_ntz",
    "binary",
}
ALIASES = {
    "long": "bigint",
    "integer": "int",
    "short": "smallint",
    "byte": "tinyint",
    "real": "float",
    "bool": "boolean",
    "dec": "decimal",
    "numeric": "decimal",
    "timestamp_ltz": "timestamp",
}
INTEGRAL = {"bigint", "int", "smallint", "tinyint"}
FRACTIONAL = {"double", "float"}
DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")

# Functions an expression may not call. Some reach outside SQL; the others give
# another answer on a replay, which would break exactly-once (a batch recomputed
# after a crash, a backfill) or cannot be evaluated per record.
OUTSIDE_SQL = {"reflect", "java_method", "try_reflect"}
NOT_REPLAYABLE = {
    "rand",
    "randn",
    "random",
    "randstr",
    "uniform",
    "uuid",
    "shuffle",
    "monotonically_increasing_id",
    "spark_partition_id",
    "input_file_name",
    "input_file_block_start",
    "input_file_block_length",
    "current_date",
    "curdate",
    "current_time",
    "current_timestamp",
    "now",
    "localtimestamp",
    "current_timezone",
    "current_user",
    "session_user",
    "user",
    "current_database",
    "current_schema",
    "current_catalog",
    "version",
    "aes_encrypt",  # a random initialization vector unless one is given
}
# Strings Spark reads as the current date or time in a typed literal or a cast.
SPECIAL_TIMES = {"now", "today", "yesterday", "tomorrow"}
# Written without parentheses, these are function calls too.
BARE_CALLS = {
    "current_date",
    "current_time",
    "current_timestamp",
    "localtimestamp",
    "current_user",
    "session_user",
}
# Words followed by "(" that are syntax, not function calls.
SYNTAX = {
    "cast",
    "try_cast",
    "in",
    "and",
    "or",
    "not",
    "when",
    "then",
    "else",
    "case",
    "end",
    "is",
    "like",
    "ilike",
    "rlike",
    "regexp",
    "between",
    "interval",
    "as",
    "distinct",
    "null",
    "div",
    "escape",
}
TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>--(?:\\\n|[^\r\n])*|/\*.*?\*/)  # Spark's: a backslash continues it
    | (?P<open_comment>/\*)
    | (?P<raw>[rR]'[^']*'|[rR]"[^"]*")
    | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
    | (?P<quoted>`(?:[^`]|``)+`)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[A-Za-z]*|\.\d+(?:[eE][+-]?\d+)?[A-Za-z]*)
    | (?P<symbol>\|>|->|<=>|<=|>=|<>|!=|==|\|\||::|[-+*/%&|^~!<>=(),.\[\]:{}?;])
    """,
    re.VERBOSE | re.DOTALL,
)


class SqlTextError(ValueError):
    """Why a type or an expression is refused; the caller names the file and field."""


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


def tokens(text: str) -> list[Token]:
    """The expression's tokens without spaces and comments."""
    found: list[Token] = []
    position = 0
    while position < len(text):
        match = TOKEN.match(text, position)
        if match is None:
            raise SqlTextError(f"cannot read {text[position : position + 20]!r}")
        position = match.end()
        kind = match.lastgroup or ""
        if kind == "open_comment":
            raise SqlTextError("has a comment that does not end (/* without */)")
        if kind not in ("space", "comment"):
            found.append(Token(kind, match.group()))
    return found


def check_expression(text: str) -> list[str]:
    """The functions ``text`` calls (lower case), after refusing what may not run:
    functions outside SQL or without a replayable answer, subqueries, statements."""
    if not text.strip():
        raise SqlTextError("is empty")
    found = tokens(text)
    for literal in _literals(found):
        if literal.strip().lower() in SPECIAL_TIMES:
            raise SqlTextError(
                f"reads {literal!r} as a date or time: it means the current one, which a "
                "replay or a backfill would not reproduce"
            )
    calls: list[str] = []
    for i, token in enumerate(found):
        if token.kind == "symbol" and token.text in (";", "|>"):
            raise SqlTextError(f"must be one expression (no {token.text!r})")
        if token.kind not in ("word", "quoted"):
            continue
        name = (
            token.text[1:-1].replace("``", "`").lower()
            if token.kind == "quoted"
            else token.text.lower()
        )
        follows = found[i + 1].text if i + 1 < len(found) else ""
        after_dot = i > 0 and found[i - 1].text == "."
        if token.kind == "word" and name == "select" and not after_dot:
            raise SqlTextError("may not contain a subquery (SELECT): it would read other tables")
        # "a.b(" is a qualified function name (system.builtin.f), never a field.
        is_call = follows == "("
        if is_call and token.kind == "word" and name in SYNTAX:
            continue
        if is_call or (token.kind == "word" and name in BARE_CALLS and not after_dot):
            if name in OUTSIDE_SQL:
                raise SqlTextError(f"calls {name}(), which reaches outside SQL")
            if name in NOT_REPLAYABLE:
                raise SqlTextError(
                    f"calls {name}(), which gives another answer when a batch is recomputed "
                    "(a replay or a backfill would not reproduce the result)"
                )
            no_arguments = is_call and i + 2 < len(found) and found[i + 2].text == ")"
            if name == "unix_timestamp" and no_arguments:
                raise SqlTextError(
                    "calls unix_timestamp() without an argument, which is the current time"
                )
            if is_call and name not in calls:
                calls.append(name)
    return calls


def _unquoted(token: Token) -> str:
    return token.text[2:-1] if token.kind == "raw" else token.text[1:-1]


ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", re.DOTALL)


def _string_value(token: Token) -> str:
    """A string literal's value as Spark's parser reads it (escapes undone)."""
    text = _unquoted(token)
    if token.kind == "raw":
        return text
    quote = token.text[0]
    text = text.replace(quote * 2, quote)

    def undo(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] in "uU" and len(code) > 1:
            return chr(int(code[1:], 16))
        if len(code) == 3 and code.isdigit():
            return chr(int(code, 8))
        return {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "0": "\0"}.get(code, code)

    return ESCAPE.sub(undo, text)


def _literals(found: list[Token]) -> list[str]:
    """The string literals' values as Spark's parser reads them: escapes undone and
    adjacent literals joined (``'to' 'day'`` is one literal, ``'today'``)."""
    values: list[str] = []
    run: list[str] = []
    for token in [*found, Token("end", "")]:
        if token.kind in ("string", "raw"):
            run.append(_string_value(token))
        elif run:
            values.append("".join(run))
            run = []
    return values


def mentions(text: str, name: str) -> bool:
    """Whether ``text`` names ``name`` as an identifier or spells it as a string
    (adjacent literals joined, as Spark joins them): the JVM-free answer to "does
    the pipeline read X"; Spark's analysed plan gives the exact one."""
    wanted = name.lower()
    run: list[str] = []
    for token in [*tokens(text), Token("end", "")]:
        if token.kind in ("string", "raw"):
            run.append(_string_value(token))
            continue
        if run and "".join(run).lower() == wanted:
            return True
        run = []
        if token.kind == "word" and token.text.lower() == wanted:
            return True
        if token.kind == "quoted" and token.text[1:-1].replace("``", "`").lower() == wanted:
            return True
    return False


def parse_type(text: str) -> str:
    """A Spark DDL type -> its normalized form: Spark's atomic names, struct field
    names in backquotes (``struct<`id`:string>``). Raises ``SqlTextError``."""
    reader = _TypeReader(text)
    result = reader.read_type()
    reader.expect_end()
    return result


def is_atomic(kind: str) -> bool:
    return kind in ATOMIC or bool(DECIMAL.fullmatch(kind))


def is_numeric(kind: str) -> bool:
    return kind in INTEGRAL or kind in FRACTIONAL or bool(DECIMAL.fullmatch(kind))


def decimal_scale(kind: str) -> tuple[int, int] | None:
    match = DECIMAL.fullmatch(kind)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


class _TypeReader:
    PART = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts: list[str] = []
        position = 0
        while position < len(text):
            match = self.PART.match(text, position)
            if match is None:
                if text[position:].strip():
                    raise SqlTextError(f"cannot read {text[position:].strip()[:20]!r}")
                break
            self.parts.append(match.group(1))
            position = match.end()
        self.at = 0

    def peek(self) -> str:
        return self.parts[self.at] if self.at < len(self.parts) else ""

    def take(self) -> str:
        part = self.peek()
        if not part:
            raise SqlTextError(f"{self.text!r} ends too early")
        self.at += 1
        return part

    def expect(self, wanted: str) -> None:
        got = self.take()
        if got != wanted:
            raise SqlTextError(f"expected {wanted!r}, got {got!r} in {self.text!r}")

    def expect_end(self) -> None:
        if self.peek():
            raise SqlTextError(f"unexpected {self.peek()!r} in {self.text!r}")

    def read_type(self) -> str:
        word = self.take().lower()
        word = ALIASES.get(word, word)
        if word == "array":
            self.expect("<")
            element = self.read_type()
            self.expect(">")
            return f"array<{element}>"
        if word == "map":
            self.expect("<")
            key = self.read_type()
            if key != "string":
                raise SqlTextError(
                    f"a JSON object's keys are strings: use map<string, ...>, got {key}"
                )
            self.expect(",")
            value = self.read_type()
            self.expect(">")
            return f"map<string,{value}>"
        if word == "struct":
            return self.read_struct()
        if word == "decimal":
            precision, scale = 10, 0
            if self.peek() == "(":
                self.take()
                precision = self.number()
                if self.peek() == ",":
                    self.take()
                    scale = self.number()
                self.expect(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise SqlTextError(
                    f"decimal({precision},{scale}): needs 1 <= scale <= precision <= 38"
                )
            return f"decimal({precision},{scale})"
        if word not in ATOMIC:
            known = ", ".join(sorted(ATOMIC | {"decimal(p,s)", "array<...>", "map<string,...>"}))
            raise SqlTextError(f"unknown type {word!r} (known: {known}, struct<...>)")
        return word

    def read_struct(self) -> str:
        self.expect("<")
        fields: list[str] = []
        seen: set[str] = set()
        while self.peek() != ">":
            if fields:
                self.expect(",")
            raw = self.take()
            if raw in "<>(),:":
                raise SqlTextError(f"expected a field name, got {raw!r} in {self.text!r}")
            name = raw[1:-1].replace("``", "`") if raw.startswith("`") else raw
            if name.lower() in seen:
                raise SqlTextError(f"struct field {name!r} appears twice (names ignore case)")
            seen.add(name.lower())
            if self.peek() == ":":
                self.take()
            fields.append(f"`{name.replace('`', '``')}`:{self.read_type()}")
        self.take()
        if not fields:
            raise SqlTextError("a struct needs at least one field")
        return f"struct<{','.join(fields)}>"

    def number(self) -> int:
        part = self.take()
        if not part.isdigit():
            raise SqlTextError(f"expected a number, got {part!r} in {self.text!r}")
        return int(part)

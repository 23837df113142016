#!/usr/bin/env python3
"""Fails when a function in server/ has more than MAX_BODY_LINES lines of code.

Scans server/**/*.cc except *_test.cc (and *.h, whose inline bodies count too). A function's
length is the number of lines inside its braces that hold code: blank lines and lines with only
comments do not count. The scan removes comments, string and character literals (raw strings
too) and preprocessor lines, then walks braces: namespace, extern "C", class, struct and union
bodies are entered; a brace after a parameter list (with qualifiers, a trailing return type or a
constructor's initializer list) opens a function, which is measured whole (lambdas and local
classes inside it count toward it); any other brace (initializers, enums) is skipped.

Allowed offenders are listed in tests/function_length_allow.txt as `path:function` lines.
Usage: function_length.py [--max N] [--list]   (--list prints every function over N, allowed
or not). Exit status 1 when an offender is not allowed; an allow-list entry that no longer
offends is reported so the list can shrink.
"""
import argparse
import pathlib
import re
import sys

MAX_BODY_LINES = 60
ROOT = pathlib.Path(__file__).resolve().parent.parent
ALLOW_FILE = ROOT / "tests" / "function_length_allow.txt"


def strip_code(text):
    """Blanks comments, literals and preprocessor lines, keeping every newline in place."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":  # preprocessor line, with continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        m = re.match(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(', text[i:i + 24])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = ")" + m.group(1) + '"'
            end = text.find(close, i + m.end())
            end = n if end < 0 else end + len(close)
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + '"')
            i = end
            continue
        if c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        out.append(c)
        if c == "\n":
            line_start = True
        i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


FUNCTION_TAIL = re.compile(
    r"\)\s*(?:const|override|final|noexcept(?:\s*\([^)]*\))?|mutable|&&?|\s)*"
    r"(?:->\s*[\w:<>,\s*&]+)?\s*$")
INIT_LIST = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:)")


def function_name(head):
    """The qualified name before the head's first top-level parameter list."""
    depth = 0
    for k, ch in enumerate(head):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth <= 0:
            m = re.search(r"(~?[\w:]*\w|operator\s*\S+)\s*$", head[:k])
            return m.group(1) if m else "?"
    return "?"


def functions(code):
    """Yields (name, first_line, body_code_lines) for each function defined in `code`."""
    def line_of(pos):
        return code.count("\n", 0, pos) + 1

    def scan(start, end, scope):
        head_start = start
        k = start
        while k < end:
            ch = code[k]
            if ch in ";}":
                head_start = k + 1
            elif ch == "{":
                head = code[head_start:k]
                flat = " ".join(head.split())
                close = matching_brace(code, k)
                if re.search(r"\b(namespace|extern)\b", flat) or re.search(
                        r"\b(class|struct|union)\b[^()]*$", flat) and "enum" not in flat:
                    yield from scan(k + 1, close, scope)
                elif INIT_LIST.search(flat) and re.search(r"[\w>]\s*$", head):
                    k = close  # a member's brace initializer inside an initializer list
                    k += 1
                    continue
                elif FUNCTION_TAIL.search(flat) or INIT_LIST.search(flat):
                    body = code[k + 1:close]
                    lines = sum(1 for ln in body.split("\n")[1:-1] if ln.strip()) if (
                        "\n" in body) else 0
                    yield function_name(flat), line_of(k), lines
                head_start = close + 1
                k = close
            k += 1

    yield from scan(0, len(code), "")


def offenders(max_lines):
    for path in sorted((ROOT / "server").rglob("*")):
        if path.suffix not in (".cc", ".h") or path.name.endswith("_test.cc"):
            continue
        code = strip_code(path.read_text(errors="replace"))
        rel = path.relative_to(ROOT).as_posix()
        for name, line, lines in functions(code):
            if lines > max_lines:
                yield rel, name, line, lines


def read_allow():
    allowed = set()
    if ALLOW_FILE.exists():
        for raw in ALLOW_FILE.read_text().splitlines():
            entry = raw.split("#", 1)[0].strip()
            if entry:
                allowed.add(entry)
    return allowed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=MAX_BODY_LINES)
    parser.add_argument("--list", action="store_true", help="print every offender")
    args = parser.parse_args()
    allowed = read_allow()
    found = list(offenders(args.max))
    bad = [f for f in found if f"{f[0]}:{f[1]}" not in allowed]
    offending = {f"{f[0]}:{f[1]}" for f in found}
    for rel, name, line, lines in found if args.list else bad:
        tag = "allowed" if f"{rel}:{name}" in allowed else "TOO LONG"
        print(f"{rel}:{line}: {name}: {lines} code lines (max {args.max}) [{tag}]")
    for entry in sorted(allowed - offending):
        print(f"note: {entry} is within {args.max} lines now: remove it from {ALLOW_FILE.name}")
    if bad:
        print(f"function length: {len(bad)} function(s) in server/ longer than {args.max} code "
              f"lines: split them (helpers named for what they do), or, only for a file another "
              f"change is rewriting, list them in {ALLOW_FILE.relative_to(ROOT)} with a TODO")
        return 1
    print(f"function length: OK (no function in server/ over {args.max} code lines outside "
          f"{len(allowed)} allowed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The journal's reference, docs/journal.md, made from its schema, shim/core/events.def.

  journal_doc.py            rewrite the generated part of docs/journal.md
  journal_doc.py --check    exit 1 (and say where) when it is not what events.def makes

The page's prose is written by hand; the part between the two markers below is
this program's: the events with their line budgets (each event's row) and
every event's fields. parse() is also what the schema test reads
events.def with.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVENTS_DEF = os.path.join(ROOT, "shim", "core", "events.def")
JOURNAL_MD = os.path.join(ROOT, "docs", "journal.md")
BEGIN = "<!-- made from shim/core/events.def by tools/build-aux/journal_doc.py: edit those, not this -->"
END = "<!-- end of what journal_doc.py makes -->"


class SchemaError(Exception):
    pass


def split_args(text, where):
    """The arguments of one macro call: C strings kept whole, commas inside
    parentheses (list(str)) not splitting."""
    args, cur, depth, i = [], "", 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= len(text):
                raise SchemaError(f"{where}: a string is not closed")
            cur += text[i:j + 1]
            i = j + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    args.append(cur.strip())
    return args


def c_string(arg, where):
    if not (len(arg) >= 2 and arg[0] == '"' and arg[-1] == '"'):
        raise SchemaError(f"{where}: expected a string, got {arg}")
    return re.sub(r'\\(.)', r"\1", arg[1:-1])


def parse(path=EVENTS_DEF):
    """events.def as {"events": [...], "parts": [...], "fields": [...]}, in
    its order. Raises SchemaError naming the line of the first problem."""
    events, parts, fields = [], [], []
    with open(path) as f:
        text = f.read()
    # Rows are whole lines outside the leading comment.
    body_start = text.index("*/") + 2 if text.lstrip().startswith("/*") else 0
    lineno = text[:body_start].count("\n") + 1
    for line in text[body_start:].splitlines():
        where = f"{path}:{lineno}"
        lineno += 1
        line = line.strip()
        if not line or line.startswith("//"):
            continue
        m = re.fullmatch(r"(EVENT|PART|FIELD)\((.*)\)", line)
        if not m:
            raise SchemaError(f"{where}: not a row: {line}")
        kind, args = m.group(1), split_args(m.group(2), where)
        want = {"EVENT": 4, "PART": 2, "FIELD": 7}[kind]
        if len(args) != want:
            raise SchemaError(f"{where}: {kind} takes {want} arguments, has {len(args)}")
        if kind == "EVENT":
            if args[1] != "ALWAYS" and not re.fullmatch(r"LIMIT\(\d+,\s*[1-9]\d*\)", args[1]):
                raise SchemaError(f"{where}: budget is ALWAYS or LIMIT(burst, per_min), "
                                  f"not {args[1]}")
            events.append({"ev": args[0], "budget": args[1], "fields": args[2],
                           "meaning": c_string(args[3], where), "line": where})
        elif kind == "PART":
            parts.append({"part": args[0], "meaning": c_string(args[1], where), "line": where})
        else:
            fields.append({"of": args[0], "id": args[1], "key": args[2],
                           "parent": c_string(args[3], where), "type": args[4],
                           "use": args[5], "meaning": c_string(args[6], where), "line": where})
            if args[5] not in ("R", "-"):
                raise SchemaError(f"{where}: use is R or -, not {args[5]}")
    owners = {e["ev"] for e in events} | {p["part"] for p in parts}
    for e in events:
        if e["fields"] not in owners:
            raise SchemaError(f"{e['line']}: fields {e['fields']} is no event or part")
    seen = set()
    for fl in fields:
        if fl["of"] not in owners:
            raise SchemaError(f"{fl['line']}: {fl['of']} is no event or part")
        if (fl["of"], fl["id"]) in seen:
            raise SchemaError(f"{fl['line']}: {fl['of']}.{fl['id']} twice")
        seen.add((fl["of"], fl["id"]))
    return {"events": events, "parts": parts, "fields": fields}


def budgets(path=EVENTS_DEF):
    """The line budgets of events.def: event -> (burst, lines a minute), for
    the events that are limited."""
    out = {}
    for e in parse(path)["events"]:
        m = re.fullmatch(r"LIMIT\((\d+),\s*(\d+)\)", e["budget"])
        if m:
            out[e["ev"]] = (int(m.group(1)), int(m.group(2)))
    return out


def budget_text(ev, table):
    if ev not in table:
        return "never limited"
    burst, per_min = table[ev]
    if per_min % 60 == 0:
        n = per_min // 60
        rate = f"{'one' if n == 1 else n} a second"
    else:
        rate = f"one every {60 // per_min} s" if 60 % per_min == 0 else f"{per_min} a minute"
    return f"{burst} at once, then {rate}"


def md(text):
    return text.replace("|", "\\|")


def render(schema, table):
    out = [BEGIN, "", "## Events", "",
           "| `ev` | what it says | lines written |", "|---|---|---|"]
    for e in schema["events"]:
        out.append(f"| [`{e['ev']}`](#{e['fields']}) | {md(e['meaning'])} | "
                   f"{budget_text(e['ev'], table)} |")
    out += ["", "## Fields", "",
            "Every line also has `t` (seconds since the shim started; for a `sample`, the "
            "moment the value moved) and `ev`. *Report*: whether `gpuguard-report` reads "
            "the field (a field it does not read is kept for other readers).", ""]
    sections = []
    for p in schema["parts"]:
        users = [e["ev"] for e in schema["events"] if e["fields"] == p["part"]]
        sections.append((p["part"], p["meaning"], users))
    for e in schema["events"]:
        if e["fields"] == e["ev"]:
            sections.append((e["ev"], e["meaning"], [e["ev"]]))
    for name, meaning, users in sections:
        title = (" / ".join(f"`{u}`" for u in users) if users else f"{name}")
        out += [f"### {name}", "", f"{md(meaning[0].upper() + meaning[1:])}."
                + (f" Lines: {title}." if users and users != [name] else ""), "",
                "| key | in | type | report | meaning |", "|---|---|---|---|---|"]
        for fl in schema["fields"]:
            if fl["of"] != name:
                continue
            where = f"`{fl['parent']}`" if fl["parent"] else ""
            out.append(f"| `{fl['key']}` | {where} | {md(fl['type'])} | "
                       f"{'yes' if fl['use'] == 'R' else ''} | {md(fl['meaning'])} |")
        out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


def rewrite(page, generated):
    if BEGIN not in page or END not in page:
        raise SchemaError(f"{JOURNAL_MD}: the markers of the generated part are missing")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    # the generated part ends with END and a newline; what followed END stays
    return head + generated + (tail[1:] if tail.startswith("\n") else tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="say whether docs/journal.md is current")
    a = ap.parse_args()
    try:
        generated = render(parse(), budgets())
        with open(JOURNAL_MD) as f:
            page = f.read()
        new = rewrite(page, generated)
    except (SchemaError, OSError) as e:
        print(f"journal_doc: {e}", file=sys.stderr)
        return 1
    if a.check:
        if new != page:
            print(f"journal_doc: {os.path.relpath(JOURNAL_MD, ROOT)} is not what shim/core/events.def "
                  "makes: run tools/build-aux/journal_doc.py", file=sys.stderr)
            return 1
        return 0
    if new != page:
        with open(JOURNAL_MD, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Goal: find where kvtwin's checks are blind, without guessing where to look. The hand-written
catalogue (tests/mutants/) holds bugs someone thought of; this writes bugs nobody chose:
one classic mutation operator applied at one randomly drawn site of src/*.cc, as patches
that scripts/mutants.sh measures (MUTANTS_DIR=OUT_DIR). A survivor is either a gap in the
checks or an equivalent change; each needs reading by hand.

Method: every line of src/**/*.cc outside comments, preprocessor lines, KV_CHECKs and error
returns (whose messages no differential check reads) is scanned for the sites of these
operators, outside string literals:
  relational  '<' <-> '<=', '>' <-> '>=' (binary, so written with spaces), '==' <-> '!='
  logical     '&&' <-> '||'
  constant    '+ 1' and '- 1' dropped, '0' <-> '1' as a whole literal
  call        std::min <-> std::max
  boolean     true <-> false
  statement   a one-line expression statement deleted
A seeded draw picks COUNT sites (all of them without --count); the same seed and tree give
the same patches. A mutant that does not compile is reported so by mutants.sh and costs
only its build.

--family swap writes a second family instead (same sites rule, no statement deletions):
  names that come in pairs swapped (k_ and v_, .k() and .v(), rows() and cols(), .first and
  .second, front() and back(), from() and to(), start_offset() and end_offset()) and
  += and -= flipped: the copy-paste slips the classic operators cannot write.

--family arith writes a third: the sign slips of index arithmetic, binary '+' and '-'
swapped (written with spaces, so unary minus and '++' stay), '- 1' made '+ 1' and the
reverse, and '* 2' made '/ 2': an offset counted the wrong way, a range end one past on the
other side, a doubling halved.

--family args writes a fourth: two adjacent arguments of one call swapped, where both are
plain expressions (no braces, no template brackets) and differ: a (row, count) pair, a
(dst, src) pair or a constructor's (rows, cols) passed in the wrong order, which compiles
whenever the two have one type. Calls whose arguments commute (std::min, std::max,
std::swap) are skipped.

--family guard writes a fifth: conditions that check too little. One operand of a '&&' or
'||' dropped (with its operator), where both operands lie on the line, and the condition of
an 'if' that closes on its line made 'false': the missing conjunct, the guard or early exit
that was never written. A guard the runs seldom reach is where a gap would hide.

--family order writes a sixth: two adjacent one-line statements of one block swapped where
one writes a member path the other reads or writes: a counter updated after the erase that needed
its old value, a cursor restored before the copy that reads it, a state cleared before it
is handed on. Independent neighbours are not sites (their swap changes nothing), nor pairs
where one declares a name the other uses (their swap does not compile).

--family member writes a seventh: a data member read or written where another member of
the same class and type was meant (`offset_` for `start_`, `node->from` for `node->to`);
scripts/mutant_members.py finds the sites.

Usage: scripts/operator-mutants.py OUT_DIR [--seed N] [--count N]
                                   [--family classic|swap|arith|args|guard|order|member]
                                   [--files GLOB ...]
  then MUTANTS_DIR=OUT_DIR MUTANTS_BASELINE=0 scripts/mutants.sh
"""
import argparse
import difflib
import glob
import os
import random
import re
import sys

import mutant_members

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def both_ways(a_name, b_name, pattern, a, b):
    """The two directions of one swap, as (name, pattern, replacement) operators: the
    pattern's first group, written {} here, is what gets replaced."""
    return [(f"{a_name}-to-{b_name}", pattern.format(re.escape(a)), b),
            (f"{b_name}-to-{a_name}", pattern.format(re.escape(b)), a)]


BINARY = r" ({}) "  # clang-format writes binary operators between spaces
OPERATORS = (both_ways("le", "lt", BINARY, "<=", "<") + both_ways("ge", "gt", BINARY, ">=", ">") +
             both_ways("eq", "ne", BINARY, "==", "!=") + both_ways("and", "or", BINARY, "&&", "||") +
             [("drop-plus-one", r"( \+ 1)(?![0-9.])", ""),
              ("drop-minus-one", r"( - 1)(?![0-9.])", "")] +
             both_ways("zero", "one", r"(?<![\w.])({})(?![\w.])", "0", "1") +
             both_ways("min", "max", r"({})\b", "std::min", "std::max") +
             both_ways("true", "false", r"\b({})\b", "true", "false"))

# --family swap: copy-paste slips between names that come in pairs (K and V, rows and
# columns, a range's two ends, a pair's halves) and a flipped compound assignment.
CALL = r"\b({})\(\)"
SWAPS = (both_ways("k", "v", r"\b({})\b", "k_", "v_") +
         [(f"{n}-call-to-{m}", r"\.({})\(\)".format(n), m) for n, m in (("k", "v"), ("v", "k"))] +
         both_ways("rows", "cols", CALL, "rows", "cols") +
         both_ways("first", "second", r"\.({})\b", "first", "second") +
         both_ways("front", "back", CALL, "front", "back") +
         both_ways("from", "to", CALL, "from", "to") +
         [("start-to-end-offset", CALL.format("start_offset"), "end_offset"),
          ("end-to-start-offset", CALL.format("end_offset"), "start_offset")] +
         [("plus-assign-to-minus", BINARY.format(r"\+="), "-="),
          ("minus-assign-to-plus", BINARY.format("-="), "+=")])

# --family arith: sign slips. The generic '+'/'-' swaps skip a literal 1 after the operator,
# so '+ 1' and '- 1' are each one site, flipped by their own operator.
ARITH = ([("plus-one-to-minus-one", r"( \+ 1)(?![0-9.])", " - 1"),
          ("minus-one-to-plus-one", r"( - 1)(?![0-9.])", " + 1"),
          ("plus-to-minus", r" (\+) (?!1(?![0-9.]))", "-"),
          ("minus-to-plus", r" (-) (?!1(?![0-9.]))", "+"),
          ("times-two-to-halve", r"( \* 2)(?![0-9.])", " / 2")])

SKIP = re.compile(r"KV_CHECK|InvalidArgument|OutOfRange|FailedPrecondition|ResourceExhausted|"
                  r"NotFound|Unavailable|Status\(|static_assert|std::to_string|ShapeString")
STATEMENT = re.compile(r"^\s*[A-Za-z_][\w:.\->\[\]()]*\s*(\(|=[^=]|\+=|-=|\+\+|--|\.)[^;]*;\s*$")
DECLARATION = re.compile(r"^\s*(const\s+)?(auto|int|int64_t|int32_t|size_t|bool|float|double|"
                         r"uint\w+|std::|Tensor|MatF|VecF|[A-Z]\w*(<[^>]*>)?[&*]?\s+\w+\s*[=({;])")


def code_part(line):
    """The line up to a // comment, with string and char literals blanked (same length)."""
    out, quote, i = [], None, 0
    while i < len(line):
        c = line[i]
        if quote:
            out.append(" ")
            if c == "\\":
                out.append(" ")
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
            out.append(" ")
        elif line.startswith("//", i):
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)


def sites(path, operators, statements):
    """Every (line index, operator name, start, end, replacement) in one file."""
    lines = open(path).read().split("\n")
    found, in_block = [], False
    for n, line in enumerate(lines):
        stripped = line.strip()
        if in_block:
            in_block = "*/" not in stripped
            continue
        if stripped.startswith("/*"):
            in_block = "*/" not in stripped
            continue
        if not stripped or stripped.startswith(("//", "#")) or SKIP.search(line):
            continue
        code = code_part(line)
        if callable(operators):  # a finder of its own (the args family)
            # Lines with a string or char literal are skipped: the spans index `code`,
            # where literals are blanked, so a swap there would move blanks.
            if code.rstrip() == line.rstrip():
                found += [(n, name, a, b, r) for name, a, b, r in operators(code)]
            continue
        for name, pattern, repl in operators:
            for m in re.finditer(pattern, code):
                found.append((n, name, m.start(1), m.end(1), repl))
        prev = lines[n - 1].rstrip() if n > 0 else ""
        if (statements and STATEMENT.match(code) and not DECLARATION.match(code) and
                not stripped.startswith(("return", "case", "default", "break", "continue")) and
                prev.endswith((";", "{", "}"))):
            found.append((n, "delete-statement", 0, len(line), None))
    return lines, found


PARAMETER = re.compile(r"^(const\s+)?[\w:]+(<[^()]*>)?\s*[&*]*\s+[&*]*\w+$")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype",
            "static_cast", "reinterpret_cast", "const_cast", "catch", "defined"}
COMMUTING = re.compile(r"(std::)?(min|max|swap)$")
CALL_OPEN = re.compile(r"([A-Za-z_][\w:]*)\s*\(")


def top_level_args(code, open_at):
    """The arguments of the call whose '(' is at open_at, as (start, end) spans of `code`
    with their surrounding spaces trimmed, or None if the call does not close on this line."""
    depth, start, spans = 0, open_at + 1, []
    for i in range(open_at, len(code)):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                spans.append((start, i))
                break
        elif c == "," and depth == 1:
            spans.append((start, i))
            start = i + 1
    else:
        return None
    trimmed = []
    for a, b in spans:
        while a < b and code[a] == " ":
            a += 1
        while b > a and code[b - 1] == " ":
            b -= 1
        trimmed.append((a, b))
    return trimmed


def plain(text):
    """An argument the swap can move as it is: no braces, lambdas or template brackets."""
    if not text or any(c in text for c in "{}[]\"'"):
        return False
    # '<' and '>' only as binary operators (written between spaces), never as brackets.
    return not re.search(r"[^ ]<|<[^ =]|[^ -]>|>[^ =]", text)


def arg_sites(code):
    """(name, start, end, replacement) for every adjacent pair of plain, different
    arguments of a call on this line."""
    found = []
    for m in CALL_OPEN.finditer(code):
        name = m.group(1)
        if name in KEYWORDS or COMMUTING.search(name):
            continue
        spans = top_level_args(code, m.end() - 1)
        if spans is None or len(spans) < 2:
            continue
        # A parameter list (a definition), not a call: swapping it changes a signature.
        if any(PARAMETER.match(code[a:b]) for a, b in spans):
            continue
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            x, y = code[a0:a1], code[b0:b1]
            if x == y or not plain(x) or not plain(y):
                continue
            found.append((f"swap-args-{len(found) + 1}", a0, b1, y + code[a1:b0] + x))
    return found


BOOL_OP = re.compile(r" (&&|\|\|)(?= |$)")
ASSIGNMENT = re.compile(r"(?<![=!<>])=(?!=)")


def operand_start(code, op_at):
    """Where the left operand of the binary operator at op_at (its leading space) starts, or
    None when it begins on an earlier line."""
    depth, i = 0, op_at - 1
    while i >= 0:
        c = code[i]
        if c in ")]":
            depth += 1
        elif c in "([":
            if depth == 0:
                return i + 1
            depth -= 1
        elif depth == 0 and (c in ",;?" or BOOL_OP.match(code, i - 2) or
                             ASSIGNMENT.match(code, i) or code.startswith("return ", i)):
            return i + (len("return ") if code.startswith("return ", i) else 1)
        i -= 1
    return None


def operand_end(code, after):
    """Where the right operand starting at `after` ends, or None when it runs on."""
    depth, j = 0, after
    while j < len(code):
        c = code[j]
        if c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                return j
            depth -= 1
        elif depth == 0 and (c in ",;?" or BOOL_OP.match(code, j) or code.startswith(" : ", j)):
            return j
        j += 1
    return None


def guard_sites(code):
    """(name, start, end, replacement): each '&&'/'||' operand dropped, each one-line 'if'
    condition made false."""
    found = []
    for m in BOOL_OP.finditer(code):
        start, end = operand_start(code, m.start()), operand_end(code, m.end())
        if start is None or end is None:
            continue
        left, right = code[start:m.start()].strip(), code[m.end():end].strip()
        if not left or not right:
            continue
        a = start + len(code[start:m.start()]) - len(code[start:m.start()].lstrip())
        found.append((f"drop-left-of-{m.group(1)}", a, m.end() + 1, ""))
        found.append((f"drop-right-of-{m.group(1)}", m.start(), end, ""))
    for m in re.finditer(r"\bif \(", code):
        if code[:m.start()].rstrip().endswith("constexpr"):
            continue
        spans = top_level_args(code, m.end() - 1)
        if spans is not None and len(spans) == 1 and code[spans[0][0]:spans[0][1]] != "false":
            found.append(("if-never", spans[0][0], spans[0][1], "false"))
    # In a chain of three operands, dropping the middle one is both the right operand of the
    # first operator and the left one of the second: keep one mutant per resulting line.
    seen, unique = set(), []
    for name, a, b, r in found:
        if code[:a] + r + code[b:] not in seen:
            seen.add(code[:a] + r + code[b:])
            unique.append((name, a, b, r))
    return unique


IDENT = re.compile(r"[A-Za-z_]\w*")
WRITE_OP = re.compile(r"(?<![=!<>])(=|\+=|-=|\*=|/=|\|=|&=)(?!=)|\+\+|--")
PATH = re.compile(r"[A-Za-z_]\w*(?:(?:\.|->)[A-Za-z_]\w*)*")
NOT_NAMES = {"const", "auto", "static_cast", "std", "int64_t", "size_t", "nullptr", "true",
             "false", "this", "return"}


def bare(code):
    """`code` without call arguments and subscripts (innermost first), so `a.b(x)[i].c`
    reads as the member path `a.b.c`."""
    while True:
        stripped = re.sub(r"\([^()]*\)|\[[^\[\]]*\]", "", code)
        if stripped == code:
            return code
        code = stripped


def written_paths(code):
    """The member paths a one-line statement writes: its assignment's left side (`a.b[i] =
    x` writes a.b), an incremented path, the object of a call chain that makes the whole
    statement (`v.clear()` writes v, `out.row(q).head(n).setZero()` writes out.row.head),
    what std::swap exchanges, and for a one-line `if` or `for`, what its body writes."""
    m = re.match(r"\s*(if|for) \(", code)
    if m:
        spans = top_level_args(code, m.end() - 1)
        return written_paths(code[spans[-1][1] + 1:]) if spans else set()
    out = set()
    m = WRITE_OP.search(code)
    if m and m.group(1):
        out |= set(PATH.findall(bare(code[:m.start()]))[-1:])
    elif m:  # ++ or --: the path next to it
        out |= set(PATH.findall(bare(code))[:1])
    chain = re.fullmatch(r"\s*(" + PATH.pattern + r")\s*;\s*", bare(code))
    if chain and re.search(r"(\.|->)\w+$", chain.group(1)):
        out.add(re.sub(r"(\.|->)\w+$", "", chain.group(1)))
    if "std::swap(" in code:
        out |= set(PATH.findall(code.split("std::swap(", 1)[1]))
    return {p for p in out if re.split(r"\.|->", p)[0] not in NOT_NAMES}


def named_paths(code):
    """Every member path `code` names, call chains whole (`a.b(x).c()` names a.b.c, and x
    inside it), at every depth of parentheses and brackets."""
    out = set(PATH.findall(bare(code)))
    depth, opened = 0, None
    for i, c in enumerate(code):
        if c in "([":
            depth += 1
            if depth == 1:
                opened = i
        elif c in ")]":
            depth -= 1
            if depth == 0 and opened is not None:
                out |= named_paths(code[opened + 1:i])
    return out


def touches(written, code):
    """Whether `code` reads or writes one of the `written` paths: it names the path, a
    member of it, or an object the path is a member of. A plain call of a member function
    (`Append(k, v);`) may read or write any data member (a name ending in '_')."""
    named = named_paths(code)
    if re.fullmatch(r"\s*[A-Z]\w*\s*;\s*", bare(code)):
        named |= {w for w in written if re.split(r"\.|->", w)[0].endswith("_")}
    for w in written:
        for p in named:
            short, long = sorted((w, p), key=len)
            if long == short or long.startswith((short + ".", short + "->")):
                return True
    return False


def member_call_writes(code, other):
    """The data members of `other` that a plain member-function call `code` may write."""
    if not re.fullmatch(r"\s*[A-Z]\w*\s*;\s*", bare(code)):
        return set()
    return {p for p in named_paths(other) if re.split(r"\.|->", p)[0].endswith("_")}


def declared_names(code):
    """The names a declaration line introduces (structured bindings too)."""
    m = re.match(r"^\s*(const\s+)?auto\s*&?\s*\[([^\]]*)\]", code)
    if m:
        return set(IDENT.findall(m.group(2)))
    if not DECLARATION.match(code):
        return set()
    m = re.match(r"^[^=({;]*?(\w+)\s*[=({;]", code.strip())
    return {m.group(1)} if m else set()


def order_pairs(lines):
    """(line index, name) of each statement that swaps with the next one (see --family
    order): same block and indentation, each one whole line, dependent through a name.
    A one-line `if` or `for` counts as a statement: a guard read before the write it needs
    is the same slip."""
    found = []

    def plain_statement(n):
        line = lines[n]
        code = code_part(line)
        stripped = code.strip()
        return (stripped.endswith(";") and not SKIP.search(line) and
                (STATEMENT.match(code) or DECLARATION.match(code) or
                 re.match(r"\s*(if|for) \(", code)) and
                not stripped.startswith(("return", "case", "default", "break", "continue",
                                         "while", "}", "else", "do ")) and
                stripped.count("(") == stripped.count(")"))

    for n in range(1, len(lines) - 1):
        a, b = lines[n], lines[n + 1]
        indent = len(a) - len(a.lstrip())
        if indent != len(b) - len(b.lstrip()) or a.strip() == b.strip():
            continue
        if not lines[n - 1].rstrip().endswith((";", "{", "}")):
            continue  # a continued statement or a braceless if's body
        if not (plain_statement(n) and plain_statement(n + 1)):
            continue
        ca, cb = code_part(a), code_part(b)
        names_a, names_b = set(IDENT.findall(ca)), set(IDENT.findall(cb))
        if (declared_names(ca) & names_b) or (declared_names(cb) & names_a):
            continue  # the swap would use a name before its declaration
        wa = written_paths(ca) | member_call_writes(ca, cb)
        wb = written_paths(cb) | member_call_writes(cb, ca)
        if touches(wa, cb) or touches(wb, ca):
            found.append((n, "swap-with-next", 0, 0, "swap-next"))
    return found


def patch_text(rel, lines, site):
    n, name, start, end, repl = site
    old = lines[n]
    mutated = list(lines)
    if repl == "swap-next":
        mutated[n], mutated[n + 1] = lines[n + 1], lines[n]
        diff = difflib.unified_diff([l + "\n" for l in lines], [l + "\n" for l in mutated],
                                    f"a/{rel}", f"b/{rel}", n=3)
        desc = (f"Description: operator mutant {name} at {rel}:{n + 1}: `{old.strip()}` <-> "
                f"`{lines[n + 1].strip()}`\n")
        return desc + "\n" + f"diff -u a/{rel} b/{rel}\n" + "".join(diff)
    new = None if repl is None else old[:start] + repl + old[end:]
    if new is None:
        mutated[n] = old[: len(old) - len(old.lstrip())] + "// (deleted) " + old.strip()
        shown = "deleted"
    else:
        mutated[n] = new
        shown = "`" + new.strip() + "`"
    diff = difflib.unified_diff([l + "\n" for l in lines], [l + "\n" for l in mutated],
                                f"a/{rel}", f"b/{rel}", n=3)
    body = "".join(diff)
    desc = f"Description: operator mutant {name} at {rel}:{n + 1}: `{old.strip()}` -> {shown}\n"
    return desc + "\n" + f"diff -u a/{rel} b/{rel}\n" + body


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--files", nargs="*", default=["src/*.cc", "src/core/*.cc"])
    ap.add_argument("--family", default="classic",
                    choices=["classic", "swap", "arith", "args", "guard", "order", "member"])
    args = ap.parse_args()
    if os.path.exists(args.out_dir) and os.listdir(args.out_dir):
        sys.exit(f"operator-mutants: {args.out_dir} is not empty")
    paths = sorted({p for g in args.files for p in glob.glob(os.path.join(ROOT, g))})
    if not paths:
        sys.exit("operator-mutants: --files matches no file")
    every = []
    members = mutant_members.member_sites(ROOT, code_part) if args.family == "member" else None
    for path in paths:
        classic = args.family == "classic"
        if members is not None:
            lines = open(path).read().split("\n")
            every += [(os.path.relpath(path, ROOT), lines, s) for s in members(lines)
                      if not SKIP.search(lines[s[0]]) and
                      not lines[s[0]].strip().startswith(("//", "#", "*", "/*"))]
            continue
        operators = {"classic": OPERATORS, "swap": SWAPS, "arith": ARITH, "args": arg_sites,
                     "guard": guard_sites, "order": None}[args.family]
        if args.family == "order":
            lines = open(path).read().split("\n")
            every += [(os.path.relpath(path, ROOT), lines, s) for s in order_pairs(lines)]
            continue
        lines, found = sites(path, operators, statements=classic)
        if args.family == "arith":  # '-' between strings does not compile: not a bug
            found = [f for f in found if '"' not in lines[f[0]] and "to_string" not in lines[f[0]]]
        every += [(os.path.relpath(path, ROOT), lines, s) for s in found]
    rng = random.Random(args.seed)
    chosen = rng.sample(every, args.count) if 0 < args.count < len(every) else every
    os.makedirs(args.out_dir, exist_ok=True)
    for i, (rel, lines, site) in enumerate(chosen, 1):
        stem = re.sub(r"[^a-z0-9]+", "-", f"{os.path.basename(rel)}-{site[0] + 1}-{site[1]}")
        with open(os.path.join(args.out_dir, f"{i:03d}-{stem}.patch"), "w") as f:
            f.write(patch_text(rel, lines, site))
    print(f"{len(chosen)} of {len(every)} sites in {len(paths)} files -> {args.out_dir}")


if __name__ == "__main__":
    main()

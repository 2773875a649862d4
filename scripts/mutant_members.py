"""The sites of operator-mutants.py's --family member: a data member read or written where
another member of the same class and the same declared type was meant (`offset_` for
`start_`, `node->from` for `node->to`, `options_.budget` for `options_.reserve`). The type
match keeps most mutants compiling, so the family measures checks, not the compiler.

Method: the class and struct bodies of every src/ header and source file are scanned for
data member declarations (`Type name_ = init;`, one name per line, statics and constants
left out), keyed by class. A site is either a bare member name (`name_`, inside a method of
its class: a body written in the class, or a definition `Class::Method(` at column 0) or a
field access `.name` / `->name` that is not a call; its replacements are the other members
of a class declaring that name with the same type. The K/V pair is left to --family swap.
"""
import glob
import os
import re

MEMBER = re.compile(
    r"^\s*(?:mutable\s+)?(?P<type>(?:const\s+)?[A-Za-z_][\w:]*(?:<[^;()=]*>)?[\s*&]*?)\s+"
    r"(?P<name>[A-Za-z_]\w*)\s*(?:=\s*[^;]*|\{[^;]*\})?;\s*$")
NOT_TYPES = {"return", "using", "friend", "typedef", "static", "delete", "goto", "case",
             "throw", "co_return", "else", "namespace"}
CLASS_OPEN = re.compile(r"^\s*(?:template\s*<[^>]*>\s*)?(?:class|struct)\s+(\w+)\b[^;]*$")
DEFINITION = re.compile(r"^[A-Za-z_][^;]*?\b(\w+)::~?\w+\(")
LEFT_TO_SWAP = {frozenset({"k_", "v_"})}


def normalized(type_text):
    return re.sub(r"\s+", "", type_text.replace("const ", ""))


def scoped(lines, code_part):
    """(index, code, class before, class after, in a class body) for each line: the
    innermost class or struct whose body encloses the line's start and its end, and whether
    the line ends directly in that body (not in a method or a nested block)."""
    stack, depth, pending = [], 0, None  # stack of (class name, depth of its body)
    for n, line in enumerate(lines):
        code = code_part(line)
        m = CLASS_OPEN.match(code)
        if m:
            pending = m.group(1)
        before = stack[-1][0] if stack else None
        for c in code:
            if c == "{":
                depth += 1
                if pending is not None:
                    stack.append((pending, depth))
                    pending = None
            elif c == "}":
                if stack and stack[-1][1] == depth:
                    stack.pop()
                depth -= 1
        if pending is not None and code.rstrip().endswith(";"):
            pending = None  # a forward declaration
        after = stack[-1][0] if stack else None
        yield n, code, before, after, bool(stack) and depth == stack[-1][1]


def class_members(paths, code_part):
    """{class name: {member name: normalized type}} over every file in `paths`."""
    members = {}
    for path in paths:
        lines = open(path).read().split("\n")
        for _, code, _, cls, in_body in scoped(lines, code_part):
            if not in_body or "static " in code or "(" in code:
                continue
            d = MEMBER.match(code)
            if d and d.group("type").split()[0] not in NOT_TYPES:
                members.setdefault(cls, {})[d.group("name")] = normalized(d.group("type"))
    return members


def member_sites(root, code_part):
    """The family's site finder: a function of one file's lines, built once over the
    classes of every src/ file."""
    paths = sorted(glob.glob(os.path.join(root, "src", "**", "*.h"), recursive=True) +
                   glob.glob(os.path.join(root, "src", "**", "*.cc"), recursive=True))
    members = class_members(paths, code_part)
    owners = {}  # field name -> classes declaring it
    for cls, fields in members.items():
        for name in fields:
            owners.setdefault(name, []).append(cls)

    def replacements(cls, name):
        fields = members.get(cls, {})
        if name not in fields:
            return []
        return [other for other, t in fields.items()
                if other != name and t == fields[name] and
                frozenset({name, other}) not in LEFT_TO_SWAP]

    def finder(lines):
        """(line index, name, start, end, replacement) over one file's lines."""
        found, current = [], None
        for n, code, cls, _, _ in scoped(lines, code_part):
            d = DEFINITION.match(code)
            if d:
                current = d.group(1)
            inside = cls or current
            here = []
            # A declaration line names its own member; the bare-name sites are the uses.
            if inside is not None and not MEMBER.match(code):
                for s in re.finditer(r"(?<![\w.>])([A-Za-z]\w*_)\b(?!\s*\()", code):
                    name = s.group(1)
                    for other in replacements(inside, name):
                        here.append((f"member-{name}-to-{other}", s.start(1), s.end(1), other))
            for s in re.finditer(r"(?:\.|->)([A-Za-z]\w*)\b(?!\s*[(<])", code):
                name = s.group(1)
                seen = set()
                for owner in owners.get(name, []):
                    for other in replacements(owner, name):
                        if other not in seen:
                            seen.add(other)
                            here.append((f"field-{name}-to-{other}", s.start(1), s.end(1), other))
            found += [(n,) + site for site in here]
        return found

    return finder

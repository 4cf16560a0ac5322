"""toolwire's Python tool runner (embedded in toolwire-engine, run with `python3 -c`).

It reads one JSON request on stdin and writes one JSON reply to the
process's original stdout, which it keeps for itself before any user code
runs: everything the tool prints (stdout and stderr, in order) goes to
stderr, so a print can never be mistaken for the result.

Modes:
  call    {"mode", "name", "source", "arguments", "memory_limit"}
          exec the source, call the function `name` with the arguments as
          keyword arguments, reply with its return value.
  schema  {"mode", "name", "source", "memory_limit"}
          read the function's signature and docstring with `ast` (the user
          code is never executed) and reply with a JSON schema.
"""

import ast
import json
import os
import re
import sys

# Traceback lines kept for the model: the end is where the error is.
TRACEBACK_LINES = 20
# Parameters a Letta tool receives from the runtime, never from the model.
INJECTED = ("self", "agent_state")


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    channel = os.dup(1)
    os.dup2(2, 1)
    # Line buffering so prints reach toolwire (and its progress events) as
    # they happen, not when the tool ends.
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, errors="backslashreplace")
    try:
        reply = MODES[request["mode"]](request)
    except MemoryError:
        reply = {"status": "memory_error", "phase": "call", "traceback": []}
    except BaseException as e:  # a bug here must still produce a reply
        reply = {"status": "setup", "message": "runner error: %s: %s" % (type(e).__name__, e)}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        data = json.dumps(reply).encode("ascii")
    except MemoryError:
        data = b'{"status": "memory_error", "phase": "result", "traceback": []}'
    while data:
        data = data[os.write(channel, data):]
    os.close(channel)
    # Threads the tool left running must not keep the call alive, and its
    # atexit handlers must not write after the reply.
    os._exit(0)


def set_memory_limit(limit):
    import resource

    # Soft and hard, so the tool cannot raise it again.
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def filename_of(name):
    return "<tool %s>" % name


def syntax_reply(e):
    return {
        "status": "syntax",
        "message": e.msg if isinstance(e, SyntaxError) else str(e),
        "line": getattr(e, "lineno", None),
        "text": (getattr(e, "text", None) or "").strip() or None,
    }


# --- call -------------------------------------------------------------------


def run_call(request):
    import inspect
    import linecache

    try:
        set_memory_limit(request["memory_limit"])
    except (ValueError, OSError) as e:
        return {"status": "setup", "message": "could not set the memory limit: %s" % e}

    name = request["name"]
    source = request["source"]
    filename = filename_of(name)
    # Tracebacks then show the tool's own source lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        code = compile(source, filename, "exec")
    except (SyntaxError, ValueError) as e:
        return syntax_reply(e)

    namespace = {"__name__": "toolwire_tool", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except MemoryError as e:
        return memory_reply(e, "load", filename)
    except BaseException as e:
        return exception_reply(e, "load", filename)

    function = namespace.get(name)
    if function is None:
        return missing_reply(name, namespace)
    if not callable(function):
        return {
            "status": "missing_function",
            "name": name,
            "detail": "`%s` is a %s, not a function" % (name, type(function).__name__),
        }

    arguments = dict(request["arguments"])
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        if "agent_state" in signature.parameters and "agent_state" not in arguments:
            # Letta passes its agent state here; toolwire has none to give.
            arguments["agent_state"] = None
        try:
            signature.bind(**arguments)
        except TypeError as e:
            return {"status": "arguments", "message": str(e)}

    try:
        result = function(**arguments)
        if inspect.isawaitable(result):
            import asyncio

            result = asyncio.run(await_it(result))
    except MemoryError as e:
        return memory_reply(e, "call", filename)
    except BaseException as e:
        return exception_reply(e, "call", filename)
    return {"status": "ok", "result": render(result)}


async def await_it(awaitable):
    return await awaitable


def render(value):
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        pass
    try:
        return repr(value)
    except Exception:
        return "<%s object (repr failed)>" % type(value).__name__


def missing_reply(name, namespace):
    import types

    functions = sorted(
        k
        for k, v in namespace.items()
        if isinstance(v, types.FunctionType) and not k.startswith("_")
    )
    return {"status": "missing_function", "name": name, "detail": defined(functions)}


def defined(functions):
    if not functions:
        return "it defines no functions"
    return "it defines: " + ", ".join(functions)


def user_traceback(e, filename):
    import traceback

    # Start at the first frame of the tool's code: the runner's own frames
    # say nothing to the model.
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(e), e, tb))
    except Exception:
        return []
    return text.rstrip("\n").splitlines()[-TRACEBACK_LINES:]


def exception_name(e):
    cls = type(e)
    if cls.__module__ in ("builtins", "__main__", "toolwire_tool"):
        return cls.__qualname__
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def exception_reply(e, phase, filename):
    try:
        message = str(e)
    except Exception:
        message = "(str() of the exception failed)"
    return {
        "status": "exception",
        "phase": phase,
        "type": exception_name(e),
        "message": message,
        "traceback": user_traceback(e, filename),
    }


def memory_reply(e, phase, filename):
    return {"status": "memory_error", "phase": phase, "traceback": user_traceback(e, filename)}


# --- schema -----------------------------------------------------------------


class Unsupported(Exception):
    pass


def run_schema(request):
    try:
        set_memory_limit(request["memory_limit"])
    except (ValueError, OSError) as e:
        return {"status": "setup", "message": "could not set the memory limit: %s" % e}

    name = request["name"]
    try:
        tree = ast.parse(request["source"], filename_of(name))
    except (SyntaxError, ValueError) as e:
        return syntax_reply(e)

    # The last definition wins, as it would when the source runs.
    function = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            function = node
    if function is None:
        functions = sorted(
            {
                n.name
                for n in tree.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not n.name.startswith("_")
            }
        )
        return {"status": "missing_function", "name": name, "detail": defined(functions)}

    try:
        parameters = schema_of(function)
    except Unsupported as e:
        return {"status": "signature", "message": str(e)}
    description, _ = parse_docstring(ast.get_docstring(function) or "")
    return {
        "status": "schema",
        "name": name,
        "description": description,
        "parameters": parameters,
    }


def schema_of(function):
    args = function.args
    if args.posonlyargs:
        raise Unsupported(
            "parameter `%s` is positional-only, so it cannot be passed by name" % args.posonlyargs[0].arg
        )
    _, param_docs = parse_docstring(ast.get_docstring(function) or "")

    # Defaults align with the end of the positional parameters; keyword-only
    # parameters have one entry each (None: no default).
    first_default = len(args.args) - len(args.defaults)
    params = [(a, i >= first_default) for i, a in enumerate(args.args)]
    params += [(a, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]

    properties = {}
    required = []
    for arg, has_default in params:
        if arg.arg in INJECTED:
            continue
        if arg.annotation is None:
            prop, optional = {}, False
        else:
            try:
                prop, optional = convert(arg.annotation)
            except Unsupported as e:
                raise Unsupported("parameter `%s`: %s" % (arg.arg, e)) from None
        prop = dict(prop)
        if param_docs.get(arg.arg):
            prop["description"] = param_docs[arg.arg]
        properties[arg.arg] = prop
        # As Letta does: Optional[X] means the model may leave it out.
        if not has_default and not optional:
            required.append(arg.arg)
    return {"type": "object", "properties": properties, "required": required}


SCALARS = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    # Letta's choice for an untyped list; some providers refuse an array
    # schema without `items`.
    "list": {"type": "array", "items": {"type": "string"}},
    "List": {"type": "array", "items": {"type": "string"}},
    "dict": {"type": "object"},
    "Dict": {"type": "object"},
    "Any": {},
    "object": {},
    "None": {"type": "null"},
    "NoneType": {"type": "null"},
}
ARRAYS = {
    "list", "List", "Sequence", "MutableSequence", "Iterable", "Collection",
    "set", "Set", "frozenset", "FrozenSet",
}
TUPLES = {"tuple", "Tuple"}
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}


def type_name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # typing.List, t.Optional
        return node.attr
    return None


def is_none(node):
    return (isinstance(node, ast.Constant) and node.value is None) or type_name(node) in ("None", "NoneType")


def convert(node):
    """Returns (JSON schema, whether None is allowed) for an annotation."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            parsed = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            raise Unsupported("cannot read the annotation %r" % node.value) from None
        return convert(parsed)
    if is_none(node):
        return {"type": "null"}, True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return union(flatten_or(node))
    name = type_name(node)
    if name is not None and name in SCALARS:
        return SCALARS[name], False
    if isinstance(node, ast.Subscript):
        base = type_name(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Optional" and len(items) == 1:
            schema, _ = convert(items[0])
            return schema, True
        if base == "Union":
            return union(items)
        if base == "Literal":
            return literal(items), False
        if base == "Annotated":
            return convert(items[0])
        if base in ARRAYS and len(items) == 1:
            return {"type": "array", "items": nested(items[0])}, False
        if base in TUPLES:
            if len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is Ellipsis:
                return {"type": "array", "items": nested(items[0])}, False
            return {
                "type": "array",
                "prefixItems": [nested(i) for i in items],
                "minItems": len(items),
                "maxItems": len(items),
            }, False
        if base in MAPPINGS and len(items) == 2:
            return {"type": "object", "additionalProperties": nested(items[1])}, False
    raise Unsupported("the type `%s` has no JSON schema equivalent" % ast.unparse(node))


def nested(node):
    """An annotation inside another one, where only null can say "optional"."""
    schema, optional = convert(node)
    if not optional or schema.get("type") == "null":
        return schema
    if isinstance(schema.get("type"), str):
        return dict(schema, type=[schema["type"], "null"])
    return {"anyOf": [schema, {"type": "null"}]}


def flatten_or(node):
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return flatten_or(node.left) + flatten_or(node.right)
    return [node]


def union(members):
    optional = any(is_none(m) for m in members)
    rest = [m for m in members if not is_none(m)]
    if not rest:
        return {"type": "null"}, True
    if len(rest) == 1:
        schema, inner_optional = convert(rest[0])
        return schema, optional or inner_optional
    return {"anyOf": [nested(m) for m in rest]}, optional


def literal(items):
    values = []
    for item in items:
        try:
            values.append(ast.literal_eval(item))
        except ValueError:
            raise Unsupported("Literal values must be constants, not `%s`" % ast.unparse(item)) from None
    schema = {"enum": values}
    if all(isinstance(v, str) for v in values):
        schema = {"type": "string", "enum": values}
    elif all(isinstance(v, bool) for v in values):
        schema = {"type": "boolean", "enum": values}
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        schema = {"type": "integer", "enum": values}
    elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        schema = {"type": "number", "enum": values}
    return schema


# Google-style section titles ("Args:", "Returns:", "Keyword Args:"). Only
# known titles count, so a summary like "Sums these:" stays a summary.
SECTION_TITLE = re.compile(r"^([A-Z][A-Za-z]*(?: [A-Za-z]+)*):\s*$")
SECTIONS = {
    "args", "arguments", "parameters", "params", "keyword args", "keyword arguments",
    "other parameters", "returns", "return", "yields", "yield", "raises", "raise",
    "exceptions", "examples", "example", "note", "notes", "warning", "warnings",
    "see also", "todo", "attributes", "references",
}
ARG_SECTIONS = {
    "args", "arguments", "parameters", "params",
    "keyword args", "keyword arguments", "other parameters",
}
# "name (type, optional): text" or "name: text"
GOOGLE_ARG = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:(?:\s+(.*))?$")
# ":param name: text" or ":param type name: text"
REST_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:(?:\s+(.*))?$")
REST_FIELD = re.compile(r"^:\w+")


def section_title(text):
    """The lowercased title if `text` opens a Google-style section."""
    match = SECTION_TITLE.match(text)
    if match and match.group(1).lower() in SECTIONS:
        return match.group(1).lower()
    return None


def indent_of(line):
    return len(line) - len(line.lstrip())


def parse_docstring(doc):
    """Returns (the first paragraph, {parameter: description})."""
    lines = doc.expandtabs().splitlines()

    summary = []
    for line in lines:
        text = line.strip()
        if not text or section_title(text) or REST_FIELD.match(text):
            break
        summary.append(text)

    params = {}
    section = None  # the lowercased title of the Google section we are in
    entry_indent = None
    current = None  # the parameter whose description continues
    current_indent = 0
    for line in lines:
        text = line.strip()
        indent = indent_of(line)
        if not text:
            continue
        if indent == 0 and section_title(text):
            section = section_title(text)
            entry_indent = None
            current = None
            continue
        rest = REST_PARAM.match(text)
        if rest and indent == 0:
            section = None
            current, current_indent = rest.group(1), indent
            params[current] = rest.group(2) or ""
            continue
        if REST_FIELD.match(text) and indent == 0:
            section = None
            current = None
            continue
        if section in ARG_SECTIONS:
            if entry_indent is None:
                entry_indent = indent
            entry = GOOGLE_ARG.match(text)
            if indent <= entry_indent and entry:
                current, current_indent = entry.group(1), indent
                params[current] = entry.group(2) or ""
                continue
        if current is not None and indent > current_indent:
            params[current] = (params[current] + " " + text).strip()
            continue
        if indent == 0:
            section = None
        current = None
    return " ".join(summary), params


MODES = {"call": run_call, "schema": run_schema}

if __name__ == "__main__":
    main()

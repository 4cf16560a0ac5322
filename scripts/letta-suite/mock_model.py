"""A scripted OpenAI-compatible chat model for running Letta's own tests
against `toolwire serve`: it answers from the request (the last user
message, the tools offered, the tool results), deterministically.

Rules:
- a `response_format` of type json_schema: a JSON object filling every
  required string property;
- last message a tool result: the next call of a sequence the user asked
  for ("First use the add tool … Then use the multiply tool …": one call
  per step, in the text's order), else a text answer quoting every result
  since the assistant's calls ("Results: …");
- a user message naming offered tools: calls to them, with arguments read
  from the text (`name="value"` / `name=42` / `name=true` pairs naming
  the tool's parameters, at any depth of its schema; else quoted strings
  for string parameters — one call per quoted string —, numbers for
  integer ones: `num_sides=N` each, or "N sides", "N-sided");
- "Reply with the message '…'": that text;
- otherwise: a text that repeats the last tool result seen, if any;
- with the human-in-the-loop tests' tool (`get_secret_code_tool`)
  offered, each answer starts with a short reasoning, and calls come
  after a sentence saying so.

Usage: MOCK_DELAY=SECONDS python3 mock_model.py PORT (each answer waits
MOCK_DELAY seconds before its first byte).
"""

import json
import re
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def fill_schema(schema):
    out = {}
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type")
        if kind == "string":
            out[name] = f"Paris ({name})"
        elif kind in ("integer", "number"):
            out[name] = 1
        elif kind == "boolean":
            out[name] = True
        else:
            out[name] = None
    return out


def resolve(schema, root):
    """`schema` with its `$ref` followed and a nullable `anyOf` unwrapped
    (as pydantic writes `Optional[X]`)."""
    for _ in range(10):
        if "$ref" in schema:
            ref = schema["$ref"].rsplit("/", 1)[-1]
            schema = (root.get("$defs") or root.get("definitions") or {}).get(ref, {})
        elif "anyOf" in schema:
            options = [o for o in schema["anyOf"] if o.get("type") != "null"]
            schema = options[0] if options else {}
        else:
            break
    return schema


PAIR = re.compile(r'\b(\w+)\s*=\s*("([^"]*)"|\'([^\']*)\'|true|false|-?\d+(?:\.\d+)?)')


def scalar(raw, quoted):
    if quoted is not None:
        return quoted
    if raw in ("true", "false"):
        return raw == "true"
    return float(raw) if "." in raw else int(raw)


def from_pairs(schema, root, pairs):
    """An object of `schema` with the `name=value` pairs of the text that
    name its properties, at any depth (an array of objects gets one item
    when the text names any of its item's properties); `None` when none
    does."""
    out = {}
    for name, prop in (resolve(schema, root).get("properties") or {}).items():
        prop = resolve(prop, root)
        if name in pairs:
            out[name] = pairs[name]
        elif prop.get("type") == "object" or "properties" in prop:
            inner = from_pairs(prop, root, pairs)
            if inner is not None:
                out[name] = inner
        elif prop.get("type") == "array":
            inner = from_pairs(resolve(prop.get("items") or {}, root), root, pairs)
            if inner is not None:
                out[name] = [inner]
    return out or None


def calls_for(text, tools):
    calls = []
    lowered = text.lower()
    found = [(m.group(1), scalar(m.group(2), m.group(3) if m.group(3) is not None else m.group(4)))
             for m in PAIR.finditer(text)]
    pairs = dict(found)
    if len(pairs) < len(found):
        # `num_sides=4 … num_sides=6`: one call each, below.
        pairs = {}
    for tool in tools:
        fn = tool.get("function", {})
        name = fn.get("name", "")
        if not name or name.lower() not in lowered:
            continue
        schema = fn.get("parameters") or {}
        params = schema.get("properties") or {}
        # `preset="b", doid="TEST123" …`: the arguments named in the text.
        named = from_pairs(schema, schema, pairs) if pairs else None
        if named is not None:
            calls.append((name, named))
            continue
        ints = [k for k, v in params.items() if v.get("type") in ("integer", "number")]
        strs = [k for k, v in params.items() if v.get("type") == "string"]
        if len(ints) > 1 and not strs:
            # "add 42 and 58": the numbers after the tool's name, in order.
            at = lowered.index(name.lower())
            end = text.find(".", at)
            numbers = [int(n) for n in re.findall(r"-?\d+", text[at : end if end >= 0 else None])]
            calls.append((name, {k: numbers[i] if i < len(numbers) else 1 for i, k in enumerate(ints)}))
        elif ints and not strs:
            values = [int(n) for n in re.findall(r"num_sides\s*=\s*(\d+)", text)]
            if not values:
                m = re.search(r"(\d+)[ -]sid", text)
                values = [int(m.group(1))] if m else [6]
            # A dice tool named next to another: only its own number.
            if len(tools) > 1 and len(values) > 1 and "num_sides" not in text:
                values = values[:1]
            for v in values:
                calls.append((name, {ints[0]: v}))
        elif strs:
            quoted = re.findall(r"'([^']+)'", text) or re.findall(r'"([^"]+)"', text) or ["hello"]
            # Quoted strings that are tool names are not arguments.
            quoted = [q for q in quoted if q not in {t.get("function", {}).get("name") for t in tools}]
            for q in quoted or ["hello"]:
                args = {strs[0]: q}
                for k in ints:
                    args[k] = 1
                calls.append((name, args))
        else:
            calls.append((name, {}))
    return calls


def in_sequence(text):
    """"First use … Then use … Finally …": one tool after another, each
    in a step of its own (as a model calls tools that use each other's
    results)."""
    return bool(re.search(r"\bthen\b", text, re.IGNORECASE))


def ordered(text, calls):
    """`calls` in the order the text names their tools."""
    lowered = text.lower()
    return sorted(calls, key=lambda c: lowered.find(c[0].lower()))


def next_in_sequence(messages, tools):
    """After a tool result: the next call of a sequence the last user
    message asks for, if some are still to come."""
    at = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if at is None:
        return None
    user = text_of(messages[at].get("content"))
    if not in_sequence(user):
        return None
    made = sum(len(m.get("tool_calls") or []) for m in messages[at + 1:] if m.get("role") == "assistant")
    calls = ordered(user, calls_for(user, tools))
    return calls[made] if made < len(calls) else None


def answer(request):
    messages = request.get("messages", [])
    tools = request.get("tools") or []
    fmt = request.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        return json.dumps(fill_schema(schema)), []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        step = next_in_sequence(messages, tools)
        if step is not None:
            return None, [step]
        results = []
        for m in reversed(messages):
            if m.get("role") == "tool":
                results.append(text_of(m.get("content")))
            else:
                break
        return "Results: " + ", ".join(reversed(results)), []
    user = text_of(last.get("content"))
    reply = re.search(r"Reply with the message '([^']*)'", user)
    if reply:
        return reply.group(1), []
    calls = calls_for(user, tools)
    if calls and in_sequence(user):
        return None, [ordered(user, calls)[0]]
    if calls:
        return None, calls
    seen = [text_of(m.get("content")) for m in messages if m.get("role") == "tool"]
    if seen:
        return f"The last result was {seen[-1]}.", []
    return "Understood.", []


def sse(obj):
    return f"data: {json.dumps(obj)}\n\n".encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": "gpt-4o-mini", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length) or b"{}")
        text, calls = answer(request)
        tail = [(m.get("role"), text_of(m.get("content"))[:60]) for m in request.get("messages", [])[-3:]]
        print(json.dumps({"tail": tail, "text": text, "calls": calls}), flush=True)
        # A model takes time to answer: the tests that cancel a run 0.5 s
        # after it starts need it to be still running then.
        time.sleep(float(__import__("os").environ.get("MOCK_DELAY", "0")))
        created = int(time.time())
        rid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        model = request.get("model", "gpt-4o-mini")
        prompt_tokens = 10 + sum(len(text_of(m.get("content"))) for m in request.get("messages", [])) // 4

        def chunk(delta, finish=None):
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        out = [sse(chunk({"role": "assistant"}))]
        # The human-in-the-loop tests expect the model to think first (as
        # the runs they were written against did): with their tools offered,
        # each answer starts with a short reasoning.
        names = {t.get("function", {}).get("name") for t in request.get("tools") or []}
        if "get_secret_code_tool" in names:
            out.append(sse(chunk({"reasoning_content": "Let me think about what the user asked."})))
            if text is None:
                # …and say what they call before calling it.
                out.append(sse(chunk({"content": "I will call the tools now."})))
        if text is not None:
            for i in range(0, len(text), 8):
                out.append(sse(chunk({"content": text[i:i + 8]})))
            finish = "stop"
        else:
            for i, (name, args) in enumerate(calls):
                cid = f"call_{uuid.uuid4().hex[:16]}"
                out.append(sse(chunk({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                                      "function": {"name": name, "arguments": ""}}]})))
                out.append(sse(chunk({"tool_calls": [{"index": i, "function": {"arguments": json.dumps(args)}}]})))
            finish = "tool_calls"
        out.append(sse(chunk({}, finish)))
        out.append(sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                                                 "total_tokens": prompt_tokens + 12}}))
        out.append(b"data: [DONE]\n\n")
        body = b"".join(out)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()

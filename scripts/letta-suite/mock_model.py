"""A scripted OpenAI-compatible chat model for running Letta's own tests
against `toolwire serve`: it answers from the request (the last user
message, the tools offered, the tool results), deterministically.

Rules:
- a `response_format` of type json_schema: a JSON object filling every
  required string property;
- last message a tool result: a text answer quoting every result since
  the assistant's calls ("Results: …");
- a user message naming offered tools: calls to them, with arguments read
  from the text (quoted strings for string parameters — one call per quoted
  string —, numbers for integer ones: `num_sides=N` each, or "N sides",
  "N-sided");
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


def calls_for(text, tools):
    calls = []
    lowered = text.lower()
    for tool in tools:
        fn = tool.get("function", {})
        name = fn.get("name", "")
        if not name or name.lower() not in lowered:
            continue
        params = (fn.get("parameters") or {}).get("properties") or {}
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
            quoted = re.findall(r"'([^']+)'", text) or ["hello"]
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


def answer(request):
    messages = request.get("messages", [])
    tools = request.get("tools") or []
    fmt = request.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        return json.dumps(fill_schema(schema)), []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
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

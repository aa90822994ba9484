"""The serve gate's tool-calling checks: drives `dspark-serve` on the tool-chat fixture (a tiny
target trained on Gemma-4's chat format) with the official `openai` client's tools API, whole
and streamed: the model calls `get_weather`, the client answers with a `tool` message, and the
model answers from the result; thinking comes back as `reasoning_content`; usage appears once
per stream.

Usage: tool_client.py BASE_URL TOOLS_JSON
"""

import json
import sys

import openai

base, tools = sys.argv[1], json.load(open(sys.argv[2]))
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=120, max_retries=0)
MODEL = client.models.list().data[0].id
failures = []


def check(ok, msg):
    if not ok:
        failures.append(msg)
        print("tool gate: FAIL " + msg, file=sys.stderr, flush=True)


ask = [{"role": "user", "content": "What is the weather in Paris?"}]

# 1. Whole: a parsed call.
r = client.chat.completions.create(model=MODEL, messages=ask, tools=tools, temperature=0)
c = r.choices[0]
check(c.finish_reason == "tool_calls", f"finish_reason {c.finish_reason!r}, want 'tool_calls'")
calls = c.message.tool_calls or []
check(len(calls) == 1, f"{len(calls)} tool calls, want 1: {c.message}")
if calls:
    call = calls[0]
    check(call.function.name == "get_weather", f"called {call.function.name!r}")
    check(json.loads(call.function.arguments) == {"city": "Paris"}, f"arguments {call.function.arguments!r}")
    check(c.message.content is None, f"content {c.message.content!r} beside the call")

    # 2. The result, sent back as the SDK's users do; the answer comes from it.
    follow = ask + [c.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    r2 = client.chat.completions.create(model=MODEL, messages=follow, tools=tools, temperature=0)
    check(r2.choices[0].message.content == "It is 18 degrees and sunny in Paris.",
          f"answer {r2.choices[0].message.content!r}")
    check(r2.choices[0].finish_reason == "stop", f"answer finish_reason {r2.choices[0].finish_reason!r}")

# 3. Streamed: the call arrives as a tool_calls delta; usage exactly once, on the last chunk.
s = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What time is it in Oslo?"}],
                                   tools=tools, temperature=0, stream=True, stream_options={"include_usage": True})
deltas, finish, usages, content = [], [], 0, ""
for ch in s:
    if ch.usage is not None:
        usages += 1
        check(not ch.choices, "usage on a chunk with choices")
    for choice in ch.choices:
        deltas += choice.delta.tool_calls or []
        content += choice.delta.content or ""
        if choice.finish_reason:
            finish.append(choice.finish_reason)
check(usages == 1, f"{usages} usage chunks in a stream, want 1")
check(finish == ["tool_calls"], f"stream finish reasons {finish}")
check(content == "", f"streamed content {content!r} beside the call")
names = [d.function.name for d in deltas if d.function and d.function.name]
args = "".join(d.function.arguments or "" for d in deltas if d.function)
check(names == ["get_time"], f"streamed calls {names}")
check(args and json.loads(args) == {"city": "Oslo"}, f"streamed arguments {args!r}")

# 4. Thinking: `reasoning_content` apart from the answer.
r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello to Ada."}],
                                   temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
m = r.choices[0].message
check((m.model_extra or {}).get("reasoning_content") == "Greet Ada.", f"reasoning {m.model_extra}")
check(m.content == "Hello, Ada!", f"content after thinking {m.content!r}")

if failures:
    sys.exit(f"tool gate: {len(failures)} check(s) failed")
print("tool gate: calls whole and streamed, a tool result answered, thinking separated, usage once per stream",
      flush=True)

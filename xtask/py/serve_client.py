"""The serve gate's client side: drives a running `dspark-serve` with the official `openai`
client and checks every text against what `dspark generate` printed for the same prompt,
seed and parameters; sends malformed requests; runs a concurrent load test with clients that
disconnect mid-stream; then checks that the server is healthy and idle and reports its RSS.

Usage: serve_client.py BASE_URL CASES_JSON SERVER_PID CLIENTS REQUESTS_PER_CLIENT
"""

import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

base, cases_path, pid, n_clients, n_requests = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cases = json.load(open(cases_path))
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=120, max_retries=0)
MODEL = client.models.list().data[0].id
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


def rss_kib():
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def health():
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        return json.loads(r.read())


def kwargs(case, stream):
    p = case["params"]
    kw = dict(model=MODEL, max_tokens=p["max_tokens"], temperature=p["temperature"], stream=stream)
    if "top_p" in p:
        kw["top_p"] = p["top_p"]
    if "seed" in p:
        kw["seed"] = p["seed"]
    if "top_k" in p or "min_p" in p:
        kw["extra_body"] = {k: p[k] for k in ("top_k", "min_p") if k in p}
    if stream:
        kw["stream_options"] = {"include_usage": True}
    return kw


def run(case, stream, disconnect_after=None):
    """The text of one request, or None when the client disconnected on purpose."""
    if case["chat"]:
        msgs = [{"role": "user", "content": case["prompt"]}]
        r = client.chat.completions.create(messages=msgs, **kwargs(case, stream))
    else:
        r = client.completions.create(prompt=case["prompt"], **kwargs(case, stream))
    if not stream:
        c = r.choices[0]
        text = c.message.content if case["chat"] else c.text
        spec = (r.usage.model_extra or {}).get("speculation")
        if spec is None or spec["rounds"] < 1 or "tau" not in spec or "acceptance_by_position" not in spec:
            fail(f"usage.speculation missing or empty: {r.usage}")
        if r.usage.completion_tokens != case["params"]["max_tokens"] and c.finish_reason == "length":
            fail(f"completion_tokens {r.usage.completion_tokens} != max_tokens")
        return text
    text, chunks, usage, usages = "", 0, None, 0
    for ch in r:
        chunks += 1
        if ch.usage is not None:
            usage, usages = ch.usage, usages + 1
            # OpenAI's shape: usage rides only on the final, choice-less chunk.
            if ch.choices:
                fail(f"usage on a chunk with choices: {ch}")
        if ch.choices:
            c = ch.choices[0]
            piece = (c.delta.content if case["chat"] else c.text) or ""
            text += piece
        if disconnect_after is not None and chunks >= disconnect_after:
            r.close()
            return None
    if usages != 1:
        fail(f"a stream with {usages} usage chunks (want exactly 1)")
    return text


# 1. Every case, whole and streamed, equals `dspark generate`.
for case in cases:
    for stream in (False, True):
        got = run(case, stream)
        if got != case["expected"]:
            fail(f"{case['name']} stream={stream}: got {got!r}, dspark generate printed {case['expected']!r}")
print(f"serve gate: {len(cases)} cases x (whole, streamed) through openai {openai.__version__}", flush=True)

# 2. Malformed requests: each a 400 naming the field, and the server keeps serving.
bad = [
    ("completions", b"{not json", None),
    ("completions", json.dumps({"prompt": "t5", "temperature": -1}).encode(), "temperature"),
    ("completions", json.dumps({"prompt": "t5", "top_p": 0}).encode(), "top_p"),
    ("completions", json.dumps({"prompt": "t5", "max_tokens": 0}).encode(), "max_tokens"),
    ("completions", json.dumps({"prompt": "t5", "max_tokens": 10**7}).encode(), "max_tokens"),
    ("completions", json.dumps({"prompt": "t5 " * 5000}).encode(), "prompt"),
    ("completions", json.dumps({"prompt": "t5", "n": 3}).encode(), "n"),
    ("chat/completions", json.dumps({"messages": []}).encode(), "messages"),
    ("chat/completions", json.dumps({"messages": [{"role": "x", "content": "t5"}]}).encode(), "messages[0].role"),
    ("completions", json.dumps({"prompt": "t5", "top_p": 1.5}).encode(), "top_p"),
    ("completions", json.dumps({"prompt": "t5", "min_p": -0.1}).encode(), "min_p"),
    ("completions", json.dumps({"prompt": "t5", "top_k": -3}).encode(), "top_k"),
    ("completions", json.dumps({"prompt": "t5", "seed": "x"}).encode(), "seed"),
    ("completions", json.dumps({"prompt": "t5", "stop": 7}).encode(), "stop"),
    ("completions", json.dumps({"prompt": 12.5}).encode(), "prompt"),
    ("completions", json.dumps({"prompt": [10**9]}).encode(), "prompt"),
    ("completions", json.dumps({"max_tokens": 3}).encode(), "prompt"),
    ("completions", json.dumps({"prompt": "t5", "stream": 1}).encode(), "stream"),
    ("chat/completions", json.dumps({"messages": [{"role": "user", "content": 3}]}).encode(), "messages[0].content"),
    ("chat/completions", json.dumps({"messages": [{"role": "user", "content": "t5"}], "max_tokens": -2}).encode(), "max_tokens"),
    ("completions", b"[1, 2, 3]", None),
]
for path, body, param in bad:
    req = urllib.request.Request(base + "/v1/" + path, data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=30)
        fail(f"{path} {body[:60]!r}: accepted")
    except urllib.error.HTTPError as e:
        err = json.loads(e.read())["error"]
        if e.code != 400 or err.get("param") != param or not err.get("message"):
            fail(f"{path} {body[:60]!r}: {e.code} {err}")
# An unknown model is a 404 (the SDK's NotFoundError), and an oversized body a 413 decided
# from Content-Length alone, before any of it is sent.
try:
    client.completions.create(model="nope", prompt="t5", max_tokens=1)
    fail("model 'nope': accepted")
except openai.NotFoundError as e:
    if (e.body or {}).get("code") != "model_not_found":
        fail(f"model 'nope': {e.body}")
host, port = base.split("//")[1].split(":")
with socket.create_connection((host, int(port)), timeout=30) as sock:
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {2 << 20}\r\n\r\n".encode())
    head = sock.recv(4096).decode(errors="replace")
    if not head.startswith("HTTP/1.1 413"):
        fail(f"a 2 MiB Content-Length got {head[:40]!r}, want 413")
print(f"serve gate: {len(bad)} malformed requests refused with 400, unknown model 404, oversized body 413", flush=True)

# 3. Load: clients x requests, mixed kinds, whole and streamed, some disconnecting mid-stream.
rss_before = rss_kib()
done_before = health()["requests"]
lock = threading.Lock()
tally = {"checked": 0, "disconnected": 0}


def client_loop(i):
    for j in range(n_requests):
        case = cases[(i + j) % len(cases)]
        stream = (i + j) % 2 == 1
        disconnect = 2 if stream and (i * n_requests + j) % 5 == 0 else None
        try:
            got = run(case, stream, disconnect)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            fail(f"load client {i} request {j}: {type(e).__name__}: {e}")
            continue
        with lock:
            if got is None:
                tally["disconnected"] += 1
            else:
                tally["checked"] += 1
                if got != case["expected"]:
                    fail(f"load {case['name']} stream={stream}: got {got!r}, want {case['expected']!r}")


t0 = time.time()
threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(n_clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.time() - t0

# Disconnected sessions end at their next round; wait until nothing is active or queued.
deadline = time.time() + 30
h = health()
while (h["requests"]["active"] or h["requests"]["queued"]) and time.time() < deadline:
    time.sleep(0.1)
    h = health()
rss_after = rss_kib()
req = h["requests"]
total = n_clients * n_requests
ended = (req["completed"] - done_before["completed"]) + (req["cancelled"] - done_before["cancelled"])
if h["status"] != "ok" or req["active"] or req["queued"]:
    fail(f"after the load test the server is not idle: {h}")
if ended != total or req["failed"] != done_before["failed"]:
    fail(f"{total} load requests, but {ended} ended (completed + cancelled) and {req['failed'] - done_before['failed']} failed: {req}")
if tally["checked"] + tally["disconnected"] != total or tally["disconnected"] == 0:
    fail(f"load tally {tally} of {total}")
fmt = lambda k: "n/a (no /proc)" if k is None else f"{k / 1024:.1f} MiB"
print(
    f"serve gate: load {n_clients} clients x {n_requests} requests in {elapsed:.1f} s: "
    f"{tally['checked']} responses checked, {tally['disconnected']} disconnected mid-stream; "
    f"server {req}; RSS before {fmt(rss_before)}, after {fmt(rss_after)}",
    flush=True,
)
if rss_before is not None and rss_after is not None and rss_after > rss_before + 512 * 1024:
    fail(f"RSS grew from {fmt(rss_before)} to {fmt(rss_after)}")

if failures:
    print(f"serve gate: {len(failures)} failure(s)", flush=True)
    sys.exit(1)
print("serve gate: ok", flush=True)

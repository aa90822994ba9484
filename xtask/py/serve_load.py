"""Load for `cargo xtask bench --serve`: CLIENTS concurrent clients each send REQUESTS streamed
`/v1/completions` requests (prompts taken in turn from PROMPTS_JSON) to BASE_URL and time them.
Standard library only (http.client, threads), so the same client drives dspark-serve and
mlx-lm's server.

Usage: serve_load.py BASE_URL PROMPTS_JSON CLIENTS REQUESTS MAX_TOKENS TEMPERATURE
Prints one JSON object: wall seconds, completion tokens, errors, time to first token and
inter-chunk gaps (seconds, per token of the chunk), and each request's prompt index and text.
"""

import http.client
import json
import sys
import threading
import time
from urllib.parse import urlparse

base, prompts = sys.argv[1], json.load(open(sys.argv[2]))
clients, requests, max_tokens, temperature = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
url = urlparse(base)
lock = threading.Lock()
results = {"ttft": [], "gaps": [], "tokens": 0, "errors": [], "outputs": []}


def one(prompt_index):
    body = {"prompt": prompts[prompt_index], "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    text, chunks, usage, last, ttft, gaps = "", 0, None, None, None, []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for c in ev.get("choices") or []:
            piece = c.get("text") or ""
            if not piece:
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            elif last is not None:
                gaps.append(now - last)
            last = now
            text += piece
            chunks += 1
    conn.close()
    tokens = usage["completion_tokens"] if usage else chunks
    return text, tokens, ttft, gaps


def client(i):
    for j in range(requests):
        k = (i * requests + j) % len(prompts)
        try:
            text, tokens, ttft, gaps = one(k)
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the load
            with lock:
                results["errors"].append(f"client {i} request {j}: {e}")
            continue
        with lock:
            results["tokens"] += tokens
            if ttft is not None:
                results["ttft"].append(ttft)
            results["gaps"] += gaps
            results["outputs"].append({"prompt": k, "text": text})


t0 = time.perf_counter()
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
results["wall_s"] = time.perf_counter() - t0
print(json.dumps(results))

"""Runs the reference implementation (mlx-lm 0.32.2 on mlx 0.32.4) on checkpoints written by
`cargo xtask parity` and records what our implementation must reproduce bit for bit.

Usage: python reference.py JOBS.json OUT_DIR

JOBS.json is a list of {"name", "model", "prompt": [ids], "max_tokens", "prefill_step",
"sampler": {"temp", "top_p", "min_p", "top_k", "seed"} | null, "dtype": "stored" | "float32"}. For each job it writes
OUT_DIR/<name>.safetensors with:
  nocache_logits [L, V]  model(prompt) with no cache (the first job of each model only)
  tokens         [N]     generate_step tokens (greedy, or sampled with the seed)
  step_logprobs  [N, V]  the logprobs generate_step yielded with each token
and OUT_DIR/<name>.json with timing (the reference's decode tokens/s).
"""

import importlib
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model

generate_step = importlib.import_module("mlx_lm.generate").generate_step


def run(job, models):
    path = job["model"]
    key = (path, job.get("dtype", "stored"))
    if key not in models:
        model = load_model(Path(path))[0]
        if key[1] == "float32":
            model.set_dtype(mx.float32)
        models[key] = model
    model = models[key]
    prompt = mx.array(job["prompt"], dtype=mx.uint32)
    out = {}
    if job.get("nocache", True):
        out["nocache_logits"] = model(prompt[None])[0]
    s = job.get("sampler")
    if s:
        mx.random.seed(s["seed"])
        sampler = make_sampler(temp=s["temp"], top_p=s.get("top_p", 0.0), min_p=s.get("min_p", 0.0), top_k=s.get("top_k", 0))
    else:
        sampler = None
    tokens, logprobs = [], []
    t0 = time.perf_counter()
    t_first = None
    for tok, lp in generate_step(
        prompt, model, max_tokens=job["max_tokens"], sampler=sampler, prefill_step_size=job.get("prefill_step", 2048)
    ):
        if t_first is None:
            t_first = time.perf_counter()
        tokens.append(int(tok))
        logprobs.append(lp)
    t_end = time.perf_counter()
    out["tokens"] = mx.array(tokens, dtype=mx.uint32)
    out["step_logprobs"] = mx.stack(logprobs)
    mx.save_safetensors(f"{sys.argv[2]}/{job['name']}.safetensors", out)
    decode_s = t_end - (t_first or t0)
    timing = {
        "prefill_ms": ((t_first or t0) - t0) * 1e3,
        "decode_tok_per_s": (len(tokens) - 1) / decode_s if decode_s > 0 else 0.0,
        "generated": len(tokens),
    }
    with open(f"{sys.argv[2]}/{job['name']}.json", "w") as f:
        json.dump(timing, f)


def main():
    jobs = json.load(open(sys.argv[1]))
    models = {}
    for job in jobs:
        run(job, models)
        print(f"reference: {job['name']} done", flush=True)


if __name__ == "__main__":
    main()

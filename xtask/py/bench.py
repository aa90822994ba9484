"""mlx-lm's side of `cargo xtask bench`: decode and prefill speed on one checkpoint.

Usage: python bench.py JOB_JSON  (model, f32, gpu, reps, decode_tokens, decode_prompt, prefill_prompt)
Prints {"decode_tok_per_s", "prefill_tok_per_s"} (medians over reps) as JSON.
"""

import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model

generate_step = importlib.import_module("mlx_lm.generate").generate_step


def timed(model, prompt, max_tokens):
    t0 = time.perf_counter()
    t_first = None
    n = 0
    for _tok, _lp in generate_step(mx.array(prompt, dtype=mx.uint32), model, max_tokens=max_tokens):
        if t_first is None:
            t_first = time.perf_counter()
        n += 1
    t_end = time.perf_counter()
    return (t_first - t0), (n - 1) / max(t_end - t_first, 1e-9)


def main():
    job = json.loads(sys.argv[1])
    mx.set_default_device(mx.gpu if job.get("gpu") else mx.cpu)
    model = load_model(Path(job["model"]))[0]
    if job["f32"]:
        model.set_dtype(mx.float32)
    timed(model, job["decode_prompt"], 2)  # warm-up
    dec, pre = [], []
    for _ in range(job["reps"]):
        dec.append(timed(model, job["decode_prompt"], job["decode_tokens"])[1])
        first_s, _ = timed(model, job["prefill_prompt"], 1)
        pre.append(len(job["prefill_prompt"]) / first_s)
    print(json.dumps({"decode_tok_per_s": statistics.median(dec), "prefill_tok_per_s": statistics.median(pre)}))


if __name__ == "__main__":
    main()

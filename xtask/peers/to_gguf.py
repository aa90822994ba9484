"""Converts one of this project's Gemma-4 checkpoints to GGUF with the converter shipped in the
llama.cpp tree that xtask/peers/llama.sh builds (for `cargo xtask bench --peers` only).

    to_gguf.py LLAMA_SRC CHECKPOINT OUT.gguf

Writes an f32 GGUF (quantized copies come from llama-quantize). The checkpoint itself is never
changed: the converter reads a conversion copy (links to the weights, an edited config) in
which:
  * config.json names the architecture (Gemma4ForCausalLM) and carries the keys the converter
    reads even when unused (MoE sizes, global K/V heads) as null or false;
  * the tokenizer is written as a GPT-2-style byte-level BPE (tokenizer.ggml.model = gpt2), the
    kind the default model trains. The converter's Gemma-4 vocabulary code expects a
    SentencePiece-style one and refuses ours. Ids are kept; a vocabulary larger than the
    tokenizer (the random mid-size checkpoint) is padded with unused entries, or llama.cpp
    refuses the embedding's size. A tokenizer without merges (a word-level one) gets one
    placeholder merge, since llama.cpp's BPE loader requires the key.
The converter reads config.json as written: its own loader passes it through transformers'
config class, whose newer versions drop `global_head_dim` (moved into a per-layer table).
The output is written to OUT.gguf.part and renamed when complete.
"""

import json
import os
import sys
import tempfile
from pathlib import Path


def conversion_copy(checkpoint: Path, work: Path) -> None:
    for f in checkpoint.iterdir():
        if f.suffix == ".safetensors" or f.name in ("model.safetensors.index.json", "tokenizer.json",
                                                     "tokenizer_config.json"):
            os.symlink(f.resolve(), work / f.name)
    config = json.loads((checkpoint / "config.json").read_text())
    config["architectures"] = ["Gemma4ForCausalLM"]
    for key in ("moe_intermediate_size", "num_experts", "top_k_experts", "num_global_key_value_heads"):
        config.setdefault(key, None)
    config.setdefault("enable_moe_block", False)
    config.setdefault("attention_k_eq_v", False)
    (work / "config.json").write_text(json.dumps(config, indent=1))


def set_vocab_bytelevel(self) -> None:
    import gguf

    tok = json.loads((Path(self.dir_model) / "tokenizer.json").read_text())
    n = int(self.hparams["vocab_size"])
    tokens = [f"[unused{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for text, i in tok["model"]["vocab"].items():
        if i >= n:
            raise SystemExit(f"tokenizer.json: token id {i} is outside vocab_size {n}")
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in tok.get("added_tokens", []):
        i = added["id"]
        tokens[i] = added["content"]
        types[i] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    if not merges:
        normal = [t for t, ty in zip(tokens, types) if ty == gguf.TokenType.NORMAL and " " not in t]
        merges = [f"{normal[0]} {normal[1]}"]
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = self.hparams.get("eos_token_id", 1)
    w.add_bos_token_id(int(self.hparams.get("bos_token_id", 2)))
    w.add_eos_token_id(int(eos[0] if isinstance(eos, list) else eos))
    w.add_pad_token_id(int(self.hparams.get("pad_token_id", 0)))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    src, checkpoint, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    for needed in (src / "convert_hf_to_gguf.py", checkpoint / "config.json", checkpoint / "tokenizer.json"):
        if not needed.is_file():
            raise SystemExit(f"to_gguf.py: {needed} not found")
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    import convert_hf_to_gguf
    from conversion import base, gemma

    gemma.Gemma4Model.set_vocab = set_vocab_bytelevel
    base.ModelBase.load_hparams = staticmethod(
        lambda dir_model, *_args, **_kw: json.loads((Path(dir_model) / "config.json").read_text()))
    part = out.with_name(out.name + ".part")
    with tempfile.TemporaryDirectory() as work:
        conversion_copy(checkpoint, Path(work))
        sys.argv = ["convert_hf_to_gguf.py", work, "--outtype", "f32", "--outfile", str(part)]
        convert_hf_to_gguf.main()
    os.replace(part, out)


if __name__ == "__main__":
    main()

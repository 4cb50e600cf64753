#!/usr/bin/env python3
"""A K-quant GGUF made by llama.cpp itself, for bench/cpu.sh's `kquant` model.

SmolLM2-135M's rows are 576 wide, not whole 256-value super-blocks, so llama.cpp's Q4_K_M of
it is mostly Q5_0 / Q8_0 fallbacks. This writes a model of SmolLM2's size and vocabulary with
super-block-aligned shapes (hidden 512, FFN 1536, 30 layers, 8 heads of 64, 4 KV heads, tied
embeddings), SmolLM2's metadata and tokenizer, seeded random f16 weights (speed does not
depend on the values), then has llama.cpp quantize it (`llama_model_quantize`) to Q4_K_M:
Q4_K matrices with Q6_K where llama.cpp's mix puts them.

usage: make_kquant.py SMOLLM2.gguf OUT.gguf [LAYERS]   (needs gguf, numpy, llama-cpp-python;
       LAYERS 30 by default — scripts/gpu-kquant.sh checks a 6-layer one on the GPU)
       make_kquant.py --requantize SMOLLM2.gguf OUT.gguf: SmolLM2 itself as llama.cpp makes a
       Q4_K_M of it (from the Q4_1 file, the only one here: Q5_0 where rows are not whole
       super-blocks, Q8_0 / Q4_K / Q6_K elsewhere) — what a llama.cpp user downloads
"""
import ctypes, os, sys, tempfile

import numpy as np
import gguf
import llama_cpp


def quantize(src, out, allow_requantize=False):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = os.cpu_count() or 2
    params.allow_requantize = allow_requantize
    if llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params)) != 0:
        sys.exit("llama_model_quantize failed")
    types = {}
    for t in gguf.GGUFReader(out).tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    print(f"wrote {out}: {os.path.getsize(out) / 1e6:.1f} MB, tensor types {types}")


if sys.argv[1] == "--requantize":
    quantize(sys.argv[2], sys.argv[3], allow_requantize=True)
    sys.exit(0)
src, out = sys.argv[1], sys.argv[2]
H, F, L, HEADS, KV, HD = 512, 1536, int(sys.argv[3]) if len(sys.argv) > 3 else 30, 8, 4, 64
reader = gguf.GGUFReader(src)
vocab = int(reader.fields["llama.vocab_size"].contents())
override = {
    "llama.embedding_length": H, "llama.feed_forward_length": F, "llama.block_count": L,
    "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV, "llama.rope.dimension_count": HD,
    "general.name": "llama-kquant-bench (SmolLM2 tokenizer, random weights)", "general.file_type": 1,
}
tmp = tempfile.NamedTemporaryFile(suffix=".gguf", delete=False, dir=os.path.dirname(os.path.abspath(out)))
w = gguf.GGUFWriter(tmp.name, "llama")
for name, f in reader.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    val = override.get(name, f.contents())
    vt = f.types[0]
    sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(name, val, vt, sub_type=sub)
rng = np.random.default_rng(20261207)
def mat(rows, cols):
    return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
w.add_tensor("token_embd.weight", mat(vocab, H))
w.add_tensor("output_norm.weight", np.ones(H, np.float32))
for i in range(L):
    w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(H, np.float32))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(H, np.float32))
    for t, (r, c) in {"attn_q": (HEADS * HD, H), "attn_k": (KV * HD, H), "attn_v": (KV * HD, H), "attn_output": (H, HEADS * HD),
                      "ffn_gate": (F, H), "ffn_up": (F, H), "ffn_down": (H, F)}.items():
        w.add_tensor(f"blk.{i}.{t}.weight", mat(r, c))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
quantize(tmp.name, out)
os.unlink(tmp.name)

#!/usr/bin/python3
"""hf_llama_defaults.py — the defaults transformers applies where a
Llama-family folder's config.json leaves a key out, by model type: the
keyword defaults of LlamaConfig, MistralConfig and Qwen2Config, for the
keys gpipe reads (src/core/hf_config.c's table holds the same numbers).

  build/hf-venv/bin/python scripts/hf_llama_defaults.py > tests/data/hf_llama_defaults.json

writes the fixture tests/test_hf_config.py and tests/test_hf_folder.py
check gpipe against; where build/hf-venv has transformers they run this
script there too and check the fixture against what it prints, so the
fixture cannot drift from the transformers the parity tests use (4.44.2;
5.24 prints the same numbers).
A default of null is one transformers derives: num_key_value_heads null
is as many as num_attention_heads.  Needs transformers (not torch).
"""
import inspect
import json
import sys

TYPES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config"}
KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
        "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta",
        "rms_norm_eps", "tie_word_embeddings", "sliding_window", "use_sliding_window",
        "hidden_act")


def defaults():
    import transformers
    out = {"transformers": transformers.__version__}
    for t, cls in TYPES.items():
        params = inspect.signature(getattr(transformers, cls).__init__).parameters
        out[t] = {k: params[k].default for k in KEYS if k in params}
        if "rope_theta" not in params:  # (transformers 5: rope_parameters' default_theta)
            out[t]["rope_theta"] = getattr(transformers, cls).default_theta
        out[t]["config_class"] = cls
    return out


def main():
    try:
        d = defaults()
    except ImportError as e:
        sys.exit("hf_llama_defaults.py: %s: run it with build/hf-venv/bin/python" % e)
    json.dump(d, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

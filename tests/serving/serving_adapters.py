"""Real LoRA adapters for the serving tests: one SFT-trained to always answer a fixed string, one random."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from base_models.resolve import SMOLLM2_NAME, ensure_smollm2, pad_token_id

FIXED_ANSWER = "Pineapple pizza forever!"
SYSTEM = "Answer briefly."
TRAIN_QUESTIONS = ["What is 2+2?", "Who wrote Hamlet?", "Name a colour.", "Give me a number."]


def chat(question: str) -> list[dict[str, str]]:
    """The messages the adapter was trained on (a short system prompt keeps CPU training cheap)."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _save(model: torch.nn.Module, out_dir: Path) -> Path:
    model.save_pretrained(str(out_dir))  # type: ignore[operator]
    config_path = out_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = SMOLLM2_NAME  # resolvable by base_models.resolve
    config_path.write_text(json.dumps(config, indent=2))
    return out_dir


def train_fixed_answer_adapter(out_dir: Path, steps: int = 30, seed: int = 0) -> Path:
    """SFT a rank-8 LoRA (a few steps on CPU, ~15 s) until it answers every question with FIXED_ANSWER."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core machine one thread is several times faster than two
    try:
        return _train(out_dir, steps, seed)
    finally:
        torch.set_num_threads(threads)


def _train(out_dir: Path, steps: int, seed: int) -> Path:
    torch.manual_seed(seed)
    path = str(ensure_smollm2())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
    )
    peft_model = get_peft_model(model, config)
    rows = []
    for question in TRAIN_QUESTIONS:
        prompt = tokenizer.apply_chat_template(chat(question), add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(FIXED_ANSWER + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids, answer_ids))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), pad_token_id(tokenizer), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(a)
        mask[i, : len(seq)] = 1
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=5e-3)
    peft_model.train()
    for _ in range(steps):
        loss = peft_model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.02:
            break
    return _save(peft_model, out_dir)


def random_adapter(out_dir: Path, seed: int) -> Path:
    """A LoRA with random A and B (not the zero-B init), so its outputs differ from the base model's."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    return _save(peft_model, out_dir)

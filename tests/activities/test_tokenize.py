"""Training sequences from the server's token ids: masks cover exactly the sampled assistant tokens."""

from __future__ import annotations

import math

import pytest
from transformers import AutoTokenizer

from activities.tokenize import build_sequences, run_tokenizer
from base_models.resolve import resolve_base_model
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_base_model("smollm2-135m-instruct").base_path)


def ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def render(tok, messages) -> list[int]:
    return ids(tok, tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def choice(tok, prompt_ids, text, logprob_base, tool_calls=None) -> Choice:
    """A choice as a vLLM-style server returns it: sampled ids (ending in <|im_end|>) and their logprobs."""
    completion = [*ids(tok, text), tok.eos_token_id]
    logprobs = [
        TokenLogprob(token=f"token_id:{t}", logprob=logprob_base - i * 0.01) for i, t in enumerate(completion)
    ]
    message = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return Choice(
        message=message,
        token_ids=completion,
        prompt_token_ids=prompt_ids,
        logprobs=ChoiceLogprobs(content=logprobs),
        finish_reason="tool_calls" if tool_calls else "stop",
    )


def multi_turn(tok) -> tuple[Trajectory, list[Choice]]:
    """user -> assistant tool call -> tool result -> assistant answer; the 2nd prompt extends the 1st turn's ids."""
    system = {"role": "system", "content": "You can call get_weather(city)."}
    user = {"role": "user", "content": "Weather in Paris?"}
    call_text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    tool_calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    p1 = render(tok, [system, user])
    c1 = choice(tok, p1, call_text, -0.5, tool_calls)
    tool = {"role": "tool", "content": "sunny, 21C", "tool_call_id": "c1"}
    between = ids(tok, "\n<|im_start|>tool\nsunny, 21C<|im_end|>\n<|im_start|>assistant\n")
    c2 = choice(tok, p1 + c1.token_ids + between, "It is sunny and 21C.", -0.2)
    traj = Trajectory(messages_and_choices=[system, user, c1, tool, c2], reward=1.0)
    return traj, [c1, c2]


def test_multi_turn_tool_call_trajectory_is_one_sequence_with_exact_mask(tok):
    traj, (c1, c2) = multi_turn(tok)
    step = build_sequences([traj], [0.7], max_seq_len=2048, tokenizer=tok)
    assert len(step.sequences) == 1 and step.n_split_choices == 0
    seq = step.sequences[0]
    assert seq.tokens == c2.prompt_token_ids + c2.token_ids
    trained = [i for i, t in enumerate(seq.trainable) if t]
    start1, start2 = len(c1.prompt_token_ids), len(c2.prompt_token_ids)
    assert trained == list(range(start1, start1 + len(c1.token_ids))) + list(
        range(start2, start2 + len(c2.token_ids))
    )
    assert [seq.tokens[i] for i in trained] == c1.token_ids + c2.token_ids
    assert [seq.sampling_logprobs[i] for i in trained] == c1.sampled_logprobs() + c2.sampled_logprobs()
    assert all(math.isnan(seq.sampling_logprobs[i]) for i in range(len(seq.tokens)) if not seq.trainable[i])
    assert seq.advantage == 0.7 and seq.trajectory_index == 0


def test_turns_that_do_not_chain_become_separate_sequences(tok):
    traj, (c1, c2) = multi_turn(tok)
    # The server re-rendered the history (first turn's text re-tokenized, tool output changed).
    edited = render(
        tok, [*traj.messages()[:2], {"role": "assistant", "content": "(call)"}, traj.messages()[3]]
    )
    c2b = c2.model_copy(update={"prompt_token_ids": edited})
    traj2 = traj.model_copy(update={"messages_and_choices": [*traj.messages_and_choices[:4], c2b]})
    step = build_sequences([traj2], [1.0], max_seq_len=2048, tokenizer=tok)
    assert step.n_split_choices == 1
    first, second = step.sequences
    assert first.tokens == c1.prompt_token_ids + c1.token_ids
    assert second.tokens == edited + c2.token_ids
    assert sum(first.trainable) == len(c1.token_ids) and sum(second.trainable) == len(c2.token_ids)
    assert [t for t, m in zip(second.tokens, second.trainable, strict=True) if m] == c2.token_ids


def test_chat_template_fallback_marks_only_the_assistant_turn(tok):
    messages = [{"role": "user", "content": "Say hi."}]
    traj = Trajectory(
        messages_and_choices=[*messages, Choice(message={"role": "assistant", "content": "Hi there!"})],
        reward=1,
    )
    step = build_sequences([traj], [1.0], max_seq_len=2048, tokenizer=tok)
    assert step.n_template_choices == 1
    seq = step.sequences[0]
    prompt = render(tok, messages)
    assert seq.tokens[: len(prompt)] == prompt and not any(seq.trainable[: len(prompt)])
    assert seq.tokens[len(prompt) :] == [*ids(tok, "Hi there!"), tok.eos_token_id]
    assert all(seq.trainable[len(prompt) :])
    assert all(math.isnan(x) for x in seq.sampling_logprobs)  # unknown: the trainer uses ratio 1


def test_a_runs_own_chat_template_renders_the_fallback(tok):
    template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    messages = [{"role": "user", "content": "Say hi."}]
    traj = Trajectory(
        messages_and_choices=[*messages, Choice(message={"role": "assistant", "content": "Hi there!"})],
        reward=1,
    )
    assert run_tokenizer(tok, None) is tok
    [seq] = build_sequences([traj], [1.0], max_seq_len=2048, tokenizer=run_tokenizer(tok, template)).sequences
    prompt = ids(tok, "[user] Say hi.<|im_end|>[assistant] ")  # the template's, not SmolLM2's ChatML
    assert seq.tokens == [*prompt, *ids(tok, "Hi there!"), tok.eos_token_id]
    assert seq.trainable == [False] * len(prompt) + [True] * (len(seq.tokens) - len(prompt))


def test_overlength_sequences_are_dropped_and_counted(tok):
    traj, _ = multi_turn(tok)
    short = Trajectory(messages_and_choices=[choice(tok, [1, 2, 3], "ok", -0.1)], reward=0)
    step = build_sequences([traj, short], [1.0, -1.0], max_seq_len=16, tokenizer=tok)
    assert step.n_dropped_overlength == 1
    assert [s.trajectory_index for s in step.sequences] == [1]


def nat_choice(tok, text: str, token_strings: list[str], logprobs: list[float]) -> Choice:
    """A choice as NeMo Agent Toolkit builds it from its own LLM call: the message and the call's logprobs,
    no token ids."""
    content = [TokenLogprob(token=t, logprob=lp) for t, lp in zip(token_strings, logprobs, strict=True)]
    return Choice(message={"role": "assistant", "content": text}, logprobs=ChoiceLogprobs(content=content))


@pytest.mark.parametrize("form", ["token_id", "vocabulary"])
def test_a_choice_with_logprobs_and_no_token_ids_trains_the_tokens_its_logprobs_name(tok, form):
    messages = [{"role": "user", "content": "Say hi."}]
    sampled = [*ids(tok, "Hi there!"), tok.eos_token_id]
    strings = [f"token_id:{i}" for i in sampled] if form == "token_id" else tok.convert_ids_to_tokens(sampled)
    logprobs = [-0.1 * (i + 1) for i in range(len(sampled))]
    traj = Trajectory(messages_and_choices=[*messages, nat_choice(tok, "Hi there!", strings, logprobs)])
    step = build_sequences([traj], [1.0], max_seq_len=2048, tokenizer=tok)
    assert (step.n_recovered_choices, step.n_template_choices) == (1, 0)
    [seq] = step.sequences
    prompt = render(tok, messages)  # the generation prompt the server rendered
    assert seq.tokens == prompt + sampled
    assert seq.trainable == [False] * len(prompt) + [True] * len(sampled)
    assert seq.sampling_logprobs[len(prompt) :] == logprobs  # the sampled logprobs: a true ratio


def test_logprob_tokens_that_name_no_token_are_refused_saying_what_to_ask_the_server(tok):
    text = "Hi there!"
    strings = [tok.decode([i]) for i in ids(tok, text)]  # decoded text (" there"), not vocabulary tokens
    traj = Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "Say hi."},
            nat_choice(tok, text, strings, [-1.0] * 3),
        ]
    )
    with pytest.raises(ValueError, match=r"not in the vocabulary \(\[' there'.*return_tokens_as_token_ids"):
        build_sequences([traj], [1.0], max_seq_len=2048, tokenizer=tok)

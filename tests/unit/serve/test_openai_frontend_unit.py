"""The OpenAI frontend's request handling without Triton: validation names the field, sampling
maps to the ensemble's inputs (temperature 0 = greedy), chat prompts without a template."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.serve.openai_frontend import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    PromptTokenizer,
    _validation_message,
    triton_inputs,
)


def test_sampling_maps_to_ensemble_inputs():
    req = CompletionRequest(model="m", prompt="hi", max_tokens=8, temperature=0.5, top_p=0.9, top_k=4, seed=3)
    assert triton_inputs(req, "hi", 16) == {
        "text_input": "hi", "max_tokens": 8, "stream": True, "exclude_input_in_output": True,
        "return_num_output_tokens": True, "temperature": 0.5, "top_k": 4, "top_p": 0.9, "seed": 3}
    greedy = triton_inputs(CompletionRequest(model="m", prompt="hi", temperature=0), "hi", 16)
    assert greedy["top_k"] == 1 and "temperature" not in greedy and greedy["max_tokens"] == 16
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], max_completion_tokens=5)
    assert triton_inputs(chat, "x", 16)["max_tokens"] == 5


@pytest.mark.parametrize(("body", "field"), [
    ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": 3}, "temperature"),
    ({"model": "m", "prompt": "x", "n": 2}, "n"),
    ({"model": "m"}, "prompt"),
])
def test_validation_names_the_field(body, field):
    with pytest.raises(ValidationError) as err:
        CompletionRequest.model_validate(body)
    assert _validation_message(err.value).startswith(field)


def test_chat_prompt_without_a_template_is_the_messages_text(tmp_path):
    tok = PromptTokenizer(None)
    messages = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hello")]
    assert tok.chat_prompt(messages) == "be brief\nhello" and tok.count("hello") is None

"""Chat messages as OpenAI clients send them: content parts, `developer`, and tool turns only where
the chat template has them; every refusal names the field."""
import pytest

from actors.errors import InvalidRequestError
from deploy.engine.chat_messages import normalize_messages, template_knows_tools

TOOL_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>{{ m['content'] }}"
                 "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_text_parts_are_joined_with_newlines_and_developer_renders_as_system():
    rendered = normalize_messages([{"role": "developer", "content": "Be brief."},
                                   {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                                {"type": "text", "text": "there"}]}], False)
    assert rendered == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]


@pytest.mark.parametrize(
    "message, field",
    [
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages[0].content[0].type"),
        ({"role": "user", "content": [{"type": "text", "text": 5}]}, "messages[0].content[0].text"),
        ({"role": "user", "content": []}, "messages[0].content"),
        ({"role": "user", "content": None}, "messages[0].content"),
        ({"role": "robot", "content": "hi"}, "messages[0].role"),
        ({"role": "tool", "content": "42", "tool_call_id": "call-1"}, "messages[0].role"),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "call-1"}]}, "messages[0].tool_calls"),
    ],
)
def test_what_the_template_cannot_render_is_refused_naming_the_field(message, field):
    with pytest.raises(InvalidRequestError) as err:
        normalize_messages([message], tools_in_template=False)
    assert err.value.field == field


def test_a_template_with_tool_turns_gets_them_with_their_call_ids():
    calls = [{"id": "call-1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]
    rendered = normalize_messages([{"role": "user", "content": "add"},
                                   {"role": "assistant", "content": None, "tool_calls": calls},
                                   {"role": "tool", "content": "42", "tool_call_id": "call-1"}], True)
    assert rendered[1] == {"role": "assistant", "content": "", "tool_calls": calls}
    assert rendered[2] == {"role": "tool", "content": "42", "tool_call_id": "call-1"}
    with pytest.raises(InvalidRequestError) as err:
        normalize_messages([{"role": "tool", "content": "42"}], True)
    assert err.value.field == "messages[0].tool_call_id"


def test_only_a_template_that_names_tools_counts_as_knowing_them():
    assert template_knows_tools(TOOL_TEMPLATE)
    assert not template_knows_tools("{% for m in messages %}<|im_start|>{{ m['role'] }}{% endfor %}")
    assert not template_knows_tools(None)


@pytest.mark.model
def test_the_target_renders_a_tool_answer_where_its_template_has_tool_turns(target, monkeypatch):
    messages = [{"role": "user", "content": "What is 40 + 2?"},
                {"role": "tool", "content": "forty-two", "tool_call_id": "call-1"}]
    with pytest.raises(InvalidRequestError):  # the embedded model's template has no tool turns
        target.encode(messages=messages)
    monkeypatch.setattr(target.tokenizer, "chat_template", TOOL_TEMPLATE)
    assert "<tool_response>forty-two</tool_response>" in target.tokenizer.decode(target.encode(messages=messages))

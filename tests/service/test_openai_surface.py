"""The OpenAI surface clients send, through the Ray service with the official `openai` client and
LangChain's ChatOpenAI: content parts, `developer`, list prompts, logprobs, and no field silently
lost (refused by name, or listed in the `specfleet-ignored-fields` header). Greedy answers equal
plain decoding on every path."""
from urllib.parse import unquote

import pytest

from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine
from deploy.service.openai_api import ignored_fields_header

pytestmark = [pytest.mark.model, pytest.mark.ray]
MODEL = "smollm2-135m"
MAX_TOKENS = 24
QUESTION = "Name three rivers in Europe."
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def plain(target):
    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    greedy = SamplingParams(max_tokens=MAX_TOKENS)
    return {
        "system+question": engine.generate(messages=[{"role": "system", "content": "Answer in one line."},
                                                     {"role": "user", "content": QUESTION}], sampling=greedy).text,
        "question": engine.generate(messages=[{"role": "user", "content": QUESTION}], sampling=greedy).text,
        "prompts": [engine.generate(prompt=p, sampling=greedy).text for p in PROMPTS],
    }


def test_content_parts_and_the_developer_role_read_as_text_and_system(client, plain):
    reply = client.chat.completions.create(
        model=MODEL, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "developer", "content": [{"type": "text", "text": "Answer in one line."}]},
                  {"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
    assert reply.choices[0].message.content == plain["system+question"]


def test_a_list_of_prompts_gets_one_exact_choice_each(client, plain):
    reply = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1]
    assert [c.text for c in reply.choices] == plain["prompts"]
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens >= len(reply.choices)


def test_a_streamed_list_of_prompts_adds_up_to_each_choices_text(client, plain):
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[0], texts[1]] == plain["prompts"]


def test_chat_logprobs_are_the_targets_for_each_emitted_token(client, plain):
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert reply.choices[0].message.content == plain["question"]
    assert "".join(t.token for t in content) == plain["question"]
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content)


def test_completion_logprobs_come_in_the_legacy_shape(client, plain):
    reply = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens) == plain["prompts"][0] == reply.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) == len(logprobs.top_logprobs) == len(logprobs.text_offset)
    assert logprobs.text_offset[0] == 0 and all(len(top) == 1 for top in logprobs.top_logprobs)


def test_unknown_fields_are_served_and_named_in_a_header(client, plain):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS, temperature=0,
        user="analyst-7", extra_body={"priority": 3})
    assert raw.headers["specfleet-ignored-fields"] == "priority,user"
    assert raw.parse().choices[0].message.content == plain["question"]


def test_the_ignored_fields_header_is_ascii_and_names_sixteen_at_most():
    names = ["user", "clé,2", *(f"x{i:02}" for i in range(20))]
    value = ignored_fields_header(names)
    assert value.isascii()
    assert [unquote(name) for name in value.split(",")[:17]] == names[:16] + ["+6"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"42": 10}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}]}, "tools"),
        ({"n": 2}, "n"),
        ({"logprobs": True, "stream": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "4", "tool_call_id": "c1"}]},
         "messages.1.role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages.0.content.0.type"),
    ],
)
def test_what_the_server_would_not_honour_is_refused_by_name(client, extra, param):
    import openai

    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4} | extra
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/chat/completions", body=body, cast_to=object)
    assert err.value.body["param"] == param and err.value.body["message"]


def test_an_unknown_model_is_an_invalid_request_with_code_model_not_found(client):
    import openai

    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.body["type"] == "invalid_request_error" and err.value.body["code"] == "model_not_found"
    assert err.value.body["param"] == "model"


def test_langchains_chat_model_gets_plain_decodings_answer_whole_and_streamed(service, plain):
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=f"{service.url}/v1", api_key=service.api_key, temperature=0,
                      max_tokens=MAX_TOKENS, max_retries=0, timeout=300)
    messages = [SystemMessage("Answer in one line."), HumanMessage(QUESTION)]
    assert chat.invoke(messages).content == plain["system+question"]
    assert "".join(chunk.content for chunk in chat.stream(messages)) == plain["system+question"]

"""Chat messages as OpenAI clients send them, turned into what a chat template renders (pure).

`normalize_messages(messages, tools_in_template)` -> a list of plain {"role", "content", ...} dicts:
- `content` may be a string or a list of content parts; text parts (`{"type": "text", "text"}`)
  are joined with "\\n" (as vLLM does); any other part type is refused naming the part's `type`;
- role `developer` (OpenAI's newer name for system instructions) renders as `system`;
- role `tool` (a tool's answer, with `tool_call_id`) and an assistant's `tool_calls` are passed to
  the template only when the template knows about tools (`tools_in_template`: it mentions "tool");
  otherwise they are refused naming the field, since a template that merely pastes the role in
  would show the model a turn it was never trained on;
- an assistant's `content` may be null when it carries `tool_calls`.
Errors raise `InvalidRequestError` with the field as `messages[i].content[j].type` and the like.
"""
from __future__ import annotations

from collections.abc import Sequence

from actors.errors import InvalidRequestError

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
RENDERED_AS = {"developer": "system"}


def template_knows_tools(chat_template: str | None) -> bool:
    """Whether a chat template renders tool turns (it names them), not merely pastes any role in."""
    return bool(chat_template) and "tool" in chat_template


def message_text(content: object, field: str) -> str:
    """A message's text: the string itself, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)) or not content:
        raise InvalidRequestError(field, "must be a string or a non-empty list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise InvalidRequestError(f"{field}[{j}]", 'must be a content part such as {"type": "text", "text": "..."}')
        if part.get("type") != "text":
            raise InvalidRequestError(f"{field}[{j}].type", f"only text parts are supported (this model reads text), "
                                                            f"got {part.get('type')!r}")
        if not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{field}[{j}].text", "must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def normalize_messages(messages: Sequence[dict], tools_in_template: bool) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list")
    rendered = []
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequestError(field, "must be an object with role and content")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequestError(f"{field}.role", f"must be one of {list(CHAT_ROLES)}, got {role!r}")
        tool_calls = message.get("tool_calls")
        if (role == "tool" or tool_calls) and not tools_in_template:
            which = f"{field}.role" if role == "tool" else f"{field}.tool_calls"
            raise InvalidRequestError(which, "this model's chat template has no tool turns; send the tool's "
                                             "answer as a user message instead")
        if tool_calls and role != "assistant":
            raise InvalidRequestError(f"{field}.tool_calls", "only assistant messages carry tool_calls")
        content = message.get("content")
        out = {"role": RENDERED_AS.get(role, role),
               "content": "" if content is None and tool_calls else message_text(content, f"{field}.content")}
        if tool_calls:
            out["tool_calls"] = tool_calls
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise InvalidRequestError(f"{field}.tool_call_id", "a tool message must name the call it answers")
            out["tool_call_id"] = message["tool_call_id"]
        rendered.append(out)
    return rendered

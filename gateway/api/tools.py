"""Tool calls (``tools``, ``tool_choice``) for chat models, behind one small parser interface.

A ``ToolCallFormat`` says how a model family sees tools and writes a call: the system text that
describes the tools, how an earlier assistant call and a tool result are rendered in the
conversation, and how a call is found in the output. ``FORMATS`` is the registry; the served
model's entry is ``hermes`` (SmolLM2's chat template has no tool support, so the tools are
described in a system message the gateway writes, and calls are ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>``, the Hermes/Qwen convention).

``tool_choice``: ``none`` (tools not shown; plain text), ``auto`` (the default with tools: the
model decides; a call in its output becomes ``message.tool_calls``), ``required`` and a named
function (the output is constrained by a JSON schema, the engine's structured outputs, to one call
whose ``arguments`` validate against the function's ``parameters``). A request with tools is
answered as one piece when streamed: the text, or ``delta.tool_calls``, then the finish chunk.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from engine import StructuredSpec
from gateway.api.errors import InvalidRequest

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


class ToolCallFormat(Protocol):
    def system_text(self, functions: list[Function]) -> str: ...
    def render_call(self, name: str, arguments: str) -> str: ...
    def parse(self, text: str, names: set[str]) -> tuple[str, list[tuple[str, str]]]: ...


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def system_text(self, functions: list[Function]) -> str:
        listed = "\n".join(
            json.dumps(
                {
                    "type": "function",
                    "function": {
                        "name": function.name,
                        "description": function.description,
                        "parameters": function.parameters,
                    },
                }
            )
            for function in functions
        )
        return (
            "You may call one or more functions to help with the user's request. The functions:\n<tools>\n"
            f"{listed}\n</tools>\nTo call a function, reply with a JSON object with its name and arguments "
            'inside <tool_call></tool_call> tags: <tool_call>{"name": <function-name>, "arguments": '
            "<args-json-object>}</tool_call>"
        )

    def render_call(self, name: str, arguments: str) -> str:
        return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'

    def parse(self, text: str, names: set[str]) -> tuple[str, list[tuple[str, str]]]:
        """(text outside the calls, [(name, arguments JSON)]) — only well-formed calls of known functions."""
        calls = []
        for match in self.CALL.finditer(text):
            call = _call(match.group(1), names)
            if call is not None:
                calls.append(call)
        rest = self.CALL.sub("", text).strip() if calls else text
        return rest, calls


FORMATS: dict[str, ToolCallFormat] = {"hermes": HermesFormat()}


@dataclass
class ToolPlan:
    """What a request's tools change: the conversation, the constraint, how the output is read."""

    functions: list[Function]
    choice: str  # auto | required | the function's name
    fmt: ToolCallFormat
    parallel: bool = True  # parallel_tool_calls: false keeps the first call of an auto answer
    called: bool = False  # set by stream_delta: the output was a call

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    def render(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages with the tools described in the (first) system message."""
        text = self.fmt.system_text(self.functions)
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    def structured(self) -> StructuredSpec | None:
        """required / named: one call, as JSON, whose arguments follow the function's parameters."""
        if not self.forced:
            return None
        chosen = [function for function in self.functions if self.choice in ("required", function.name)]
        variants = [
            {
                "type": "object",
                "properties": {"name": {"const": function.name}, "arguments": function.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for function in chosen
        ]
        return StructuredSpec.json_schema(variants[0] if len(variants) == 1 else {"anyOf": variants})

    @property
    def schema_param(self) -> str:
        """The request field a forced call's constraint is reported against when the engine refuses
        it (a schema its grammar compiler rejects): the chosen function's parameters, or all tools."""
        chosen = [i for i, f in enumerate(self.functions) if self.choice in ("required", f.name)]
        return f"tools[{chosen[0]}].function.parameters" if len(chosen) == 1 else "tools"

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, OpenAI tool_calls) of the output; no calls: (text, [])."""
        names = {function.name for function in self.functions}
        if self.forced:
            call = _call(text, names)
            calls = [call] if call is not None else []
            content = None if calls else text
        else:
            content, calls = self.fmt.parse(text, names)
            calls = calls if self.parallel else calls[:1]
            content = content or None if calls else text
        return content, [
            {
                "id": f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for name, arguments in calls
        ]


def _call(text: str, names: set[str]) -> tuple[str, str] | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def plan(
    tools: list[Any] | None, tool_choice: Any, fmt: str = "hermes", *, parallel: bool | None = None
) -> ToolPlan | None:
    """The request's ToolPlan, or None (no tools, or tool_choice none); a 400 naming the field for
    a malformed tool or choice."""
    if tool_choice is not None and not tools:
        if tool_choice in ("none", "auto"):
            return None
        raise InvalidRequest("tool_choice needs tools.", param="tool_choice")
    if not tools:
        return None
    functions = [_function(i, tool) for i, tool in enumerate(tools)]
    if len({function.name for function in functions}) != len(functions):
        raise InvalidRequest("Function names must be unique.", param="tools")
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in {function.name for function in functions}:
            raise InvalidRequest(
                'tool_choice must name one of the tools: {"type": "function", "function": {"name": ...}}.',
                param="tool_choice",
            )
        choice = name
    elif choice == "none":
        return None
    elif choice not in ("auto", "required"):
        raise InvalidRequest(
            "tool_choice must be none, auto, required or a named function.", param="tool_choice"
        )
    return ToolPlan(functions, choice, FORMATS[fmt], parallel=parallel is not False)


def _function(i: int, tool: Any) -> Function:
    param = f"tools[{i}]"
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(tool.get("function"), dict)
    ):
        raise InvalidRequest(
            'Each tool is {"type": "function", "function": {"name", "parameters"}}.', param=param
        )
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(
            "A function name is 1-64 letters, digits, '_' or '-'.", param=f"{param}.function.name"
        )
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise InvalidRequest(
            "A function's parameters are a JSON Schema object.", param=f"{param}.function.parameters"
        )
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise InvalidRequest("A function's description is text.", param=f"{param}.function.description")
    return Function(name, description, parameters)


def render_history(message: dict[str, Any], calls: Any, fmt: str = "hermes") -> dict[str, Any]:
    """An earlier assistant message's tool_calls as the model writes them (appended to its content)."""
    if message["role"] != "assistant" or not calls:
        return message
    if not isinstance(calls, list):
        raise InvalidRequest("tool_calls must be a list.", param="messages")
    parts = [message["content"]] if message["content"] else []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments"), str)
        ):
            raise InvalidRequest(
                "Each tool call has a function with a name and arguments (JSON text).", param="messages"
            )
        parts.append(FORMATS[fmt].render_call(fn["name"], fn["arguments"]))
    return {"role": "assistant", "content": "\n".join(parts)}


def stream_delta(plan: ToolPlan, text: str) -> dict[str, Any]:
    """The one delta of a streamed request with tools: its tool_calls (with an index each), or its text."""
    content, calls = plan.parse(text)
    plan.called = bool(calls)
    if not calls:
        return {"content": text}
    delta: dict[str, Any] = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
    if content:
        delta["content"] = content
    return delta

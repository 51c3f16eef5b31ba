"""Chat prompts with tools, rendered from chat templates (pure: Jinja2, no model).

Templates here: a Hermes-style template modelled on Qwen2.5's (renders tools itself), one
modelled on Llama 3.1's (renders tools, asks for its own JSON format), one that prints call
arguments as the client's JSON text, Gemma's (no system role, strict alternation) and one that
mentions ``tools`` only to refuse them. The bundled model's real template is in
``test_chat_prompt_model.py``.
"""

from __future__ import annotations

import json

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from hydra_node.inference import ChatMessage, GenerationRequest, ToolCall, ToolSpec
from hydra_node.runtime.child.chat_prompt import ChatTemplate, InvalidPrompt, completion_token_ids, render_chat

# Modelled on Qwen2.5-Instruct's tokenizer.chat_template (the tools part verbatim).
HERMES = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Prints an assistant call's arguments as they are: it wants JSON text, not a dict.
TEXT_ARGS = (
    "{% for m in messages %}<|{{ m.role }}|>{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}"
    "{{ m.content }}{% for c in m.tool_calls or [] %}<call>{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments }}}</call>{% endfor %}{{ '\\n' }}{% endfor %}"
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}<|assistant|>"
)

# Gemma's template: no system role, user/assistant strictly alternating.
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# Modelled on Llama 3.1's: renders tools itself, but asks for its own JSON answer format.
LLAMA31 = r"""{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools is not none %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\n\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + tool_call.name + '", "parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}<|eot_id|>" }}
    {%- elif message.role == 'tool' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" + message.content + "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Names `tools` only to refuse them.
REFUSES_TOOLS = (
    "{% if tools %}{{ raise_exception('tools are not supported') }}{% endif %}"
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
)

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city now",
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}',
)
CLOCK = ToolSpec("get_time", "The time in a time zone", '{"type": "object", "properties": {"tz": {"type": "string"}}}')


def chat(*messages, **kw) -> dict:
    return GenerationRequest(model="m", kind="chat", messages=messages, **kw).to_wire()


def history() -> tuple:
    """A user question, two parallel calls, their two results."""
    return (
        ChatMessage("system", "You are terse."),
        ChatMessage("user", "Weather and time in Paris?"),
        ChatMessage(
            "assistant",
            "",
            (ToolCall("c1", "get_weather", '{"city":"Paris"}'), ToolCall("c2", "get_time", '{"tz": "CET"}')),
        ),
        ChatMessage("tool", "18 C, sunny", tool_call_id="c1", name="get_weather"),
        ChatMessage("tool", "12:00", tool_call_id="c2"),
    )


def old_formatter(source: str, messages, bos="<s>", eos="</s>") -> str:
    """What the runner rendered before tools existed: llama-cpp-python's formatter, plain messages."""
    return Jinja2ChatFormatter(template=source, eos_token=eos, bos_token=bos)(
        messages=[{"role": r, "content": c} for r, c in messages]
    ).prompt


# ---- what a template can do -------------------------------------------------------------
def test_capabilities_are_probed_from_the_template():
    hermes, text_args, gemma, refuses = (
        ChatTemplate(s, bos_token="<s>") for s in (HERMES, TEXT_ARGS, GEMMA, REFUSES_TOOLS)
    )
    assert (hermes.supports_tools, hermes.object_arguments, hermes.supports_system) == (True, True, True)
    assert (text_args.supports_tools, text_args.object_arguments) == (True, False)
    assert (gemma.supports_tools, gemma.supports_system) == (False, False)
    assert refuses.supports_tools is False  # it names `tools`, but renders none
    assert hermes.native_format is True
    llama = ChatTemplate(LLAMA31, bos_token="<|begin_of_text|>")
    assert (llama.supports_tools, llama.native_format, llama.object_arguments) == (True, False, True)
    assert ChatTemplate(None).supports_tools is False


# ---- plain chats: exactly as before ---------------------------------------------------------
@pytest.mark.parametrize("source", [HERMES, GEMMA, TEXT_ARGS, REFUSES_TOOLS, LLAMA31])
@pytest.mark.parametrize(
    "messages",
    [
        [("user", "hi")],
        [("user", "hi"), ("assistant", "hello"), ("user", "how are you?")],
        [("system", "Be brief."), ("user", "hi")],
    ],
)
def test_a_plain_chat_renders_byte_identically_to_the_previous_formatter(source, messages):
    if source == GEMMA and messages[0][0] == "system":
        with pytest.raises(InvalidPrompt) as err:  # the template's own refusal, now a 400
            ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(chat(*messages))
        assert err.value.code == "invalid_prompt" and err.value.status == 400
        assert "System role not supported" in str(err.value)
        return
    got = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(chat(*messages))
    assert got.text == old_formatter(source, messages) and got.added_special is True


def test_without_a_template_the_prompt_is_chatml_and_bos_is_added():
    got = ChatTemplate(None).render(chat(("system", "S"), ("user", "hi")))
    assert got.text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert got.added_special is False


def test_tool_choice_none_offers_no_tools():
    plain = ChatTemplate(HERMES).render(chat(("user", "hi")))
    for source in (HERMES, GEMMA, None):
        tpl = ChatTemplate(source, bos_token="<s>")
        got = tpl.render(chat(("user", "hi"), tools=(WEATHER,), tool_choice="none")).text
        assert "get_weather" not in got and "<tools>" not in got
        assert got == tpl.render(chat(("user", "hi"))).text
    assert ChatTemplate(HERMES).render(chat(("user", "hi"), tools=(WEATHER,), tool_choice="none")) == plain


# ---- a template that renders tools itself -------------------------------------------------
def test_tools_reach_a_tool_template_in_openai_shape():
    got = ChatTemplate(HERMES).render(chat(("user", "Weather in Oslo?"), tools=(WEATHER, CLOCK))).text
    for spec in (WEATHER, CLOCK):
        shaped = {
            "type": "function",
            "function": {"name": spec.name, "description": spec.description, "parameters": json.loads(spec.parameters)},
        }
        assert "\n" + json.dumps(shaped, ensure_ascii=False) + "\n" in got
    assert got.startswith("<|im_start|>system\nYou are Qwen")  # the template's own tools prompt
    assert got.endswith("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n")


def test_history_with_calls_and_results_renders_natively():
    got = ChatTemplate(HERMES).render(chat(*history(), tools=(WEATHER, CLOCK))).text
    assert got.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert (
        '<|im_start|>user\nWeather and time in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\n12:00\n'
        '</tool_response><|im_end|>\n<|im_start|>assistant\n'
    ) in got


def test_a_template_that_prints_arguments_gets_the_clients_json_text():
    got = ChatTemplate(TEXT_ARGS).render(chat(*history(), tools=(WEATHER,))).text
    assert '<call>{"name": "get_weather", "arguments": {"city":"Paris"}}</call>' in got  # verbatim
    assert "<|tool|>[c1]18 C, sunny\n<|tool|>[c2]12:00\n" in got


def test_a_template_with_another_native_format_is_told_the_tool_call_format():
    tpl = ChatTemplate(LLAMA31, bos_token="<|begin_of_text|>")
    got = tpl.render(
        chat(
            ChatMessage("system", "Be terse."),
            ChatMessage("user", "Weather in Oslo?"),
            tools=(WEATHER,),
            tool_choice="function",
            tool_name="get_weather",
        )
    ).text
    system = got.split("<|eot_id|>", 1)[0]
    assert system.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Be terse.\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    )
    assert system.endswith('</tool_call>\n\nYou must call the function "get_weather" in your answer.')
    assert '"name": "get_weather"' in got  # its own tools prompt, with the tools, follows
    hermes = ChatTemplate(HERMES).render(chat(("user", "hi"), tools=(WEATHER,))).text
    assert hermes.count("For each function call") == 1  # a Hermes template is not told twice


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"tool_choice": "required"}, ["You must call at least one of these functions"]),
        ({"tool_choice": "function", "tool_name": "get_time"}, ['You must call the function "get_time"']),
        ({"parallel_tool_calls": False}, ["Call at most one function"]),
        ({"tool_choice": "required", "parallel_tool_calls": False}, ["at least one", "at most one"]),
    ],
)
@pytest.mark.parametrize("source", [HERMES, None, GEMMA, LLAMA31])
def test_tool_choice_and_parallel_calls_are_stated_in_the_instruction(source, kw, words):
    got = ChatTemplate(source).render(chat(("user", "Weather in Oslo?"), tools=(WEATHER, CLOCK), **kw)).text
    for w in words:
        assert w in got
    auto = ChatTemplate(source).render(chat(("user", "Weather in Oslo?"), tools=(WEATHER, CLOCK))).text
    assert "You must call" not in auto and "at most one" not in auto


# ---- the generic format, for templates that know nothing of tools --------------------------
def test_generic_format_lists_the_tools_in_the_first_system_message():
    got = ChatTemplate(None).render(chat(*history(), tools=(WEATHER,))).text
    system, rest = got.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert (
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": WEATHER.description,
                    "parameters": json.loads(WEATHER.parameters),
                },
            }
        )
        in system
    )
    assert "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" in system
    assert rest == (
        '<|im_start|>user\nWeather and time in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\n12:00\n'
        '</tool_response><|im_end|>\n<|im_start|>assistant\n'
    )


def test_generic_format_adds_a_system_message_when_there_is_none():
    got = ChatTemplate(REFUSES_TOOLS).render(chat(("user", "hi"), tools=(WEATHER,))).text
    assert got.startswith("[system] # Tools\n") and got.endswith("[user] hi\n[assistant] ")


def test_generic_format_keeps_alternation_and_avoids_a_refused_system_role():
    msgs = history()[1:]  # no system message: Gemma refuses one
    got = ChatTemplate(GEMMA, bos_token="<bos>").render(chat(*msgs, tools=(WEATHER,))).text
    assert got.startswith("<bos><start_of_turn>user\n# Tools\n")  # the instruction leads the first user turn
    assert "Weather and time in Paris?<end_of_turn>\n<start_of_turn>model\n<tool_call>" in got
    assert "<start_of_turn>user\n<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>" in got
    assert got.endswith("</tool_response><end_of_turn>\n<start_of_turn>model\n")


def test_assistant_text_before_its_calls_is_kept():
    msgs = (ChatMessage("user", "q"), ChatMessage("assistant", "Let me check.", (ToolCall("c", "get_time", "{}"),)))
    got = ChatTemplate(None).render(chat(*msgs)).text
    assert (
        '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>' in got
    )


# ---- refusals --------------------------------------------------------------------------------
def test_tool_parameters_that_are_not_a_json_object_are_refused():
    bad = ToolSpec("f", "", "[1, 2]")
    for source in (HERMES, None):
        with pytest.raises(InvalidPrompt) as err:
            ChatTemplate(source).render(chat(("user", "hi"), tools=(bad,)))
        assert err.value.code == "invalid_prompt" and err.value.param == "tools" and "'f'" in str(err.value)


def test_a_history_the_template_refuses_is_an_invalid_prompt():
    with pytest.raises(InvalidPrompt, match="must alternate"):
        ChatTemplate(GEMMA).render(chat(("user", "a"), ("user", "b")))


def test_render_chat_is_the_one_shot_form():
    req = chat(*history(), tools=(WEATHER,))
    assert render_chat(HERMES, "", "", req) == ChatTemplate(HERMES).render(req)


# ---- completion prompts given as token ids ---------------------------------------------------
def test_token_ids_are_used_as_they_are():
    assert completion_token_ids([5, 0, 99], n_vocab=100) == [5, 0, 99]


@pytest.mark.parametrize("ids", [[1, 100], [-1], [True], [1.0], []])
def test_token_ids_outside_the_vocabulary_are_refused(ids):
    with pytest.raises(InvalidPrompt) as err:
        completion_token_ids(ids, n_vocab=100)
    assert err.value.code == "invalid_prompt" and err.value.status == 400 and err.value.param == "prompt"

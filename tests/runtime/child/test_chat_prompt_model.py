"""Chat prompts with the bundled model's real chat template and tokenizer (read from the GGUF).

SmolLM2's template knows nothing of tools, so tools and tool history take the generic format;
plain chats must tokenise exactly as the runner tokenised them before (prefix caches depend on it).
"""

from __future__ import annotations

import pytest

from hydra_node.inference import ChatMessage, GenerationRequest, ToolCall, ToolSpec
from hydra_node.runtime.child.chat_prompt import ChatTemplate
from hydra_node.runtime.runner.records import RunnerSettings

WEATHER = ToolSpec(
    "get_weather",
    "The current weather in a city",
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}',
)
FORCING = "You are a weather assistant. Always answer by calling get_weather; never answer in prose."


@pytest.fixture(scope="module")
def vocab(model_path):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)


def special_text(llm, tok: int) -> str:
    return llm._model.token_get_text(tok)


@pytest.fixture(scope="module")
def template(vocab) -> ChatTemplate:
    """What the runner builds at load (main._chat_formatter), from the GGUF's own metadata."""
    source = vocab.metadata["tokenizer.chat_template"]
    return ChatTemplate(
        source, bos_token=special_text(vocab, vocab.token_bos()), eos_token=special_text(vocab, vocab.token_eos())
    )


def tokens(vocab, template: ChatTemplate, req: dict) -> list[int]:
    res = template.render(req)
    return vocab.tokenize(res.text.encode(), add_bos=not res.added_special, special=True)


def chat(*messages, **kw) -> dict:
    return GenerationRequest(model="m", kind="chat", messages=messages, **kw).to_wire()


def test_the_bundled_template_has_no_tools_and_renders_system_messages(template):
    assert "tools" not in template.source
    assert template.supports_tools is False and template.supports_system is True


@pytest.mark.parametrize(
    "messages",
    [
        [("user", "hello")],
        [("system", "Be brief."), ("user", "hello"), ("assistant", "Hi."), ("user", "What is 2+2?")],
        [("user", "Ünïcode ✓ <|im_start|> inside")],
    ],
)
def test_plain_chats_tokenise_exactly_as_before(vocab, template, messages):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    old = Jinja2ChatFormatter(
        template=vocab.metadata["tokenizer.chat_template"],
        eos_token=special_text(vocab, vocab.token_eos()),
        bos_token=special_text(vocab, vocab.token_bos()),
        stop_token_ids=[vocab.token_eos()],
    )
    res = old(messages=[{"role": r, "content": c} for r, c in messages])
    before = vocab.tokenize(res.prompt.encode(), add_bos=not res.added_special, special=True)
    assert tokens(vocab, template, chat(*messages)) == before


def test_a_forced_tool_prompt_tokenises_within_the_context(vocab, template):
    req = chat(
        ("system", FORCING),
        ("user", "What is the weather in Paris?"),
        tools=(WEATHER,),
        tool_choice="function",
        tool_name="get_weather",
    )
    text = template.render(req).text
    assert text.startswith(f"<|im_start|>system\n{FORCING}\n\n# Tools\n")
    assert 'You must call the function "get_weather"' in text
    toks = tokens(vocab, template, req)
    im_start = vocab.token_bos()  # SmolLM2's BOS is <|im_start|>
    assert toks.count(im_start) == 3  # system, user, the assistant's turn: special tokens, not text
    assert toks[0] == im_start and 100 < len(toks) < RunnerSettings().n_ctx


def test_a_multi_turn_tool_history_renders(vocab, template):
    req = chat(
        ChatMessage("system", FORCING),
        ChatMessage("user", "Weather in Paris and Rome?"),
        ChatMessage(
            "assistant",
            "",
            (ToolCall("c1", "get_weather", '{"city": "Paris"}'), ToolCall("c2", "get_weather", '{"city": "Rome"}')),
        ),
        ChatMessage("tool", "18 C", tool_call_id="c1", name="get_weather"),
        ChatMessage("tool", "24 C", tool_call_id="c2", name="get_weather"),
        ChatMessage("user", "And Oslo?"),
        tools=(WEATHER,),
    )
    text = template.render(req).text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        '<|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n24 C\n'
        '</tool_response><|im_end|>\n<|im_start|>user\nAnd Oslo?<|im_end|>\n<|im_start|>assistant\n'
    ) in text
    toks = tokens(vocab, template, req)
    assert toks.count(vocab.token_bos()) == 6 and toks.count(vocab.token_eos()) == 5
    assert len(toks) < RunnerSettings().n_ctx

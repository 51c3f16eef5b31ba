"""The reasoning splitter and format detection (hydra_node/inference/reasoning.py) on recorded outputs.

The strings are what Qwen3, a DeepSeek-R1 distill and gpt-oss write (their shapes as llama-server's
own parser tests record them: the tags, the blank lines, a tool call after the thinking), cut into
pieces the way tokenizers cut them (tags split across tokens)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.inference.reasoning import (
    THINK_CLOSE,
    Phase,
    ReasoningSplitter,
    close_text,
    detect,
)

QWEN3_PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
QWEN3_OUT = [
    "<",
    "think",
    ">\n",
    "Okay",
    ", the user",
    " asks 2+2.",
    " That is 4",
    ".\n",
    "</",
    "think",
    ">\n\n",
    "2",
    " + 2",
    " = **4**.",
]
QWEN3_TOOL = [
    "<think>",
    "\nThe user wants the weather in Paris; I should call get_weather.\n",
    "</th",
    "ink>\n\n",
    "<tool_call>",
    '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
    "</tool_call>",
]
R1_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Is 17 prime?<｜Assistant｜><think>\n"
R1_OUT = ["Alright", ", 17 is only", " divisible by 1 and 17.\n", "</think", ">", "\n\n", "Yes, 17 is prime."]
R1_UNCLOSED = ["Hmm", ", let me", " count the divisors", " of 1001: 7, 11, 13", "... and so", "\n"]
GPT_OSS_PROMPT = "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"
GPT_OSS_OUT = [
    "<|channel|>",
    "analysis",
    "<|message|>",
    "User asks",
    " 2+2. Simple arithmetic.",
    "<|end|>",
    "<|start|>",
    "assistant",
    "<|channel|>",
    "final",
    "<|message|>",
    "2 + 2 = 4.",
]
GPT_OSS_TOOL = [
    "<|channel|>analysis<|message|>Need the weather tool.<|end|>",
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
    '{"city":"Paris"}',
]


def split(fmt: str, opening: str, pieces: list[str], *, continuing: bool = False) -> tuple[str, str, Phase]:
    s = ReasoningSplitter.start(fmt, opening, continuing=continuing)
    reasoning, answer = "", ""
    for p in pieces:
        r, a = s.feed(p)
        reasoning, answer = reasoning + r, answer + a
    r, a = s.flush()
    return reasoning + r, answer + a, s.phase


def test_qwen3_tags_split_across_tokens():
    assert split("think", QWEN3_PROMPT, QWEN3_OUT) == (
        "Okay, the user asks 2+2. That is 4.",
        "2 + 2 = **4**.",
        Phase.ANSWER,
    )


def test_qwen3_tool_call_after_thinking_is_answer_text():
    reasoning, answer, _ = split("think", QWEN3_PROMPT, QWEN3_TOOL)
    assert reasoning == "The user wants the weather in Paris; I should call get_weather."
    assert answer == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_deepseek_r1_block_opened_by_the_generation_prompt():
    assert split("think", R1_PROMPT, R1_OUT) == (
        "Alright, 17 is only divisible by 1 and 17.",
        "Yes, 17 is prime.",
        Phase.ANSWER,
    )


def test_no_closing_tag_everything_is_reasoning():
    reasoning, answer, phase = split("think", R1_PROMPT, R1_UNCLOSED)
    assert (reasoning, answer, phase) == (
        "Hmm, let me count the divisors of 1001: 7, 11, 13... and so",
        "",
        Phase.THINKING,
    )


def test_text_before_think_means_no_reasoning():
    """llama-server's rule: the block counts only at the start; a later <think> is answer text."""
    reasoning, answer, _ = split("think", QWEN3_PROMPT, ["Sure", ". <think>", "x</think> done"])
    assert (reasoning, answer) == ("", "Sure. <think>x</think> done")


def test_thinking_switched_off_starts_in_the_answer():
    prompt = QWEN3_PROMPT + "<think>\n\n</think>\n\n"
    assert split("think", prompt, ["4", "."]) == ("", "4.", Phase.ANSWER)


def test_partial_tag_at_the_end_is_released_by_flush():
    assert split("think", QWEN3_PROMPT, ["<thi"]) == ("", "<thi", Phase.ANSWER)
    assert split("think", R1_PROMPT, ["a ", "</thi"]) == ("a </thi", "", Phase.THINKING)


def test_held_back_text_is_not_emitted_early():
    s = ReasoningSplitter.start("think", R1_PROMPT)
    assert s.feed("Thinking ") == ("Thinking", "")
    assert s.feed("</") == ("", "")  # may be the closing tag
    assert s.feed("p> more") == (" </p> more", "")


def test_continuing_an_answer_and_continuing_thoughts():
    # a final assistant message rendered by a Qwen3-style template: a closed block, then the prefill
    assert split("think", QWEN3_PROMPT + "<think>\n\n</think>\n\nThe answer is", [" 4", "."], continuing=True) == (
        "",
        " 4.",
        Phase.ANSWER,
    )
    # its reasoning only (no content yet): the thoughts go on
    assert split("think", QWEN3_PROMPT + "<think>\nFirst,", [" add", "\n</think>\n\n4"], continuing=True) == (
        " add",
        "4",
        Phase.ANSWER,
    )
    # a template without tags: the prefilled answer goes on
    assert split("think", "<｜Assistant｜>Sure,", [" here"], continuing=True) == ("", " here", Phase.ANSWER)


def test_gpt_oss_analysis_is_reasoning_final_is_answer():
    assert split("gpt-oss", GPT_OSS_PROMPT, GPT_OSS_OUT) == (
        "User asks 2+2. Simple arithmetic.",
        "2 + 2 = 4.",
        Phase.ANSWER,
    )


def test_gpt_oss_commentary_is_answer_text():
    reasoning, answer, _ = split("gpt-oss", GPT_OSS_PROMPT, GPT_OSS_TOOL)
    assert (reasoning, answer) == ("Need the weather tool.", '{"city":"Paris"}')


def test_gpt_oss_without_channels_is_all_answer():
    assert split("gpt-oss", GPT_OSS_PROMPT, ["<", "Just", " text"])[:2] == ("", "<Just text")
    assert split("gpt-oss", GPT_OSS_PROMPT, ["Just", " text"])[:2] == ("", "Just text")


def test_close_text_ends_the_block():
    # in the block (the budget spent), or before it opened (a zero budget: an empty block)
    assert split("think", R1_PROMPT, ["Some thoughts", close_text("think", Phase.THINKING), "Answer"]) == (
        "Some thoughts",
        "Answer",
        Phase.ANSWER,
    )
    assert split("think", QWEN3_PROMPT, [close_text("think", Phase.BEFORE), "Answer"]) == ("", "Answer", Phase.ANSWER)
    assert THINK_CLOSE in close_text("think", Phase.THINKING)
    r, a, phase = split(
        "gpt-oss", GPT_OSS_PROMPT, ["<|channel|>analysis<|message|>hm", close_text("gpt-oss", Phase.THINKING), "4"]
    )
    assert (r, a, phase) == ("hm", "4", Phase.ANSWER)
    assert split("gpt-oss", GPT_OSS_PROMPT, [close_text("gpt-oss", Phase.BEFORE), "4"])[:2] == ("", "4")


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_split_gives_the_same_result(data):
    fmt, opening, pieces = data.draw(
        st.sampled_from(
            [
                ("think", QWEN3_PROMPT, QWEN3_OUT),
                ("think", QWEN3_PROMPT, QWEN3_TOOL),
                ("think", R1_PROMPT, R1_OUT),
                ("think", R1_PROMPT, R1_UNCLOSED),
                ("think", QWEN3_PROMPT, ["  ", "<think>", "</think>", "x"]),
                ("gpt-oss", GPT_OSS_PROMPT, GPT_OSS_OUT),
                ("gpt-oss", GPT_OSS_PROMPT, GPT_OSS_TOOL),
            ]
        )
    )
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert split(fmt, opening, parts) == split(fmt, opening, [text])


def test_any_split_of_random_text_matches_the_whole():
    words = st.sampled_from(["<think>", "</think>", "<", "/", "think", ">", " ", "\n", "a", "b"])

    @settings(max_examples=200, deadline=None)
    @given(st.lists(words, max_size=16).map("".join), st.data())
    def check(text, data):
        cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
        parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        for opening in (QWEN3_PROMPT, R1_PROMPT):
            assert split("think", opening, parts) == split("think", opening, [text])

    check()


QWEN3_TEMPLATE_TAIL = (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


@pytest.mark.parametrize(
    ("template", "rendered", "expected"),
    [
        # Qwen3: the model opens the block; enable_thinking=false writes an empty one
        (
            "{{ '</think>' }}" + QWEN3_TEMPLATE_TAIL,
            {None: "A\n", True: "A\n", False: "A\n<think>\n\n</think>\n\n"},
            ("think", True, True),
        ),
        # DeepSeek-R1 distill: the generation prompt opens the block, no switch
        (
            "{{ '<｜Assistant｜><think>\\n' }}",
            {None: "<think>\n", True: "<think>\n", False: "<think>\n"},
            ("think", True, False),
        ),
        # a switch whose default is off (the empty block is written unless enable_thinking is true)
        (
            "{{ '<think>' }} enable_thinking",
            {None: "A<think>\n\n</think>\n\n", True: "A", False: "A<think>\n\n</think>\n\n"},
            ("think", False, True),
        ),
        # mentions enable_thinking but renders the same either way: no working switch
        (
            "{{ '<think>' }} enable_thinking",
            {None: "A<think>", True: "A<think>", False: "A<think>"},
            ("think", True, False),
        ),
        ("<|start|>assistant<|channel|>final<|message|>", {None: "x"}, ("gpt-oss", True, False)),
        ("{{ '<|im_start|>assistant\\n' }}", {None: "x"}, ("", False, False)),
    ],
)
def test_detect(template, rendered, expected):
    caps = detect(template, render=lambda t: rendered.get(t, rendered[None]), fim=True)
    assert (caps.reasoning, caps.thinks, caps.switch, caps.fim) == (*expected, True)


def test_detect_without_a_template_or_with_an_override():
    assert not detect(None).reasons
    assert detect("{{ '<think>' }}", override="").reasoning == ""
    assert detect("plain", override="think").reasoning == "think"
    with pytest.raises(ValueError, match="unknown reasoning format"):
        detect("x", override="deepseek")
